"""The one onnxruntime session factory: provider choice, thread settings, load errors as ArtifactError.

onnxruntime-gpu lists CUDA among the available providers even where CUDA cannot load, and then
silently runs on CPU (docs/install.md, Serving on a GPU). So the provider list asked for is only a wish: callers
read back `session.get_providers()`, and a session that did not get its first choice is logged.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnxruntime as ort

from pipeline.core.errors import ArtifactError, InputError, first_line

log = logging.getLogger("pipe.verify")

PROVIDERS = ("auto", "cpu", "cuda")  # auto: CUDA when onnxruntime offers it, else CPU
CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"


def providers_for(choice: str) -> list[str]:
    """The onnxruntime providers to ask for, in order, for `choice` (one of PROVIDERS).

    CPU always closes the list, so an operator CUDA lacks still runs. "cuda" on an onnxruntime
    without CUDA is refused here rather than quietly run on CPU.
    """
    if choice not in PROVIDERS:
        raise InputError(f"provider {choice!r} is not one of {', '.join(PROVIDERS)}")
    available = ort.get_available_providers()
    if choice == "cpu":
        return [CPU]
    if choice == "cuda" and CUDA not in available:
        raise ArtifactError(
            f"provider cuda was asked for but onnxruntime offers only {available}; install "
            "onnxruntime-gpu (make GPU=1) or use provider auto"
        )
    return [CUDA, CPU] if CUDA in available else [CPU]


def create_session(
    path: str | Path,
    provider: str = "cpu",
    intra_op_threads: int = 0,
    inter_op_threads: int = 0,
    spin: bool = True,
    profile: Path | None = None,
    arena: bool = True,
    constants: dict[str, np.ndarray] | None = None,
) -> ort.InferenceSession:
    """An onnxruntime session for the model at `path`; raises ArtifactError when it cannot load.

    `intra_op_threads` / `inter_op_threads`: 0 lets onnxruntime decide. `spin=False` stops idle
    onnxruntime threads from busy-waiting (they burn CPU the caller could use when cores are few).
    `profile`: a directory for onnxruntime's profiler (every kernel's time, `end_profiling()` names
    the file) and the graph as the session optimized it (`optimized.onnx`, to read node attributes
    the profile does not give). `arena=False` turns onnxruntime's CPU memory arena off: a run's
    intermediate tensors go back to the system when it returns instead of staying reserved at the
    largest run's size for the session's life (a gate's session runs a few large chunks, then is
    dropped; a server's runs many alike, where the arena saves allocations). `constants`: inputs with a
    default fixed to these values for this session (`with_constants`). The providers really in use are
    `session.get_providers()`; see the module doc.
    """
    for name, value in (("intra_op_threads", intra_op_threads), ("inter_op_threads", inter_op_threads)):
        if value < 0:
            raise InputError(f"{name} is {value}; give 0 (onnxruntime decides) or a positive thread count")
    wanted = providers_for(provider)
    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_op_threads
    options.inter_op_num_threads = inter_op_threads
    if not spin:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    options.enable_cpu_mem_arena = arena
    options.log_severity_level = 3  # errors only: keep provider fallback chatter out of the logs
    if profile is not None:
        options.enable_profiling = True
        options.profile_file_prefix = str(profile / "profile")
        options.optimized_model_filepath = str(profile / "optimized.onnx")  # this CPU's layout: read, never shipped
    model = with_constants(Path(path), constants, options) if constants else str(path)
    try:
        session = ort.InferenceSession(model, sess_options=options, providers=wanted)
    except Exception as exc:  # onnxruntime's own exception types share no base (NoSuchFile, InvalidGraph, EPFail...)
        raise ArtifactError(f"{path}: onnxruntime cannot load the model: {first_line(exc)}") from exc
    if wanted[0] not in session.get_providers():
        log.warning("%s: asked for %s but onnxruntime runs it on %s", path, wanted[0], session.get_providers())
    return session


CONSTANTS = "pipe.constants"  # metadata of a session's graph: its inputs made constants (`with_constants`)


def with_constants(path: Path, values: dict[str, np.ndarray], options: ort.SessionOptions) -> str | bytes:
    """The model at `path` with those of `values`' names that are inputs with a default (an initializer that is
    also a graph input) made constants of these values, as bytes for onnxruntime, and their names in the
    metadata under CONSTANTS (`constants_of`); the path itself when it has none of them.

    onnxruntime treats an input with a default as a value that changes from call to call; a constant it
    folds: an If on one is replaced by the branch taken (pipe serve's written decoders: `decode_in_place`,
    pipeline/export/fused_decoder.py). The graph is read and written again in memory (external data stays
    where it is, read from the model's folder), so a model whose weights are inside its file briefly takes
    twice its size more while the session is made."""
    import onnx
    from onnx import numpy_helper

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # onnx raises DecodeError, OSError, ValueError for a file it cannot read
        raise ArtifactError(f"{path}: onnx cannot read the model: {first_line(exc)}") from exc
    graph = model.graph
    defaults = {i.name for i in graph.initializer} & {i.name for i in graph.input}
    fixed = [name for name in values if name in defaults]
    if not fixed:
        return str(path)
    kept = [i for i in graph.input if i.name not in fixed]
    del graph.input[:]
    graph.input.extend(kept)
    for tensor in graph.initializer:
        if tensor.name in fixed:
            tensor.CopyFrom(numpy_helper.from_array(np.asarray(values[tensor.name]), tensor.name))
    model.metadata_props.add(key=CONSTANTS, value=",".join(fixed))
    options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(path.parent))
    return model.SerializeToString()


def constants_of(session: ort.InferenceSession) -> set[str]:
    """The inputs `with_constants` made constants in this session's graph."""
    made = session.get_modelmeta().custom_metadata_map.get(CONSTANTS, "")
    return set(made.split(",")) - {""}
