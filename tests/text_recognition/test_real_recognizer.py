"""PaddleOCR's PP-OCRv4 recognizer, as rapidocr ships it, imported with no task flag (its dictionary in
metadata_props['character'] makes it a recognizer), 32 rendered words as its labelled evaluation data,
served by a real `pipe serve`: V2 (JSON and tritonclient's binary) and TF Serving answer texts equal to a
greedy decoding written plainly in tests/text_recognition/rendered.py over onnxruntime's output of the
original file, for tensors and for encoded pictures; `pipe predict` prints them; the classification
extension on the [batch, positions, classes] output is a 400 naming why.

32 words, not 64: the import runs the model over every picture and compresses its [n, 40, 6625] output into
golden.npz, each proportional to n (64 took 26 s of the module's 45 s on a loaded machine); 32 still hold the
four kinds of text (words, numbers, two words with a space, capitals) and the four fonts, and read as 31 of 32.
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from click.testing import CliRunner
from PIL import Image

from pipeline.cli import main
from tests import corpus
from tests.serve.serve_process import Server, start_server
from tests.text_recognition import rendered

pytestmark = pytest.mark.slow  # the import runs the 10.9 MB model over 32 pictures and the gate's batches
MODEL = "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx"
OUTPUT = "softmax_11.tmp_0"
# How rapidocr feeds the model, for pictures already 48x320: (x / 255 - 0.5) / 0.5; RGB is BGR for grey text.
PICTURES = json.dumps({"mode": "RGB", "size": [48, 320], "scale": 1 / 255, "mean": [0.5] * 3, "std": [0.5] * 3})


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("recognizer")
    model = corpus.path(corpus.RAPIDOCR, MODEL)
    words, pictures = rendered.pictures(32)
    np.savez(root / "eval.npz", x=rendered.tensor(pictures), target=np.array(words))
    result = CliRunner().invoke(main, ["import", str(model), "--name", "ppocr", "--eval-data",
                                       str(root / "eval.npz"), "--image-preprocessing", PICTURES,
                                       "--repository", str(root / "repo")])  # fmt: skip
    assert result.exit_code == 0, result.output
    return {"root": root, "model": model, "words": words, "pictures": pictures, "output": result.output}


@pytest.fixture(scope="module")
def server(made: dict, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = start_server([made["root"] / "repo"], tmp_path_factory.mktemp("log") / "serve.log", "--poll", "0")
    yield running
    running.stop()


def test_import_reads_the_paddle_dictionary_and_measures_texts(made: dict) -> None:
    assert "task: text-recognition (metadata_props['character'] (Paddle): a dictionary for output" in made["output"]
    assert (
        "ctc: {'blank': 0, 'space': True} (6623 entries for 6625 classes: blank 0 and a space after it)"
        in (made["output"])
    )
    manifest = json.loads((made["root"] / "repo" / "ppocr" / "1" / "manifest.json").read_text())
    assert len(manifest["labels"]) == 6623 and manifest["labels"][5709] == "\u3000"  # the ideographic space kept
    assert manifest["metrics"]["text_agreement"] >= 0.95 and manifest["metrics"]["cer"] <= 0.02


def test_v2_json_and_tritonclient_answer_the_reference_texts_for_tensors(made: dict, server: Server) -> None:
    batch = rendered.tensor(made["pictures"][:8])
    want = rendered.reference_texts(made["model"], batch)
    assert sum(a == b for a, b in zip(want, made["words"][:8], strict=True)) >= 7  # the model reads the words
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": list(batch.shape), "data": batch.ravel().tolist()}]}
    answer = httpx.post(f"{server.url}/v2/models/ppocr/infer", json=body, timeout=120).json()
    outputs = {o["name"]: o for o in answer["outputs"]}
    assert list(outputs) == ["text", "confidence"]
    assert outputs["text"]["datatype"] == "BYTES" and outputs["text"]["data"] == want
    assert all(0.5 < c <= 1.0 for c in outputs["confidence"]["data"])
    with triton.InferenceServerClient(server.address) as client:
        tensor = triton.InferInput("x", list(batch.shape), "FP32")
        tensor.set_data_from_numpy(batch, binary_data=True)
        asked = [triton.InferRequestedOutput(name, binary_data=True) for name in ("text", OUTPUT)]
        result = client.infer("ppocr", [tensor], outputs=asked)
    assert [t.decode() for t in result.as_numpy("text")] == want
    assert result.as_numpy(OUTPUT).shape == (8, 40, 6625)  # the raw output, asked for by name


def test_pictures_sent_encoded_are_read_as_the_reference_reads_them(made: dict, server: Server) -> None:
    pictures = [_full_width(p) for p in made["pictures"][8:12]]
    want = rendered.reference_texts(made["model"], rendered.tensor(pictures))
    encoded = [base64.b64encode(_png(p)).decode() for p in pictures]
    body = {"inputs": [{"name": "x", "datatype": "BYTES", "shape": [len(encoded)], "data": encoded}]}
    answer = httpx.post(f"{server.url}/v2/models/ppocr/infer", json=body, timeout=120).json()
    assert answer["outputs"][0]["data"] == want
    tf = {"instances": [{"b64": e} for e in encoded]}
    predictions = httpx.post(f"{server.url}/v1/models/ppocr:predict", json=tf, timeout=120).json()["predictions"]
    assert [p["text"] for p in predictions] == want and all(set(p) == {"text", "confidence"} for p in predictions)


def test_model_metadata_lists_the_text_outputs_first(server: Server) -> None:
    outputs = httpx.get(f"{server.url}/v2/models/ppocr", timeout=30).json()["outputs"]
    assert [(o["name"], o["datatype"], o["shape"]) for o in outputs] == [
        ("text", "BYTES", [-1]), ("confidence", "FP32", [-1]), (OUTPUT, "FP32", [-1, -1, 6625])
    ]  # fmt: skip


def test_the_classification_extension_on_the_sequence_output_is_refused(made: dict, server: Server) -> None:
    batch = rendered.tensor(made["pictures"][:1])
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": list(batch.shape), "data": batch.ravel().tolist()}],
            "outputs": [{"name": OUTPUT, "parameters": {"classification": 3}}]}  # fmt: skip
    answer = httpx.post(f"{server.url}/v2/models/ppocr/infer", json=body, timeout=120)
    assert answer.status_code == 400
    assert "is FP32[-1, -1, 6625]: one prediction per position, not one [batch, classes] row" in answer.json()["error"]
    tf = httpx.post(f"{server.url}/v1/models/ppocr:classify", json={"examples": batch.tolist()}, timeout=120)
    assert tf.status_code == 400 and "use :predict" in tf.json()["error"]  # where the texts are answered


def test_predict_prints_the_texts(made: dict) -> None:
    batch = rendered.tensor(made["pictures"][:3])
    np.savez(made["root"] / "three.npz", x=batch)
    want = rendered.reference_texts(made["model"], batch)
    result = CliRunner().invoke(main, ["predict", str(made["root"] / "repo" / "ppocr"), "--input",
                                       str(made["root"] / "three.npz")])  # fmt: skip
    assert result.exit_code == 0, result.output
    for i, text in enumerate(want):
        assert f"sample {i}: {text!r}  confidence" in result.output


def _full_width(picture: Image.Image) -> Image.Image:
    """The picture on a white 48x320 canvas: the stretch the server records then changes nothing."""
    canvas = Image.new("RGB", (rendered.WIDTH, rendered.HEIGHT), "white")
    canvas.paste(picture, (0, 0))
    return canvas


def _png(picture: Image.Image) -> bytes:
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    return buffer.getvalue()
