"""Install profiles (pyproject's extras, docs/install.md) declare what each part imports, and the
serve profile alone runs `pipe serve` without torch or tensorflow.

The fast tests read pyproject.toml, requirements.lock and the import graph; the slow one installs
`.[serve]` into a fresh virtual environment (from the package index, pinned by the lock), serves an
artifact from it and asks it for a KServe V2 inference. `make check-serve-profile` runs the slow
one on the digits-cnn artifact that `make run` trains from the bundled data.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from pathlib import Path

import grimp
import numpy as np
import onnx
import onnx.parser
import pytest
from click.testing import CliRunner
from packaging.requirements import Requirement

from pipeline.artifact.directory import Artifact, resolve_artifact
from pipeline.artifact.golden import load_golden
from pipeline.cli import main
from tests.conftest import LINEAR

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]["name"]
LOCK_FILE = ROOT / "requirements.lock"

# Which profile each part of the package is installed with. A part not named here (verify, and the
# stages still to come) must have its imports declared somewhere in `all`.
PART_PROFILES = {
    "pipeline.serve": ("serve",),
    "pipeline.train": ("train", "cpu"),
    "pipeline.data": ("train", "cpu"),
    "pipeline.export": ("train", "cpu"),
    "pipeline.optimize": ("optimize", "cpu"),
    "pipeline.runtime.latency": ("cpu",),  # onnxruntime sessions timed side by side, for optimize and check
    "pipeline.runtime.images": ("http",),  # pictures decoded by Pillow, for pipe serve (http) and pipe predict
    "pipeline.runtime.text": ("http",),  # texts tokenized by tokenizers, for pipe serve (http) and pipe predict
    "pipeline.edge": ("edge", "cpu"),
    "pipeline.benchmark": ("report", "cpu"),  # the table and plot, onnxruntime sessions timed side by side
    "pipeline.report": ("report",),  # the curves drawn by matplotlib; the card is the manifest and reports/ read back
}
# A part's imports that are only used when present, each inside a function that leaves its work out with the
# install command when the package is missing: pipe benchmark times a torch row only where torch is (a
# decoder's: transformers too), and pipe import of a transformers directory needs the `hf` profile (without it,
# the import says so).
PART_OPTIONAL_IMPORTS = {"pipeline.benchmark": {"torch", "transformers"}, "pipeline.export": {"transformers"}}
# `pipe train` of `model.arch: hf` on `data.source: text` needs the `hf` profile too (without it, it says so).
# A causal LM's data (pipeline/data/lm_tokens.py: chat templates rendered by a transformers fast tokenizer) is
# read only for `model.arch: hf`, whose training checks for the `hf` profile first and names it.
PART_OPTIONAL_IMPORTS |= {"pipeline.train": {"transformers", "peft"}, "pipeline.data": {"tokenizers", "transformers"}}
# Imported only when present (inside a try: ... except ImportError), never a dependency. tflite_runtime is
# the device runtime the stand-alone edge runner falls back to; it lives in .venv-edge, never beside numpy 2.
OPTIONAL_IMPORTS = {"mlflow", "tflite_runtime"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_pins() -> dict[str, str]:
    pins = {}
    for line in LOCK_FILE.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[canonical(name)] = version.strip()
    return pins


def profile(*extras: str) -> list[Requirement]:
    """The requirements `pip install .[extras]` asks for: the base, each extra, and the extras they name."""
    requirements = [Requirement(r) for r in PYPROJECT["project"]["dependencies"]]
    pending, seen = list(extras), set()
    while pending:
        extra = pending.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for raw in PYPROJECT["project"]["optional-dependencies"][extra]:
            requirement = Requirement(raw)
            if canonical(requirement.name) == canonical(PROJECT):
                pending.extend(requirement.extras)
            else:
                requirements.append(requirement)
    return requirements


def test_the_lock_pins_every_declared_dependency() -> None:
    pins = lock_pins()
    problems = []
    for requirement in profile("all"):
        name = canonical(requirement.name)
        if name not in pins:
            problems.append(f"{requirement} is declared but not pinned in requirements.lock")
        elif not requirement.specifier.contains(pins[name], prereleases=True):
            problems.append(f"{requirement} is declared but the lock pins {name}=={pins[name]}")
        for extra in requirement.extras:  # uvicorn[standard], tritonclient[http]: what the extra adds
            for raw in importlib.metadata.requires(requirement.name) or []:
                dependency = Requirement(raw)
                if dependency.marker and dependency.marker.evaluate({"extra": extra}):
                    if canonical(dependency.name) not in pins:
                        problems.append(f"{requirement.name}[{extra}] needs {dependency.name}, not in the lock")
    assert not problems, "\n".join(problems)


def test_onnxruntime_comes_from_one_wheel_and_torch_stays_pinned() -> None:
    pins = lock_pins()
    extras = PYPROJECT["project"]["optional-dependencies"]
    # the two wheels share the `onnxruntime` module: the lock (what `make` installs) holds one
    assert "onnxruntime-gpu" not in pins
    assert [f"onnxruntime=={pins['onnxruntime']}"] == extras["cpu"]
    assert [canonical(Requirement(r).name) for r in extras["gpu"]] == ["onnxruntime-gpu"]
    # `make GPU=1` swaps in the same onnxruntime-gpu release the `gpu` extra names
    assert f"echo '{extras['gpu'][0]}'" in (ROOT / "Makefile").read_text()
    # an unpinned torch pulls a multi-GB CUDA build
    assert pins["torch"] == "2.13.0" and "torch==2.13.0" in extras["train"]
    for name in ("serve", "http", "cpu", "gpu"):
        installed = {canonical(r.name) for r in profile(name)}
        assert not installed & {"torch", "tensorflow", "tf-keras", "onnx2tf"}, (name, installed)


def _third_party(modules: set[str]) -> set[str]:
    return {m for m in modules if not m.startswith("pipeline") and m not in sys.stdlib_module_names}


@functools.cache
def _installed() -> dict[str, list[str]]:
    """Top-level module -> the distributions that provide it, read once: each read walks every installed
    distribution's file list (0.35 s here; once per imported module, it made the test take 48 s)."""
    return dict(importlib.metadata.packages_distributions())


