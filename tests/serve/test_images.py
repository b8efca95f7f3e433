"""Encoded pictures against a real `pipe serve`: PNGs of sklearn digits sent as TF Serving b64 and as V2
BYTES (JSON and tritonclient binary) get the answer of the preprocessed float tensor; unreadable,
huge and alpha pictures are 400s; metadata shows the recorded preprocessing.

The digit model is a real classifier: sklearn's logistic regression on the 8x8 digits (0..16), as an
ONNX Flatten + MatMul + Add, so a PNG of a digit is also checked to be read as that digit.
"""

from __future__ import annotations

import base64
import functools
import io
import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import pytest
import tritonclient.http as triton
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper
from PIL import Image
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression
from tritonclient.utils import InferenceServerException

from pipeline.cli import main
from tests.serve.serve_models import OPSET, write_artifact
from tests.serve.serve_process import Server, start_server

DIGITS_RECORD = {"mode": "L", "size": [8, 8], "resize": "bilinear", "scale": 16 / 255}
RGB_OPTION = {"layout": "NHWC", "mode": "RGB", "size": [4, 6], "scale": 1 / 255, "mean": [0.5, 0.4, 0.3],
              "std": [0.25, 0.5, 2.0]}  # fmt: skip
SAMPLES = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 42, 1000]  # rows of sklearn's digits
LETTERBOX_RECORD = {"mode": "L", "letterbox": {"size": [8, 8], "pad": 0}, "resize": "bilinear", "scale": 16 / 255}


@functools.cache
def fitted_digits() -> tuple[np.ndarray, np.ndarray]:
    """W [64, 10] and b [10] of a logistic regression fitted on the digits (0..16), fitted once per run: one
    fit took 38 s on a loaded 2-core machine, and the module builds five models from it."""
    digits = load_digits()
    fitted = LogisticRegression(max_iter=2000).fit(digits.data, digits.target)
    return fitted.coef_.T.astype(np.float32), fitted.intercept_.astype(np.float32)


def digits_classifier(layout: str = "NCHW") -> onnx.ModelProto:
    """logits = flatten(input) @ W + b, W and b from a logistic regression fitted on the digits (0..16)."""
    w, b = fitted_digits()  # [64, 10], [10]
    shape = ["batch", 1, 8, 8] if layout == "NCHW" else ["batch", 8, 8, 1]
    graph = helper.make_graph(
        [
            helper.make_node("Flatten", ["input"], ["flat"]),
            helper.make_node("MatMul", ["flat", "w"], ["mm"]),
            helper.make_node("Add", ["mm", "b"], ["logits"]),
        ],
        "digits",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    return helper.make_model(graph, opset_imports=OPSET, ir_version=10)


def rgb_mean() -> onnx.ModelProto:
    """NHWC RGB [batch, 4, 6, 3] -> the mean of each channel [batch, 3]: shows every pixel's value."""
    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["input", "axes"], ["means"], keepdims=0)],
        "rgb",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 4, 6, 3])],
        [helper.make_tensor_value_info("means", TensorProto.FLOAT, ["batch", 3])],
        [numpy_helper.from_array(np.array([1, 2], np.int64), "axes")],
    )
    return helper.make_model(graph, opset_imports=OPSET, ir_version=10)


def record(repo: Path, name: str, model: onnx.ModelProto, layout: str, preprocessing: dict) -> None:
    artifact = write_artifact(repo, name, 1, model)
    artifact.manifest.inputs[0].layout = layout
    artifact.manifest.inputs[0].preprocessing = preprocessing
    artifact.save()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = tmp_path_factory.mktemp("images") / "artifacts"
    # As pipe train records the digits CNN: mean/std inside the model, the image record beside them.
    record(repo, "digits", digits_classifier(), "NCHW", {"mean": [4.9], "std": [6.0], "applied_in_model": True,
                                                         "image": DIGITS_RECORD})  # fmt: skip
    # An imported RGB model normalized outside, recorded by pipe import: mean/std applied after the scale.
    onnx.save(rgb_mean(), repo.parent / "rgb.onnx")
    args = ["import", str(repo.parent / "rgb.onnx"), "--name", "rgb", "--task", "regression", "--repository", str(repo)]
    result = CliRunner().invoke(main, [*args, "--image-preprocessing", json.dumps(RGB_OPTION)])
    assert result.exit_code == 0, result.output
    record(repo, "unrecorded", digits_classifier(), "NCHW", {})  # an image input nobody said how to feed
    record(repo, "boxed", digits_classifier(), "NCHW", {"image": LETTERBOX_RECORD})  # kept aspect, padded
    # A record that cannot be applied (a hand edit): the version is refused when it loads, not per request.
    record(repo, "badcrop", digits_classifier(), "NCHW", {"image": {"mode": "L", "resize_short": 8, "crop": [9, 9]}})
    running = start_server([repo], tmp_path_factory.mktemp("log") / "serve.log", "--poll", "0")
    yield running
    running.stop()


