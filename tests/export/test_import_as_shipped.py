"""Real graphs as their authors ship them, imported without re-export: Silero VAD v5 (a scalar `sr`
pinned with --input-value, a state whose batch is axis 1), served, and answering like onnxruntime on
the original file. The sound is synthesized here: sine tones, noise, silence."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from pipeline.artifact.directory import Artifact
from pipeline.artifact.golden import load_golden
from pipeline.cli import main
from pipeline.runtime.runners import ort_runner
from pipeline.runtime.session import create_session
from tests import corpus

FRAME, CONTEXT = 512, 64  # Silero VAD v5 at 16 kHz: 512 new samples and 64 of context per call
RATE = 16_000


def sound_frames(count: int, seed: int = 0) -> np.ndarray:
    """[count, 576] float32: sine tones at speech-like pitches, white noise and near silence, in turn."""
    rng = np.random.default_rng(seed)
    t = np.arange(FRAME + CONTEXT) / RATE
    frames = []
    for i in range(count):
        kind = i % 3
        if kind == 0:
            pitch = rng.uniform(120, 400)
            wave = 0.5 * np.sin(2 * np.pi * pitch * t) + 0.2 * np.sin(2 * np.pi * 2.5 * pitch * t)
        elif kind == 1:
            wave = rng.normal(0, 0.3, t.shape)
        else:
            wave = rng.normal(0, 1e-4, t.shape)
        frames.append(wave)
    return np.asarray(frames, np.float32)


@pytest.fixture(scope="module")
def silero() -> Path:
    return corpus.path(corpus.SILERO_VAD, "silero_vad/data/silero_vad.onnx")


@pytest.fixture(scope="module")
def sound(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The evaluation data in the model's own layout: input [N, 576], state [2, N, 128] (some non-zero)."""
    frames = sound_frames(24)
    state = np.zeros((2, 24, 128), np.float32)
    state[:, 12:] = np.random.default_rng(1).normal(0, 0.5, (2, 12, 128))
    path = tmp_path_factory.mktemp("sound") / "sound.npz"
    np.savez(path, input=frames, state=state)
    return path


def original(silero: Path, frames: np.ndarray, state: np.ndarray) -> list[np.ndarray]:
    """Silero VAD run by onnxruntime as its own package runs it: sr fed with every call."""
    session = create_session(silero)
    return session.run(None, {"input": frames, "state": state, "sr": np.array(RATE, np.int64)})


@pytest.fixture(scope="module")
def imported(silero: Path, sound: Path, tmp_path_factory: pytest.TempPathFactory) -> Artifact:
    repo = tmp_path_factory.mktemp("repo")
    args = ["import", str(silero), "--name", "vad", "--repository", str(repo), "--input-value", f"sr={RATE}",
            "--batch-axis", "state:1", "--input-shape", "input:?,576", "--eval-data", str(sound)]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "pinned sr: 16000" in result.output and "output 'stateN': batch axis 1" in result.output
    return Artifact.load(repo / "vad" / "1")