def _distributions(module: str) -> set[str]:
    return {canonical(d) for d in _installed().get(module, [])}


def test_every_third_party_import_is_declared_in_its_profile() -> None:
    """Each module's imports (at the top or inside a function) are declared for the part it belongs to.

    `pipe serve` is checked through everything it reaches, since the serve profile must run it alone.
    """
    graph = grimp.build_graph("pipeline", include_external_packages=True, cache_dir=None)
    needs: dict[str, set[str]] = {}  # third-party module -> where it is imported from
    wanted: dict[tuple[str, ...], set[str]] = {}  # profile -> third-party modules it must provide
    for module in sorted(m for m in graph.modules if m.startswith("pipeline")):
        part = ".".join(module.split(".")[:2])
        if module == "pipeline" or (part == module and not graph.find_children(module)):  # pipeline/*.py
            extras: tuple[str, ...] = PART_PROFILES.get(module, ())  # the base, unless named below
        else:
            extras = PART_PROFILES.get(part, ("all",))
        for imported in _third_party(graph.find_modules_directly_imported_by(module)):
            if imported in PART_OPTIONAL_IMPORTS.get(part, set()):
                continue
            wanted.setdefault(extras, set()).add(imported)
            needs.setdefault(imported, set()).add(module)
    serve_reaches = graph.find_upstream_modules("pipeline.serve", as_package=True)
    wanted.setdefault(("serve",), set()).update(_third_party(serve_reaches))

    problems = []
    for extras, imported in sorted(wanted.items()):
        declared = {canonical(r.name) for r in profile(*extras)}
        if "onnxruntime" in declared:
            declared.add("onnxruntime-gpu")  # `make GPU=1` installs the same module from this wheel
        for module in sorted(imported - OPTIONAL_IMPORTS):
            provided_by = _distributions(module)
            if not provided_by:
                importers = sorted(needs.get(module, {"pipeline.serve"}))
                problems.append(f"{module} (imported by {importers}) is not installed in this environment")
            elif not provided_by & declared:
                where = f".[{','.join(extras)}]" if extras else "the base dependencies"
                problems.append(f"{module} ({'/'.join(sorted(provided_by))}) is imported but not declared in {where}")
    assert not problems, "\n".join(problems)