def png(pixels: np.ndarray, mode: str = "L") -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels, mode=mode).save(out, format="PNG")
    return out.getvalue()


def digit_png(row: int, side: int) -> bytes:
    """Row `row` of sklearn's digits as a grey PNG (0..16 -> 0..255, white ink), `side` pixels square."""
    pixels = np.round(load_digits().images[row] * 255 / 16).astype(np.uint8)
    return png(np.asarray(Image.fromarray(pixels, "L").resize((side, side), Image.Resampling.NEAREST)))


def preprocessed(picture: bytes) -> np.ndarray:
    """What the recorded preprocessing says, written out here: grey, bilinear to 8x8, x 16/255, [1, 8, 8]."""
    grey = Image.open(io.BytesIO(picture)).convert("L").resize((8, 8), Image.Resampling.BILINEAR)
    return (np.asarray(grey, np.float32) * np.float32(16 / 255))[np.newaxis]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def v2_infer(server: Server, model: str, tensor: dict) -> httpx.Response:
    return httpx.post(f"{server.url}/v2/models/{model}/infer", json={"inputs": [tensor]}, timeout=30)


def v2_logits(response: httpx.Response) -> np.ndarray:
    assert response.status_code == 200, response.text
    output = response.json()["outputs"][0]
    return np.asarray(output["data"], np.float32).reshape(output["shape"])


@pytest.mark.parametrize("side", [8, 32], ids=["8x8", "32x32-resized"])
def test_a_digit_png_as_b64_and_as_v2_bytes_gets_the_answer_of_its_preprocessed_tensor(
    server: Server, side: int
) -> None:
    pictures = [digit_png(row, side) for row in SAMPLES]
    tensor = np.stack([preprocessed(p) for p in pictures])  # [n, 1, 8, 8]
    fp32 = {"name": "input", "datatype": "FP32", "shape": list(tensor.shape), "data": tensor.ravel().tolist()}
    expected = v2_logits(v2_infer(server, "digits", fp32))
    if side == 8:  # a real classifier: the pictures are read as the digits they show (resizing 32 -> 8 blurs)
        assert expected.argmax(1).tolist() == load_digits().target[SAMPLES].tolist()

    answers = {}
    for form in ({"b64": b64(p)} for p in pictures), ({"input": {"b64": b64(p)}} for p in pictures):
        response = httpx.post(f"{server.url}/v1/models/digits:predict", json={"instances": list(form)}, timeout=30)
        assert response.status_code == 200, response.text
        answers[f"tfserving {len(answers)}"] = np.asarray(response.json()["predictions"], np.float32)
    columnar = {"inputs": {"input": [{"b64": b64(p)} for p in pictures]}}
    response = httpx.post(f"{server.url}/v1/models/digits:predict", json=columnar, timeout=30)
    answers["tfserving columnar"] = np.asarray(response.json()["outputs"], np.float32)
    json_bytes = {"name": "input", "datatype": "BYTES", "shape": [len(pictures)], "data": [b64(p) for p in pictures]}
    answers["v2 json"] = v2_logits(v2_infer(server, "digits", json_bytes))
    with triton.InferenceServerClient(server.address) as client:
        for binary in (True, False):
            tensor_in = triton.InferInput("input", [len(pictures)], "BYTES")
            if binary:  # raw PNG bytes, length-prefixed, as tritonclient sends BYTES
                tensor_in.set_data_from_numpy(np.array(pictures, dtype=object), binary_data=True)
            else:  # tritonclient's JSON: the base64 strings
                tensor_in.set_data_from_numpy(np.array([b64(p) for p in pictures], dtype=object), binary_data=False)
            result = client.infer("digits", [tensor_in], outputs=[triton.InferRequestedOutput("logits")])
            answers[f"tritonclient binary={binary}"] = result.as_numpy("logits")
    for how, logits in answers.items():
        np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5, err_msg=how)


