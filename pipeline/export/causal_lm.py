"""`pipe import DIR` of a causal language model: one ONNX graph with its KV cache, gated on generated text.

A transformers directory whose `config.json` names a causal LM (`architectures`: `LlamaForCausalLM`,
`Qwen2ForCausalLM`, `MistralForCausalLM`, `Phi3ForCausalLM`, `GemmaForCausalLM`, `GPT2LMHeadModel`, any
`*ForCausalLM` or `*LMHeadModel`) imports with no flags as task `text-generation`:

1. The model loads in torch (`AutoModelForCausalLM`, eager attention), wrapped with its cache as
   explicit tensors (pipeline/export/lm_module.py), and is exported by the dynamo exporter to one
   graph: `input_ids`, `attention_mask`, `position_ids`, `past_key_values.N.key|value` in; `logits`,
   `present.N.key|value` out; batch, sequence, past and total lengths dynamic.
2. The gate (`decoder_gate`): structure; the first step over eight real prompts (left-padded, a
   zero-length past) against the torch module; greedy generation from the graph
   (pipeline/runtime/generate.py) against transformers' `generate(do_sample=False)` at batch 1, 2 and 4
   (left-padded), tokens equal and logits within tolerance; and the batch of 4 equal to its rows run alone.
3. The artifact keeps the tokenizer (padding on the left, as a prompt batch must be), the chat template
   and generation_config.json as files, and the `generation` record (cache layout, EOS ids, padding id,
   context length, the template's sha256): all of it in the identity digest.

torch and transformers are imported inside the functions only.
"""

from __future__ import annotations

import importlib.metadata
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import onnx

from pipeline.artifact.directory import Artifact
from pipeline.artifact.generation import (
    CacheLayout,
    Generation,
    GenerationSource,
    generation_record,
    read_generation,
)
from pipeline.artifact.golden import Golden, save_golden
from pipeline.artifact.manifest import Lineage, Manifest, check_name
from pipeline.artifact.records import ImportRecord, Reading
from pipeline.artifact.tokens import TokenLimits, hf_limits, limits_reading, read_tokenizer, write_tokenizer
from pipeline.artifact.variants import MODEL_FILE
from pipeline.core.arrays import Arrays
from pipeline.core.errors import InputError, first_line
from pipeline.export.length_gate import long_rows
from pipeline.export.metadata import stamp
from pipeline.export.new_version import new_version
from pipeline.export.opset import default_opset
from pipeline.runtime.generate import decoder_specs, first_step, greedy, stitch
from pipeline.runtime.runners import ort_runner, torch_runner
from pipeline.runtime.text import TextEncoder
from pipeline.stagekit.model_record import record_model
from pipeline.verify.gate import compare, structural_checks
from pipeline.verify.generation import greedy_rows
from pipeline.verify.policies import Exact
from pipeline.verify.report import GateReport

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch

    from pipeline.export.onnx_export import ExportResult
    from pipeline.runtime.decoder import CachedDecoder

T = TypeVar("T")

TASK = "text-generation"
CAUSAL_SUFFIXES = ("ForCausalLM", "LMHeadModel")  # transformers' class names for a decoder with its LM head
OPSET = 18
GATE_BATCHES = (1, 2, 4)  # greedy generation is compared at these batch sizes (left-padded past 1)
GATE_STEPS = 16  # tokens generated per case
PROMPTS = (
    "The quick brown fox jumps over the lazy dog.",
    "Hello",
    "Once upon a time, in a small village by the sea, there lived an old fisherman",
    "def add(a, b):",
    "The capital of France is",
    "1, 2, 3, 4,",
    "It rained all day in the city, and the streets were quiet by nightfall.",
    "Q: What is a model? A:",
)


def causal_architecture(config: dict[str, Any]) -> str | None:
    """The causal LM class `config.json` names in `architectures` (e.g. `LlamaForCausalLM`), or None."""
    names = config.get("architectures") or []
    names = names if isinstance(names, list) else []
    return next((n for n in names if isinstance(n, str) and n.endswith(CAUSAL_SUFFIXES)), None)