# --- the serve profile, installed for real --------------------------------------------------------

V2_DATATYPES = {"float32": "FP32", "float64": "FP64", "int64": "INT64", "int32": "INT32", "bool": "BOOL"}
INSTALL_TIMEOUT_S = 600
READY_TIMEOUT_S = 60


def _imported_artifact(tmp: Path) -> Path:
    """A tiny artifact made by `pipe import` (no torch involved): a linear layer written in ONNX text."""
    source = tmp / "linear.onnx"
    onnx.save(onnx.parser.parse_model(LINEAR), source)
    repo = tmp / "artifacts"
    result = CliRunner().invoke(main, ["import", str(source), "--name", "linear", "--repository", str(repo)])
    assert result.exit_code == 0, result.output
    return repo / "linear" / "1"


def _install_serve_profile(tmp: Path) -> tuple[Path, str]:
    """A fresh venv with `.[serve]` pinned by the lock; returns its bin directory and pip's output."""
    source = tmp / "src"  # a copy, so the build leaves nothing in the working tree
    shutil.copytree(ROOT / "pipeline", source / "pipeline", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    venv = tmp / "venv"
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    install = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--disable-pip-version-check", "-c", str(LOCK_FILE), f"{source}[serve]"],
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT_S,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    seconds = time.monotonic() - started
    size = subprocess.run(["du", "-sh", str(venv)], capture_output=True, text=True, check=True).stdout.split()[0]
    print(f"\n.[serve] installed into a fresh venv in {seconds:.0f} s; the venv holds {size}")
    return venv / "bin", install.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status
    except (urllib.error.URLError, ConnectionError):
        return 0


def _start(pipe: Path, artifact: Path, log: Path) -> tuple[subprocess.Popen, str]:
    """`pipe serve` from the fresh venv on a free port; retried when another process took the port first."""
    for _ in range(3):
        port = _free_port()
        command = [str(pipe), "serve", str(artifact), "--host", "127.0.0.1", "--port", str(port), "--poll", "0"]
        command += ["--intra-op-threads", "1", "--inter-op-threads", "1"]
        with open(log, "wb") as out:
            proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline and proc.poll() is None:
            # until this server has bound the port, an answer there would come from whoever took it
            if f"running on {url}" in log.read_text() and _get(f"{url}/v2/health/ready") == 200:
                return proc, url
            time.sleep(0.2)
        if proc.poll() is None:
            _stop(proc)
            raise AssertionError(f"pipe serve was not ready within {READY_TIMEOUT_S} s:\n{log.read_text()}")
        if "address already in use" not in log.read_text():
            raise AssertionError(f"pipe serve exited with {proc.returncode}:\n{log.read_text()}")
    raise AssertionError(f"no free port after 3 tries:\n{log.read_text()}")


def _stop(proc: subprocess.Popen) -> int:
    os.kill(proc.pid, signal.SIGTERM)
    try:
        return proc.wait(20)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        return proc.wait(5)


def _infer(url: str, artifact: Artifact, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A KServe V2 JSON request with urllib: no client library in the way."""
    body = {
        "id": "serve-profile",
        "inputs": [
            {"name": n, "shape": list(a.shape), "datatype": V2_DATATYPES[str(a.dtype)], "data": a.ravel().tolist()}
            for n, a in inputs.items()
        ],
    }
    model = artifact.manifest.name
    request = urllib.request.Request(
        f"{url}/v2/models/{model}/infer",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        answer = json.load(response)
    assert answer["model_name"] == model and answer["id"] == "serve-profile", answer
    return {o["name"]: np.array(o["data"]).reshape(o["shape"]) for o in answer["outputs"]}


def _generates_greedy_text(bin_dir: Path, tmp: Path) -> None:
    """The serve profile's `pipe serve` generates with a decoder (onnxruntime, numpy, tokenizers and jinja2
    only): an OpenAI completion at temperature 0 is the graph's greedy tokens, decoded."""
    from pipeline.runtime.generate import greedy
    from pipeline.runtime.runners import ort_runner
    from pipeline.runtime.session import create_session
    from pipeline.serve.generation.served import TextGenerator
    from pipeline.serve.generation.settings import GenerationSettings
    from tests.lm.imported_lm import NAME, imported_llama

    _, repository = imported_llama(tmp / "lm", 512)
    root = repository / NAME / "1"
    manifest = Artifact.load(root).manifest
    generation = manifest.generation
    gen = TextGenerator.of(
        root, manifest, create_session(root / "model.onnx", "cpu", 1, 1, False), GenerationSettings(), None
    )
    ids = gen.encode("def add(a, b):", True)
    made = greedy(ort_runner(root / "model.onnx"), generation.cache, np.array([ids]), np.ones((1, len(ids)), np.int64),
                  8, generation.eos_token_ids, generation.padding_id)  # fmt: skip
    proc, url = _start(bin_dir / "pipe", repository, tmp / "serve-lm.log")
    try:
        body = {"model": NAME, "prompt": "def add(a, b):", "max_tokens": 8, "temperature": 0}
        request = urllib.request.Request(f"{url}/v1/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")  # fmt: skip
        with urllib.request.urlopen(request, timeout=60) as response:
            answer = json.load(response)
    finally:
        _stop(proc)
    tokens = [int(t) for t in made.tokens[0][: answer["usage"]["completion_tokens"]]]
    assert answer["choices"][0]["text"] == gen.decode(tokens), answer


@pytest.mark.slow
def test_serve_profile_serves_without_torch_or_tensorflow(tmp_path: Path) -> None:
    """`pip install .[serve]` in a fresh venv, then `pipe serve` from it answers a V2 inference, and generates
    text with a decoder (no torch, no transformers in that venv).

    PIPE_SERVE_PROFILE_ARTIFACT names an artifact to serve instead of the tiny imported one
    (`make check-serve-profile` passes the digits-cnn artifact that `make run` made).
    """
    chosen = os.environ.get("PIPE_SERVE_PROFILE_ARTIFACT")
    root = resolve_artifact(chosen) if chosen else _imported_artifact(tmp_path)
    artifact = Artifact.load(root)
    golden = load_golden(artifact)

    bin_dir, pip_output = _install_serve_profile(tmp_path)
    assert not re.search(r"^(Collecting|Downloading) (torch|tensorflow)\b", pip_output, re.MULTILINE), pip_output
    for heavy in ("torch", "tensorflow", "tf_keras", "onnx2tf", "transformers"):
        shown = subprocess.run([str(bin_dir / "pip"), "show", heavy], capture_output=True, text=True)
        assert shown.returncode != 0, f"{heavy} is installed by .[serve]:\n{shown.stdout}"
    if not chosen:
        _generates_greedy_text(bin_dir, tmp_path)

    proc, url = _start(bin_dir / "pipe", root, tmp_path / "serve.log")
    try:
        rows = {name: values[:4] for name, values in golden.inputs.items()}
        outputs = _infer(url, artifact, rows)
    finally:
        code = _stop(proc)
    # a graceful shutdown on SIGTERM exits 128 + 15, after removing the metrics directory (pipeline/serve/server.py)
    assert code in (0, 128 + signal.SIGTERM), (tmp_path / "serve.log").read_text()
    assert set(outputs) == set(golden.outputs)
    for name, expected in golden.outputs.items():
        np.testing.assert_allclose(outputs[name], expected[:4], rtol=1e-4, atol=1e-4, err_msg=name)
    shutil.rmtree(tmp_path / "venv")  # about 220 MB; pytest keeps the last few tmp dirs