def test_wrapped_and_url_safe_base64_pictures_are_read_as_tf_serving_reads_them(server: Server) -> None:
    pictures = [digit_png(row, 32) for row in SAMPLES]
    encodings = {
        "standard": [b64(p) for p in pictures],
        "wrapped at 76 columns": [base64.encodebytes(p).decode() for p in pictures],
        "url-safe, unpadded": [base64.urlsafe_b64encode(p).decode().rstrip("=") for p in pictures],
    }
    assert any("\n" in text[:-1] for text in encodings["wrapped at 76 columns"])
    assert any(set(text) & set("-_") for text in encodings["url-safe, unpadded"])  # differs from the standard one
    answers = {}
    for how, texts in encodings.items():
        tf = httpx.post(f"{server.url}/v1/models/digits:predict", json={"instances": [{"b64": t} for t in texts]})
        assert tf.status_code == 200, (how, tf.text)
        answers[f"tfserving {how}"] = np.asarray(tf.json()["predictions"], np.float32)
        tensor = {"name": "input", "datatype": "BYTES", "shape": [len(texts)], "data": texts}
        answers[f"v2 {how}"] = v2_logits(v2_infer(server, "digits", tensor))
    for how, logits in answers.items():
        np.testing.assert_array_equal(logits, answers["tfserving standard"], err_msg=how)


def test_mean_std_outside_the_model_resize_and_nhwc_are_applied_as_recorded(server: Server) -> None:
    rgb = np.random.default_rng(3).integers(0, 256, (10, 9, 3), dtype=np.uint8)  # resized to 4x6
    picture = png(rgb, "RGB")
    resized = np.asarray(Image.fromarray(rgb, "RGB").resize((6, 4), Image.Resampling.BILINEAR), np.float32)
    expected = ((resized / 255 - [0.5, 0.4, 0.3]) / [0.25, 0.5, 2.0]).mean(axis=(0, 1))
    response = httpx.post(f"{server.url}/v1/models/rgb:predict", json={"instances": [{"b64": b64(picture)}]})
    assert response.status_code == 200, response.text
    np.testing.assert_allclose(response.json()["predictions"][0], expected, rtol=1e-5, atol=1e-6)


def test_a_letterboxed_model_gets_the_picture_fitted_and_padded_and_a_bad_record_is_refused_at_load(
    server: Server,
) -> None:
    wide = np.repeat(np.round(load_digits().images[3] * 255 / 16).astype(np.uint8), 2, axis=1)  # 16x8 (w x h)
    fitted = Image.fromarray(wide, "L").resize((8, 4), Image.Resampling.BILINEAR)  # fit 8x8: 8x4, aspect kept
    tensor = np.zeros((1, 1, 8, 8), np.float32)  # padded with 0 above and below: 2 rows each
    tensor[0, 0, 2:6] = np.asarray(fitted, np.float32) * np.float32(16 / 255)
    fp32 = {"name": "input", "datatype": "FP32", "shape": [1, 1, 8, 8], "data": tensor.ravel().tolist()}
    expected = v2_logits(v2_infer(server, "boxed", fp32))
    picture = {"name": "input", "datatype": "BYTES", "shape": [1], "data": [b64(png(wide))]}
    np.testing.assert_allclose(v2_logits(v2_infer(server, "boxed", picture)), expected, rtol=1e-5, atol=1e-5)
    shown = httpx.get(f"{server.url}/v2/models/boxed").json()["parameters"]["preprocessing"]["input"]["image"]
    assert shown == {"layout": "NCHW", **LETTERBOX_RECORD}

    refused = httpx.get(f"{server.url}/v2/models/badcrop")
    assert refused.status_code == 404
    assert (
        "failed to load" in refused.json()["error"]
        and "crop [9, 9] is larger than resize_short 8" in (refused.json()["error"])
    )


def test_metadata_shows_the_recorded_preprocessing(server: Server) -> None:
    v2 = httpx.get(f"{server.url}/v2/models/digits").json()
    shown = v2["parameters"]["preprocessing"]["input"]
    assert shown["image"] == {"layout": "NCHW", **DIGITS_RECORD} and shown["applied_in_model"] is True
    tf = httpx.get(f"{server.url}/v1/models/rgb/metadata").json()
    image = tf["metadata"]["preprocessing"]["input"]["image"]
    assert image == {"layout": "NHWC", "mode": "RGB", "size": [4, 6], "resize": "bilinear", "scale": 1 / 255,
                     "mean": [0.5, 0.4, 0.3], "std": [0.25, 0.5, 2.0]}  # fmt: skip
    assert "signature_def" in tf["metadata"]