def test_silero_vad_imports_as_shipped_with_sr_pinned_and_state_batched_on_axis_1(
    imported: Artifact, silero: Path, sound: Path
) -> None:
    manifest = imported.manifest
    assert [(p.name, p.dtype, p.shape, p.value) for p in manifest.pinned or []] == [("sr", "int64", [], RATE)]
    specs = {s.name: s for s in [*manifest.inputs, *manifest.outputs]}
    assert "sr" not in specs  # a constant of the model now, fed by no hop and no client
    assert specs["state"].shape == [2, "batch", 128] and specs["state"].batch_axis == 1
    assert specs["input"].shape == ["batch", 576] and specs["stateN"].batch_axis == 1
    graph_inputs = [i.name for i in onnx.load(str(imported.path("model.onnx"))).graph.input]
    assert graph_inputs == ["input", "state"]
    record = manifest.stages.import_
    assert record is not None and record.settings["input_values"] == {"sr": RATE}
    checks = {(row["check"], row["output"]): row["passed"] for row in record.parity["rows"]}
    for case in ("batch 1", "batch 2", "batch 16"):  # the batch varied on state's axis 1, not refused as fixed
        assert checks[(case, "stateN")] and checks[(case, "output")]
    # golden.npz leads with the samples; the model's own layout is [2, N, 128]
    golden = load_golden(imported)
    data = np.load(sound)
    assert golden.inputs["state"].shape == (24, 2, 128)
    want = original(silero, data["input"], data["state"])
    np.testing.assert_allclose(golden.outputs["output"], want[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.moveaxis(golden.outputs["stateN"], 0, 1), want[1], rtol=1e-5, atol=1e-6)
    # any hop's runner reads the batch axes back from the model file
    got = ort_runner(imported.path("model.onnx"))({"input": data["input"][:3], "state": golden.inputs["state"][:3]})
    np.testing.assert_allclose(got["output"], want[0][:3], rtol=1e-5, atol=1e-6)


def test_a_scalar_input_left_unpinned_is_refused_naming_the_flag(silero: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["import", str(silero), "--name", "vad", "--repository", str(tmp_path)])
    assert result.exit_code == 2
    assert "--input-value sr=VALUE" in result.output


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--input-value", "sr=[16000, 8000]"], "a value of shape [2], but input 'sr' is declared []"),
        (["--input-value", "sr=16000.5"], "input 'sr' is int64, which cannot hold it"),
        (["--input-value", "rate=16000"], "the model has no input 'rate'; its inputs are ['input', 'sr', 'state']"),
        (["--input-value", "sr"], "expected NAME=VALUE, e.g. --input-value sr=16000"),
        (["--input-value", "sr=16000", "--batch-axis", "state:one"], "expected NAME:AXIS with AXIS a whole number"),
        (["--input-value", "sr=16000", "--batch-axis", "state:3"], "'state' has 3 dims"),
        (["--input-value", "sr=16000", "--batch-axis", "stat:1"], "--batch-axis names ['stat']"),
        (
            ["--input-value", "sr=16000", "--input-shape", "input:?,576"],  # state's batch left undeclared
            "it runs when 'state' dim 1 (state_dim1) is the batch size: if that axis holds the samples, declare it "
            "with --batch-axis state:1",
        ),
    ],
)
def test_pins_and_batch_axes_the_model_cannot_take_are_refused(
    silero: Path, tmp_path: Path, flags: list[str], said: str
) -> None:
    result = CliRunner().invoke(main, ["import", str(silero), "--name", "vad", "--repository", str(tmp_path), *flags])
    assert result.exit_code == 2, result.output
    assert said in result.output
    assert not (tmp_path / "vad").exists()