def architecture_of(source: Path) -> str | None:
    """The causal LM class a directory's config.json names, or None (also for a config that does not read:
    the import that follows says what is wrong with it)."""
    import json

    try:
        config = json.loads((Path(source) / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return causal_architecture(config) if isinstance(config, dict) else None


@dataclass(frozen=True)
class DecoderGate:
    """How the decoder graph is judged (recorded as stages.import.settings)."""

    steps: int = GATE_STEPS  # greedy tokens per case
    batches: tuple[int, ...] = GATE_BATCHES
    atol: float = Exact.atol  # logits and the first step's outputs: |onnx - torch| <= atol + rtol*|torch|
    rtol: float = Exact.rtol


def import_causal_lm(
    source: Path,
    name: str,
    repository: Path = Path("artifacts"),
    tokenizer_dir: Path | None = None,
    gate: DecoderGate | None = None,
    progress: Any = print,
) -> Artifact:
    """Create `repository/<name>/<next version>/` from the causal LM directory `source` and return it."""
    from pipeline.export.hf import read_config, source_digest

    gate = gate or DecoderGate()
    source = Path(source)
    if problem := check_name(name):
        raise InputError(f"--name: {problem}")
    config = read_config(source)
    architecture = causal_architecture(config)
    if architecture is None:
        raise InputError(
            f"{source}/config.json names no causal LM in architectures ({config.get('architectures')}); "
            "text-generation imports a *ForCausalLM or *LMHeadModel"
        )
    tokenizer = read_tokenizer(tokenizer_dir or source)
    generation = read_generation(source, tokenizer_dir)
    started = time.perf_counter()
    model = load_causal_lm(source)
    loaded_s = time.perf_counter() - started
    with new_version(repository, name) as root:
        manifest = Manifest(
            name=root.parent.name,
            version=int(root.name),
            task=TASK,
            inputs=[],
            outputs=[],
            lineage=Lineage(backend="import"),
        )
        artifact = Artifact(root, manifest)
        limits = hf_limits(source, ["input_ids", "attention_mask"], tokenizer)
        record, written = write_tokenizer(root, tokenizer)
        manifest.tokenizer = replace(record, padding_side="left")  # a prompt batch is padded on the left
        for rel in written:
            artifact.add_file(rel)
        progress(f"[import] {source}: {architecture}, exporting with its KV cache")
        export_s = time.perf_counter()
        result, report, golden = export_gated(model, artifact, limits, generation, gate)
        export_s = time.perf_counter() - export_s
        report.raise_on_failure(f"the ONNX export of {source}")
        save_golden(artifact, golden)
        digest = source_digest(source)
        assert manifest.generation is not None  # set by export_gated
        took = f"loaded in {loaded_s:.1f} s, exported and gated in {export_s:.1f} s ({result.exporter})"
        read = {
            "task": Reading(value=TASK, source=f"config.json architectures ({architecture})"),
            "tokens": Reading(value=limits_reading(limits), source="config.json and the tokenizer"),
            "generation": Reading(value=_generation_reading(manifest.generation), source=_generation_source(source)),
        }
        graph = onnx.load(str(root / MODEL_FILE), load_external_data=False)
        manifest.stages.import_ = _import_record(source, digest, graph, config, gate, result, report, read, took)
        record_model(artifact, stage="import", parent=digest, parity=report.summary())
        artifact.save()
        return artifact


def _import_record(
    source: Path,
    digest: str,
    graph: onnx.ModelProto,
    config: dict[str, Any],
    gate: DecoderGate,
    result: ExportResult,
    report: GateReport,
    read: dict[str, Reading],
    took: str,
) -> ImportRecord:
    """stages.import of a causal LM: the exporter and the gate's settings, what was read, the report, and the
    fallback's reason when the graph written with fused kernels failed and a traced one was kept."""
    return ImportRecord(
        settings={
            "task": TASK,
            "exporter": result.exporter,
            "gate_steps": gate.steps,
            "gate_batches": list(gate.batches),
            "atol": gate.atol,
            "rtol": gate.rtol,
        },
        inputs={"source": digest},
        source=str(source),
        source_sha256=digest,
        producer=f"transformers {importlib.metadata.version('transformers')} ({config.get('model_type')})",
        ir_version=graph.ir_version,
        opset=default_opset(graph),
        golden="generated",
        parity=report.to_dict(),
        convention="Hugging Face",
        read=read,
        notes=[took, *([result.fallback_reason] if result.fallback_reason else [])],
    )


def load_causal_lm(source: Path) -> torch.nn.Module:
    """The causal LM in `source` in torch, eval mode, eager attention (plain MatMul + Softmax in the graph)."""
    try:
        import transformers
    except ImportError:
        raise InputError(
            f"{source} is a transformers model; importing it needs transformers: pip install 'pipe-ml[hf]'"
        ) from None
    transformers.utils.logging.disable_progress_bar()
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(str(source), attn_implementation="eager")
    except (ValueError, OSError, KeyError) as exc:
        raise InputError(f"transformers cannot load {source} as AutoModelForCausalLM: {first_line(exc)}") from None
    return model.float().eval()


def export_gated(
    model: torch.nn.Module, artifact: Artifact, limits: TokenLimits, source: GenerationSource, gate: DecoderGate
) -> tuple[ExportResult, GateReport, Golden]:
    """Export `model` to `artifact.root/model.onnx` with its cache, record the specs and the generation
    record in the manifest, stamp the identity, and judge the graph; the caller raises on the report."""
    from pipeline.runtime.decoder import CachedDecoder, cache_layout

    manifest, root = artifact.manifest, artifact.root
    vocab = int(model.get_output_embeddings().weight.shape[0])
    named = {
        "eos_token_id": source.eos_token_ids,
        "pad_token_id": [limits.padding_id],
        "bos_token_id": [source.bos_token_id],
    }
    for key, ids in named.items():
        if outside := [i for i in ids if i is not None and i >= vocab]:
            raise InputError(
                f"{key} {outside[:3]} is past the model's vocabulary (ids 0..{vocab - 1}); fix it in "
                "generation_config.json or config.json"
            )
    decoder = CachedDecoder(model).eval()
    layout = cache_layout(decoder)
    padding = limits.padding_id if limits.padding_id is not None else source.eos_token_ids[0]
    limits = replace(limits, padding_id=padding)
    manifest.inputs, manifest.outputs = decoder_specs(limits, layout, vocab)
    manifest.generation = _generation_record(artifact, layout, source, padding)
    path = root / MODEL_FILE
    encoder = TextEncoder.of(root, manifest)
    assert encoder is not None  # the tokenizer and the ids input were just recorded

    def judged() -> tuple[GateReport, Golden]:
        stamp(path, manifest)
        return decoder_gate(path, model, decoder, encoder, manifest, gate)

    return _export_judged(decoder, layout, path, OPSET, judged)


def export_trained(
    model: torch.nn.Module, artifact: Artifact, candidate: Path, opset: int, gate: DecoderGate
) -> tuple[ExportResult, GateReport]:
    """`pipe export` of a causal LM trained here: `model` (the trained wrapper, adapters merged) to `candidate`
    with the cache the manifest records, judged as an import is, plus the golden first step kept at training."""
    from pipeline.artifact.golden import load_golden
    from pipeline.runtime.decoder import CachedDecoder, cache_layout

    manifest = artifact.manifest
    recorded = manifest.generation
    net = getattr(model, "net", model)  # the transformers model inside pipe's training wrapper
    decoder = CachedDecoder(net).eval()
    if recorded is None or cache_layout(decoder) != recorded.cache:
        raise InputError(
            f"{artifact.root}: the trained model's KV cache is not the one its manifest records; re-train the model"
        )
    encoder = TextEncoder.of(artifact.root, manifest)
    if encoder is None:
        raise InputError(f"{artifact.root}: a text-generation model carries its tokenizer, and this one has none")
    golden = load_golden(artifact)
    policy = Exact(gate.atol, gate.rtol)

    def judged() -> tuple[GateReport, None]:
        report, _ = decoder_gate(candidate, net, decoder, encoder, manifest, gate)
        report.rows += compare("golden (recorded)", ort_runner(candidate)(golden.inputs), golden.outputs,
                               manifest.outputs, policy, "onnx")  # fmt: skip
        return report, None

    result, report, _ = _export_judged(decoder, recorded.cache, candidate, opset, judged)
    return result, report


def _export_judged(
    decoder: CachedDecoder, layout: CacheLayout, path: Path, opset: int, judged: Callable[[], tuple[GateReport, T]]
) -> tuple[ExportResult, GateReport, T]:
    """The decoder exported to `path` and judged by `judged`. A graph written from the weights (fused_decoder.py)
    that fails its gate is traced instead and judged again, the failed row kept as the fallback reason: a family
    the writer gets wrong still imports, and the record says so."""
    from pipeline.export.lm_module import export_decoder

    result = export_decoder(decoder, layout, path, opset)
    report, extra = judged()
    if report.passed or result.exporter != "fused":
        return result, report, extra
    row = report.failures[0]
    traced = export_decoder(decoder, layout, path, opset, fused=False)
    reason = f"the graph written with fused kernels failed the gate's {row.check!r} row ({row.detail}); traced instead"
    return replace(traced, fallback_reason=reason), *judged()


def decoder_gate(
    path: Path,
    model: torch.nn.Module,
    decoder: torch.nn.Module,
    encoder: TextEncoder,
    manifest: Manifest,
    gate: DecoderGate,
) -> tuple[GateReport, Golden]:
    """Every check of the decoder graph at `path` (see the module doc), and the golden first step."""
    from pipeline.export.lm_module import reference_greedy

    generation = manifest.generation
    assert generation is not None
    cache, eos, pad = generation.cache, generation.eos_token_ids, generation.padding_id
    policy = Exact(gate.atol, gate.rtol)
    report = GateReport(rows=structural_checks(path, scratch=path.parent))
    run = ort_runner(path)
    first = prefill(encoder, cache, list(PROMPTS))
    reference = torch_runner(decoder, manifest.inputs, manifest.outputs)(first)
    report.rows += compare(f"first step, batch {len(PROMPTS)}", run(first), reference, manifest.outputs, policy, "onnx")
    for batch in gate.batches:
        prompts = encoder.encode(list(PROMPTS[:batch]))
        ids, mask = prompts["input_ids"], prompts["attention_mask"]
        got = greedy(run, cache, ids, mask, gate.steps, eos, pad)
        want = reference_greedy(model, ids, mask, gate.steps, eos, pad)
        padded = ", left-padded" if batch > 1 else ""
        report.rows += greedy_rows(f"greedy batch {batch}{padded}", want, got, gate.atol, gate.rtol)
        if batch == max(gate.batches) and batch > 1:
            alone = [
                greedy(run, cache, ids[i : i + 1, mask[i] == 1], mask[i : i + 1, mask[i] == 1], gate.steps, eos, pad)
                for i in range(batch)
            ]
            report.rows += greedy_rows(f"batch {batch} = rows alone", stitch(alone, pad), got, gate.atol, gate.rtol)
    every = encoder.encode(list(PROMPTS))
    held = every["input_ids"][every["attention_mask"] == 1]  # the prompts' tokens, repeated to the long text
    report.rows += long_rows(run, model, generation, held, gate.steps, gate.atol, gate.rtol)
    return report, Golden(first, reference)


def prefill(encoder: TextEncoder, cache: CacheLayout, texts: list[str]) -> Arrays:
    """The first step's inputs for `texts`: left-padded ids and mask, positions, a zero-length past."""
    batch = encoder.encode(texts)
    return first_step(batch["input_ids"], batch["attention_mask"], cache)


def _generation_record(artifact: Artifact, layout: CacheLayout, source: GenerationSource, padding: int) -> Generation:
    """The manifest's `generation`, its chat template and generation_config.json written into the version."""
    record, files = generation_record(layout, source, padding)
    for rel, data in files.items():
        artifact.write_file(rel, data)
    return record


def _generation_reading(record: Generation) -> dict[str, Any]:
    c = record.cache
    return {
        "cache": f"{c.layers} layers x {c.kv_heads} kv heads x {c.head_size} ({c.dtype})"
        + (f", {c.windows_said()}" if c.windows else ""),
        "eos_token_ids": record.eos_token_ids,
        "padding_id": record.padding_id,
        "context_length": record.context_length,
        "chat_template": record.chat_template is not None,
    }


def _generation_source(source: Path) -> str:
    found = [n for n in ("generation_config.json", "chat_template.jinja") if (source / n).is_file()]
    return ", ".join(["config.json", *found])