def bomb() -> bytes:
    """A 12000x12000 grey PNG of zeros: 144 million pixels in about 140 KB."""
    return png(np.zeros((12_000, 12_000), np.uint8))


def sliver() -> bytes:
    """A 1x40,000,000 grey PNG (under the pixel cap, about 80 KB): resizing it to 8x8 makes 320 million
    pixels on the way (Pillow resizes one axis at a time) and takes seconds of CPU per picture."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 1, 40_000_000, 8, 0, 0, 0, 0)  # width 1, height 40M, 8-bit grey
    rows = zlib.compress(b"\x00\x00" * 40_000_000)  # each row: filter 0, one black pixel
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", rows) + chunk(b"IEND", b"")


def rgba() -> bytes:
    return png(np.zeros((8, 8, 4), np.uint8), "RGBA")


def sixteen_bit() -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.zeros((8, 8), np.uint16)).save(out, format="PNG")  # mode I;16
    return out.getvalue()


REFUSED = {
    "not a picture": (lambda: b"hello, not a picture", "not a readable picture"),
    "truncated": (lambda: digit_png(0, 32)[:60], "not a readable picture"),
    "corrupt": (lambda: digit_png(0, 32)[:40] + b"\x00" * 80 + digit_png(0, 32)[120:], "not a readable picture"),
    "bomb": (bomb, "is 144000000 pixels, over the 50000000-pixel limit"),  # the documented 50 Mpx
    "sliver": (sliver, "1x40000000 (width x height), is too far from the model's 8x8 in shape"),
    "alpha": (rgba, "mode RGBA"),
    "16-bit": (sixteen_bit, "mode I;16"),
}


@pytest.mark.parametrize("case", REFUSED, ids=list(REFUSED))
@pytest.mark.parametrize("protocol", ["tfserving", "v2-json", "v2-binary"])
def test_a_picture_that_cannot_be_read_faithfully_is_a_400_naming_why(server: Server, case: str, protocol: str) -> None:
    make, message = REFUSED[case]
    picture = make()
    if protocol == "tfserving":
        response = httpx.post(f"{server.url}/v1/models/digits:predict", json={"instances": [{"b64": b64(picture)}]})
        status, error = response.status_code, response.json()["error"]
    elif protocol == "v2-json":
        response = v2_infer(
            server, "digits", {"name": "input", "datatype": "BYTES", "shape": [1], "data": [b64(picture)]}
        )
        status, error = response.status_code, response.json()["error"]
    else:
        with triton.InferenceServerClient(server.address) as client:
            tensor_in = triton.InferInput("input", [1], "BYTES")
            tensor_in.set_data_from_numpy(np.array([picture], dtype=object), binary_data=True)
            with pytest.raises(InferenceServerException) as refused:
                client.infer("digits", [tensor_in])
            status, error = int(refused.value.status()), refused.value.message()
    assert status == 400, error
    assert message in error and "picture 0" in error
    assert "BytesIO" not in error and "178956970" not in error and "89478485" not in error  # Pillow's internals


def test_requests_that_are_not_pictures_for_an_image_input_are_400s(server: Server) -> None:
    def tf(model: str, instances: list) -> httpx.Response:
        return httpx.post(f"{server.url}/v1/models/{model}:predict", json={"instances": instances})

    unrecorded = tf("unrecorded", [{"b64": b64(digit_png(0, 8))}])
    assert unrecorded.status_code == 400
    assert "preprocessing.image" in unrecorded.json()["error"] and "--image-preprocessing" in unrecorded.json()["error"]
    not_base64 = tf("digits", [{"b64": "not base64!"}])
    assert not_base64.status_code == 400 and "not base64" in not_base64.json()["error"]
    text = v2_infer(server, "digits", {"name": "input", "datatype": "BYTES", "shape": [1], "data": ["hello there"]})
    assert text.status_code == 400 and "not a readable picture" in text.json()["error"]
    matrix = v2_infer(server, "digits", {"name": "input", "datatype": "BYTES", "shape": [1, 1], "data": ["aGk="]})
    assert matrix.status_code == 400 and "shape [n]" in matrix.json()["error"]
    mixed = tf("digits", [{"b64": b64(digit_png(0, 8))}, [[0.0] * 8] * 8])
    assert mixed.status_code == 400
    # The server keeps answering: none of these was a server fault.
    assert tf("digits", [{"b64": b64(digit_png(3, 8))}]).status_code == 200


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("{not json", "not valid JSON"),
        ('{"mode": "CMYK", "size": [4, 6]}', "mode 'CMYK' is not one of L, RGB"),
        ('{"mode": "L", "size": [4, 6]}', "mode is 'L', but input 'input'"),
        ('{"mode": "RGB", "size": [5, 6], "layout": "NHWC"}', "size is [5, 6]"),
        ('{"mode": "RGB", "size": [4, 6], "layout": "NHWC", "scale": -1}', "scale -1 is not a number > 0"),
        ('{"mode": "RGB", "size": [4, 6], "layout": "NHWC", "mean": [1, 2]}', "does not fit 3 channel(s)"),
        ('{"mode": "RGB", "size": [4, 6], "input": "x"}', "has no input 'x'"),
    ],
)
def test_pipe_import_refuses_an_image_preprocessing_it_could_not_apply(
    tmp_path: Path, option: str, message: str
) -> None:
    onnx.save(rgb_mean(), tmp_path / "rgb.onnx")
    args = ["import", str(tmp_path / "rgb.onnx"), "--name", "rgb", "--repository", str(tmp_path / "artifacts")]
    result = CliRunner().invoke(main, [*args, "--task", "regression", "--image-preprocessing", option])
    assert result.exit_code == 2, result.output
    assert message in result.output and "\n" == result.output[-1] and result.output.count("\n") == 1
    assert not list((tmp_path / "artifacts").glob("rgb/*/manifest.json"))  # nothing half-made


def test_too_many_pictures_are_refused_before_any_is_decoded(server: Server) -> None:
    garbage = {"name": "input", "datatype": "BYTES", "shape": [65], "data": [b64(b"not a picture")] * 65}
    response = v2_infer(server, "digits", garbage)
    assert response.status_code == 400, response.text
    assert "holds 65 rows, more than this model's max batch size 64" in response.json()["error"]


def test_a_small_picture_is_answered_or_refused_within_2_s_while_large_ones_are_sent(server: Server) -> None:
    """Six requests of 65 four-megapixel PNGs each (over the 64 rows a batch takes) and eight of one
    49-megapixel picture, all in flight: a one-picture request is answered, or told to retry, within 2 s.
    The 65-picture ones are refused before any picture is decoded; the 49-megapixel ones take turns on
    the version's decoding slots, and a request that finds them busy gets 503 + Retry-After."""

    def gradient(side: int) -> str:
        ramp = np.linspace(0, 255, side, dtype=np.float32)
        out = io.BytesIO()
        Image.fromarray((np.add.outer(ramp, ramp) / 2).astype(np.uint8), "L").save(out, format="PNG")  # no JPEG draft
        return b64(out.getvalue())

    medium, huge = gradient(2000), gradient(7000)
    rows = {"name": "input", "datatype": "BYTES", "shape": [65], "data": [medium] * 65}
    large = {"name": "input", "datatype": "BYTES", "shape": [1], "data": [huge]}
    small = {"name": "input", "datatype": "BYTES", "shape": [1], "data": [b64(digit_png(0, 8))]}
    with ThreadPoolExecutor(14) as pool:
        too_many = [pool.submit(v2_infer, server, "digits", rows) for _ in range(6)]
        heavy = [pool.submit(v2_infer, server, "digits", large) for _ in range(8)]
        time.sleep(0.5)  # all of them are in flight
        started = time.perf_counter()
        answer = v2_infer(server, "digits", small)
        took = time.perf_counter() - started
        refused = [f.result() for f in too_many]
        statuses = sorted(f.result().status_code for f in heavy)
    assert took < 2.0, (took, answer.status_code)
    assert answer.status_code in (200, 503), answer.text
    if answer.status_code == 503:
        assert answer.headers["retry-after"] and "decoded at capacity" in answer.json()["error"]
    assert all(r.status_code == 400 and "more than this model's max batch size" in r.text for r in refused)
    assert set(statuses) <= {200, 503} and 200 in statuses, statuses  # some ran, the rest were told to retry