def test_sample_axes_move_samples_to_the_batch_axis_and_split_a_fixed_batch() -> None:
    from pipeline.runtime.sample_axes import SampleAxes

    calls = []

    def model(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:  # state [2, B, 3] -> out [B, 1], new [2, B, 3]
        calls.append(arrays["state"].shape)
        return {"out": arrays["state"].sum(axis=(0, 2))[:, None], "new": arrays["state"] * 2}

    state = np.arange(5 * 2 * 3, dtype=np.float32).reshape(5, 2, 3)  # pipe's layout: samples first
    got = SampleAxes({"state": 1}, {"new": 1}).wrap(model)
    result = got({"state": state})
    assert calls == [(2, 5, 3)]
    np.testing.assert_array_equal(result["new"], state * 2)
    np.testing.assert_array_equal(result["out"][:, 0], state.sum(axis=(1, 2)))
    calls.clear()
    one_at_a_time = SampleAxes({"state": 1}, {"new": 1}, fixed=1).wrap(model)
    np.testing.assert_array_equal(one_at_a_time({"state": state})["new"], state * 2)
    assert calls == [(2, 1, 3)] * 5


@pytest.mark.slow  # starts a server process
def test_silero_vad_is_served_without_sr_and_answers_like_the_original(
    imported: Artifact, silero: Path, tmp_path: Path
) -> None:
    from tests.serve.serve_process import start_server

    frames = sound_frames(3, seed=7)[:1]
    state = np.random.default_rng(3).normal(0, 0.5, (2, 1, 128)).astype(np.float32)
    want = original(silero, frames, state)

    def request(*extra: dict) -> httpx.Response:
        inputs = [
            {"name": "input", "shape": [1, 576], "datatype": "FP32", "data": frames.ravel().tolist()},
            {"name": "state", "shape": [2, 1, 128], "datatype": "FP32", "data": state.ravel().tolist()},
            *extra,
        ]
        return httpx.post(f"{server.url}/v2/models/vad/infer", json={"inputs": inputs}, timeout=30)

    server = start_server([imported.root.parent.parent], tmp_path / "serve.log", "--poll", "0")
    try:
        answer = request()
        assert answer.status_code == 200, answer.text
        outputs = {o["name"]: np.asarray(o["data"], np.float32).reshape(o["shape"]) for o in answer.json()["outputs"]}
        np.testing.assert_allclose(outputs["output"], want[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(outputs["stateN"], want[1], rtol=1e-5, atol=1e-6)
        same = request({"name": "sr", "shape": [], "datatype": "INT64", "data": [RATE]})
        assert same.status_code == 200, same.text
        other = request({"name": "sr", "shape": [], "datatype": "INT64", "data": [8000]})
        assert other.status_code == 400
        assert "'sr' is pinned to 16000" in other.json()["error"] and "8000" in other.json()["error"]
        assert "batching off (the batch is not the first axis of" in server.logs()
    finally:
        server.stop()


def rendered_words(folder: Path, words: list[str]) -> Path:
    """One picture per word, black text rendered on white at 64x160, as a scanned label would be."""
    from PIL import Image, ImageDraw, ImageFont

    folder.mkdir(parents=True, exist_ok=True)
    font = ImageFont.load_default(size=32)
    for i, word in enumerate(words):
        image = Image.new("RGB", (160, 64), (255, 255, 255))
        ImageDraw.Draw(image).text((8, 12), word, fill=(0, 0, 0), font=font)
        image.save(folder / f"{i:02d}.png")
    return folder


@pytest.mark.slow  # 8 s: 12 pictures through a 13 MB CNN+LSTM, one at a time
def test_a_fixed_batch_recognizer_is_judged_on_every_picture_with_its_output_as_computed(tmp_path: Path) -> None:
    """ddddocr's recognizer takes one picture a run ([1, 1, 64, width]) and declares its output [1, seqlen],
    which is really [T, 1, 8210]: imported as shipped, all 12 pictures recorded and gated one at a time."""
    source = corpus.path(corpus.DDDDOCR, "ddddocr/common_old.onnx")
    words = ["hello", "world", "pipe", "onnx", "model", "test", "alpha", "delta", "gamma", "omega", "river", "stone"]
    folder = rendered_words(tmp_path / "words", words)
    args = ["import", str(source), "--name", "ocr", "--repository", str(tmp_path / "repo"), "--eval-data", str(folder),
            "--image-preprocessing", '{"mode": "L", "size": [64, 160]}', "--task", "tensor"]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "declared [1, 'seqlen'] but computes [20, 1, 8210]" in result.output
    artifact = Artifact.load(tmp_path / "repo" / "ocr" / "1")
    (output,) = artifact.manifest.outputs
    assert output.shape == ["387_dim0", 1, 8210] and output.batch_axis == 1
    golden = load_golden(artifact)
    assert golden.inputs["input1"].shape == (12, 1, 64, 160)  # every picture, not one
    assert golden.outputs["387"].shape == (12, 20, 8210)
    record = artifact.manifest.stages.import_
    assert record is not None and record.parity["rows"][-1]["check"] == "fixed batch 12"
    session = create_session(source)
    for i in (0, 7, 11):
        (want,) = session.run(None, {"input1": golden.inputs["input1"][i : i + 1]})
        np.testing.assert_allclose(golden.outputs["387"][i], want[:, 0], rtol=1e-5, atol=1e-5)
    texts = {int(t) for t in golden.outputs["387"].argmax(-1).ravel()}
    assert len(texts) > 5  # the recognizer reads characters, not one blank everywhere