def _in_process(tmp_path: Path) -> tuple[Any, dict, dict]:
    """The digits model's picture conversion, its input's spec and a one-picture request, in process."""
    from pipeline.artifact.directory import Artifact
    from pipeline.serve import images
    from pipeline.serve.protocols.datatypes import IOSpec

    repo = tmp_path / "artifacts"
    record(repo, "digits", digits_classifier(), "NCHW", {"image": DIGITS_RECORD})
    served = images.ServedImages.of(Artifact.load(repo / "digits" / "1").manifest)
    specs = {"input": IOSpec("input", "FP32", (-1, 1, 8, 8))}
    return served, specs, {"input": np.array([digit_png(0, 8)], dtype=object)}


def _batcher(**settings: Any) -> Any:
    """A real batcher over a model that is never reached: these requests are refused before the queue."""
    from concurrent.futures import ThreadPoolExecutor

    from pipeline.serve.batching import Batcher, BatchSettings
    from pipeline.serve.metrics import Metrics

    return Batcher(lambda feeds: feeds, True, BatchSettings(**settings), ThreadPoolExecutor(1), Metrics().model("m", 1))


def test_a_request_that_finds_every_decoding_slot_busy_gets_503_after_the_short_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In process, with the slots held: the deterministic half of the load test above."""
    import asyncio

    from pipeline.serve import images
    from pipeline.serve.errors import Unavailable

    served, specs, feeds = _in_process(tmp_path)
    monkeypatch.setattr(images, "DECODE_WAIT_S", 0.05)

    async def scenario() -> tuple[str, tuple[int, ...]]:
        queue, now = _batcher(), asyncio.get_running_loop().time()
        for _ in range(images.DECODE_SLOTS):  # every slot taken, as by large pictures decoding
            await served.slots.acquire()
        try:
            await served.converted(feeds, specs, queue, now)
        except Unavailable as exc:
            refused = f"{exc.status} {exc.headers.get('retry-after')} {exc}"
        for _ in range(images.DECODE_SLOTS):
            served.slots.release()
        converted, _ = await served.converted(feeds, specs, queue, now)  # a free slot: decoded
        return refused, converted["input"].shape

    refused, shape = asyncio.run(scenario())
    assert refused.startswith("503 1 ") and "decoded at capacity" in refused, refused
    assert shape == (1, 1, 8, 8)


def test_decoding_counts_against_the_queue_bound_and_the_request_timeout(tmp_path: Path) -> None:
    """A request whose pictures are decoding holds a place in the model's queue (--max-queue), and the
    time it spent waiting to decode is taken from its --timeout: neither is a way around the bounds."""
    import asyncio

    from pipeline.serve import images
    from pipeline.serve.errors import Unavailable

    served, specs, feeds = _in_process(tmp_path)
    tensor = np.zeros((1, 1, 8, 8), np.float32)

    async def scenario() -> list[str]:
        answers = []
        queue = _batcher(max_queue=1, timeout_s=0.3)
        loop = asyncio.get_running_loop()
        for _ in range(images.DECODE_SLOTS):  # the slots busy: this request waits to decode, in the queue
            await served.slots.acquire()
        waiting = asyncio.ensure_future(served.converted(feeds, specs, queue, loop.time()))
        await asyncio.sleep(0.05)
        try:  # a second request, a plain tensor: the queue's one place is taken by the decoding one
            await queue.infer({"input": tensor}, 1, loop.time())
        except Unavailable as exc:
            answers.append(f"second: {exc}")
        try:  # the first: its 0.3 s timeout runs out while it waits for a slot (DECODE_WAIT_S is 1 s)
            await waiting
        except Unavailable as exc:
            answers.append(f"first after {loop.time() - started:.2f}s: {exc}")
        for _ in range(images.DECODE_SLOTS):
            served.slots.release()
        try:  # a request that arrived 0.5 s ago is past its timeout before it reaches the queue
            await served.converted(feeds, specs, queue, loop.time() - 0.5)
        except Unavailable as exc:
            answers.append(f"late: {exc}")
        return answers

    started = 0.0

    async def timed() -> list[str]:
        nonlocal started
        started = asyncio.get_running_loop().time()
        return await scenario()

    second, first, late = asyncio.run(timed())
    assert second == "second: the queue for this model is full (1 requests); retry shortly"
    assert first.startswith("first after 0.3") and "within the 0.3s timeout" in first, first
    assert "within the 0.3s timeout" in late, late
