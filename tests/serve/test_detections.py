"""Detections served: a YOLOv8-layout detector imported with no flags (task, labels, size and letterbox from
its Ultralytics metadata) and served real pictures of other sizes than its 320x320 answers boxes in the
pictures' pixels that match a reference decoding written plainly with Pillow, numpy and onnxruntime
(tests/export/real_models.py `reference_detections`: letterbox by hand, decode, NMS, boxes mapped back),
each matched box at IoU >= 0.99: through tritonclient (binary), V2 JSON and TF Serving JSON. Raw tensors
stay the default; a tensor sent as such gets boxes in input pixels; every bad request is a 400.
"""

from __future__ import annotations

import base64
import itertools
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as triton
from click.testing import CliRunner
from PIL import Image

from pipeline.cli import main
from tests.export.real_models import (
    SHAPE_CLASSES,
    colour_detector,
    letterboxed,
    plain_decode,
    plain_iou,
    reference_detections,
    shapes_picture,
)
from tests.serve.serve_models import mlp, write_artifact
from tests.serve.serve_process import Server, start_server

LABELS = list(SHAPE_CLASSES)
PICTURES = {"wide.png": ((403, 211), 1), "tall.jpg": ((180, 300), 2), "square.png": ((256, 256), 3)}
OUTPUTS = ("boxes", "scores", "classes", "labels", "count")


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The detector imported with its pictures as eval data (no flags), and a classifier beside it."""
    root = tmp_path_factory.mktemp("detections")
    colour_detector(root / "colour.onnx")
    (root / "pictures").mkdir()
    for name, (size, seed) in PICTURES.items():
        shapes_picture(size, seed).save(root / "pictures" / name)
    result = CliRunner().invoke(
        main, ["import", str(root / "colour.onnx"), "--name", "shapes", "--eval-data", str(root / "pictures"),
               "--repository", str(root / "repo")],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "task: detection (metadata_props['task'] = 'detect' (Ultralytics))" in result.output
    write_artifact(root / "repo", "mlp", 1, mlp([4, 8, 3], seed=1))
    return root


@pytest.fixture(scope="module")
def server(made: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = start_server([made / "repo"], tmp_path_factory.mktemp("log") / "serve.log", "--poll", "0")
    yield running
    running.stop()


def picture_bytes(made: Path, name: str) -> bytes:
    return (made / "pictures" / name).read_bytes()


def reference(made: Path, name: str, **settings: float) -> list[tuple]:
    return reference_detections(made / "colour.onnx", Image.open(made / "pictures" / name), **settings)


def assert_matches(boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray, want: list[tuple]) -> None:
    """The served boxes are the reference's: as many, the same scores, each reference box matched by one of
    its class at IoU >= 0.99."""
    assert len(boxes) == len(scores) == len(classes) == len(want) > 0
    np.testing.assert_allclose(scores, [score for _, score, _ in want], rtol=1e-4)
    for cls, _, box in want:
        same = [i for i in range(len(boxes)) if classes[i] == cls]
        assert same, f"no served box of class {cls}"
        best = max(plain_iou(box, boxes[i].tolist()) for i in same)
        assert best >= 0.99, (best, box)


def v2_pictures(made: Path, names: list[str]) -> dict:
    data = [base64.b64encode(picture_bytes(made, n)).decode() for n in names]
    return {"inputs": [{"name": "images", "datatype": "BYTES", "shape": [len(names)], "data": data}]}


def tf_pictures(made: Path, names: list[str]) -> dict:
    return {"instances": [{"b64": base64.b64encode(picture_bytes(made, n)).decode()} for n in names]}


def test_tritonclient_binary_gets_boxes_in_the_pictures_pixels(made: Path, server: Server) -> None:
    names = list(PICTURES)
    pictures = np.array([picture_bytes(made, n) for n in names], dtype=object)
    with triton.InferenceServerClient(server.address) as client:
        tensor = triton.InferInput("images", [len(names)], "BYTES")
        tensor.set_data_from_numpy(pictures, binary_data=True)
        asked = [triton.InferRequestedOutput(name, binary_data=True) for name in OUTPUTS]
        result = client.infer("shapes", [tensor], outputs=asked, parameters={"detections": True})
    assert result.get_response()["parameters"] == {"coordinates": "picture"}
    boxes, scores, classes = result.as_numpy("boxes"), result.as_numpy("scores"), result.as_numpy("classes")
    labels, count = result.as_numpy("labels"), result.as_numpy("count")
    most = int(count.max())
    assert boxes.shape == (3, most, 4) and boxes.dtype == np.float32
    assert scores.shape == classes.shape == labels.shape == (3, most) and classes.dtype == np.int64
    assert len(set(count.tolist())) > 1  # pictures with different numbers of boxes: padding is exercised
    for i, name in enumerate(names):
        n = int(count[i])
        assert_matches(boxes[i, :n], scores[i, :n], classes[i, :n], reference(made, name))
        assert [label.decode() for label in labels[i, :n]] == [LABELS[c] for c in classes[i, :n]]
        assert (classes[i, n:] == -1).all() and (scores[i, n:] == 0).all() and (boxes[i, n:] == 0).all()
        assert all(label == b"" for label in labels[i, n:])
        width, height = PICTURES[name][0]  # inside the picture, not the 320x320 input
        assert boxes[i, :n, 0::2].max() <= width and boxes[i, :n, 1::2].max() <= height
    # the letterbox mattered: in the model's input pixels the same boxes lie elsewhere
    sample, _, _ = letterboxed(Image.open(made / "pictures" / names[0]))
    head = ort.InferenceSession(str(made / "colour.onnx")).run(None, {"images": sample[np.newaxis]})[0]
    unmapped = np.array([box for _, _, box in plain_decode(head[0], 0.25, 0.7, 300)])
    n = int(count[0])
    assert unmapped.shape == boxes[0, :n].shape and np.abs(unmapped - boxes[0, :n]).max() > 20


def test_tf_serving_json_answers_each_picture_its_boxes(made: Path, server: Server) -> None:
    names = ["wide.png", "tall.jpg"]
    answer = httpx.post(f"{server.url}/v1/models/shapes:predict", json={**tf_pictures(made, names), "detections": True})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["coordinates"] == "picture" and len(body["predictions"]) == 2
    for found, name in zip(body["predictions"], names, strict=True):
        assert set(found) == {"boxes", "scores", "classes", "labels"}
        assert_matches(np.array(found["boxes"]), np.array(found["scores"]), np.array(found["classes"]),
                       reference(made, name))  # fmt: skip
        assert found["labels"] == [LABELS[c] for c in found["classes"]]
    columnar = httpx.post(f"{server.url}/v1/models/shapes:predict",
                          json={"inputs": tf_pictures(made, names)["instances"], "detections": True})  # fmt: skip
    assert columnar.status_code == 200, columnar.text
    outputs = columnar.json()["outputs"]
    assert outputs["boxes"] == [found["boxes"] for found in body["predictions"]]
    assert outputs["labels"] == [found["labels"] for found in body["predictions"]]


def test_v2_json_equals_binary_and_raw_tensors_stay_the_default(made: Path, server: Server) -> None:
    names = ["square.png", "tall.jpg"]
    url = f"{server.url}/v2/models/shapes/infer"
    plain = httpx.post(url, json=v2_pictures(made, names))
    assert plain.status_code == 200
    (raw,) = plain.json()["outputs"]
    assert raw["name"] == "output0" and raw["shape"] == [2, 7, 2100] and "parameters" not in plain.json()

    answer = httpx.post(url, json={**v2_pictures(made, names), "parameters": {"detections": True}}).json()
    outputs = {o["name"]: o for o in answer["outputs"]}
    assert list(outputs) == list(OUTPUTS) and answer["parameters"] == {"coordinates": "picture"}
    count = outputs["count"]["data"]
    boxes = np.array(outputs["boxes"]["data"], np.float32).reshape(outputs["boxes"]["shape"])
    scores = np.array(outputs["scores"]["data"]).reshape(outputs["scores"]["shape"])
    classes = np.array(outputs["classes"]["data"]).reshape(outputs["classes"]["shape"])
    for i, name in enumerate(names):
        assert_matches(boxes[i, : count[i]], scores[i, : count[i]], classes[i, : count[i]], reference(made, name))
    assert outputs["labels"]["datatype"] == "BYTES" and outputs["classes"]["datatype"] == "INT64"

    both = httpx.post(url, json={**v2_pictures(made, names), "parameters": {"detections": True},
                                 "outputs": [{"name": "count"}, {"name": "output0"}]}).json()  # fmt: skip
    assert [o["name"] for o in both["outputs"]] == ["count", "output0"]
    assert both["outputs"][0]["data"] == count and both["outputs"][1]["shape"] == [2, 7, 2100]


def test_a_tensor_sent_as_such_gets_boxes_in_input_pixels(made: Path, server: Server) -> None:
    sample, _, _ = letterboxed(Image.open(made / "pictures" / "wide.png"))
    with triton.InferenceServerClient(server.address) as client:
        tensor = triton.InferInput("images", [1, 3, 320, 320], "FP32")
        tensor.set_data_from_numpy(sample[np.newaxis], binary_data=True)
        result = client.infer("shapes", [tensor], parameters={"detections": True})
        head = client.infer("shapes", [tensor]).as_numpy("output0")
    assert result.get_response()["parameters"] == {"coordinates": "input"}
    want = plain_decode(head[0], 0.25, 0.7, 300)
    n = int(result.as_numpy("count")[0])
    assert_matches(result.as_numpy("boxes")[0, :n], result.as_numpy("scores")[0, :n],
                   result.as_numpy("classes")[0, :n], want)  # fmt: skip


def test_requests_override_the_recorded_settings(made: Path, server: Server) -> None:
    url = f"{server.url}/v1/models/shapes:predict"

    def found(**settings: object) -> dict:
        answer = httpx.post(url, json={**tf_pictures(made, ["wide.png"]), "detections": True, **settings})
        assert answer.status_code == 200, answer.text
        return answer.json()["predictions"][0]

    default = found()
    assert len(found(max_detections=1)["boxes"]) == 1 and found(max_detections=1)["boxes"][0] == default["boxes"][0]
    sure = found(confidence=0.9)
    assert 0 < len(sure["scores"]) < len(default["scores"]) and min(sure["scores"]) > 0.9
    assert_matches(np.array(sure["boxes"]), np.array(sure["scores"]), np.array(sure["classes"]),
                   reference(made, "wide.png", confidence=0.9))  # fmt: skip
    strict = found(iou=0.0)  # no two boxes of one class may overlap at all
    assert len(strict["boxes"]) < len(default["boxes"])
    assert_matches(np.array(strict["boxes"]), np.array(strict["scores"]), np.array(strict["classes"]),
                   reference(made, "wide.png", iou=0.0))  # fmt: skip
    assert found(confidence=1)["boxes"] == []  # nothing scores above 1: an empty answer, not an error
    v2 = httpx.post(
        f"{server.url}/v2/models/shapes/infer",
        json={**v2_pictures(made, ["wide.png"]), "parameters": {"detections": True, "confidence": 1}},
    )
    outputs = {o["name"]: o for o in v2.json()["outputs"]}  # fmt: skip
    assert outputs["count"]["data"] == [0] and outputs["boxes"]["shape"] == [1, 0, 4]


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        ({"detections": "yes"}, 'detections must be true or false, got "yes"'),
        ({"detections": 1}, "detections must be true or false, got 1"),
        ({"detections": True, "confidence": 1.5}, "confidence must be a number from 0 to 1, got 1.5"),
        ({"detections": True, "confidence": -0.1}, "confidence must be a number from 0 to 1"),
        ({"detections": True, "confidence": "0.5"}, 'confidence must be a number from 0 to 1, got "0.5"'),
        ({"detections": True, "iou": True}, "iou must be a number from 0 to 1, got true"),
        ({"detections": True, "iou": None}, "iou must be a number from 0 to 1, got null"),
        ({"detections": True, "max_detections": 0}, "max_detections must be a whole number from 1 to 100000"),
        ({"detections": True, "max_detections": 2.5}, "max_detections must be a whole number"),
        ({"detections": True, "max_detections": 10**12}, "max_detections must be a whole number"),
        ({"confidence": 0.3}, "confidence set how detections are decoded, and the request asks for none"),
        ({"detections": False, "iou": 0.3, "max_detections": 3}, "max_detections set how detections"),
    ],
)
def test_bad_settings_are_400s_naming_the_value(made: Path, server: Server, settings: dict, says: str) -> None:
    tf = httpx.post(f"{server.url}/v1/models/shapes:predict", json={**tf_pictures(made, ["square.png"]), **settings})
    assert tf.status_code == 400 and says in tf.json()["error"], tf.text
    v2 = httpx.post(f"{server.url}/v2/models/shapes/infer", json={**v2_pictures(made, ["square.png"]),
                                                                  "parameters": settings})  # fmt: skip
    assert v2.status_code == 400 and f"parameters.{says}" in v2.json()["error"], v2.text


def test_other_bad_requests_are_400s(made: Path, server: Server) -> None:
    v2 = f"{server.url}/v2/models/shapes/infer"
    pictures = v2_pictures(made, ["square.png"])
    cases = [
        (f"{server.url}/v2/models/mlp/infer",
         {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [0, 1, 2, 3]}],
          "parameters": {"detections": True}}, "model 'mlp' is a regression model; detections are answered by"),
        (f"{server.url}/v1/models/mlp:predict", {"instances": [[0, 1, 2, 3]], "detections": True},
         "model 'mlp' is a regression model"),
        (v2, {**pictures, "parameters": {"detections": True}, "outputs": [{"name": "box"}]},
         "unknown output(s) ['box']"),
        (v2, {**pictures, "parameters": {"detections": True, "probabilities": True}}, "a detections answer carries"),
        (v2, {**pictures, "parameters": {"detections": True},
              "outputs": [{"name": "scores", "parameters": {"classification": 2}}]}, "a detections answer carries"),
    ]  # fmt: skip
    for url, body, says in cases:
        answer = httpx.post(url, json=body)
        assert answer.status_code == 400 and says in answer.json()["error"], (body, answer.text)


def test_fuzzed_settings_never_make_a_server_error(made: Path, server: Server) -> None:
    """Every combination of odd values for the four settings: a 200 where they are valid, else a 400."""
    odd = [None, True, False, 0, 1, -1, 0.5, 1.0000001, 2**63, 1e308, "", "true", [], {}, [0.5], {"a": 1}]
    rng = np.random.default_rng(0)
    keys = ["detections", "confidence", "iou", "max_detections"]
    combos = [dict(zip(keys, values, strict=True)) for values in itertools.product(odd, repeat=4)]
    body = tf_pictures(made, ["square.png"])
    for index in rng.choice(len(combos), 60, replace=False):
        settings = {k: v for k, v in combos[index].items() if v is not None or rng.random() < 0.5}
        for url, request in ((f"{server.url}/v1/models/shapes:predict", {**body, **settings}),
                             (f"{server.url}/v2/models/shapes/infer", {**v2_pictures(made, ["square.png"]),
                                                                       "parameters": settings})):  # fmt: skip
            answer = httpx.post(url, json=request)
            assert answer.status_code in (200, 400), (settings, answer.status_code, answer.text)
            assert answer.status_code == 200 or "error" in answer.json()


def test_openapi_documents_the_detection_settings(server: Server) -> None:
    document = httpx.get(f"{server.url}/openapi.json").json()
    infer = document["paths"]["/v2/models/{model_name}/infer"]["post"]["requestBody"]["content"]["application/json"]
    parameters = infer["schema"]["properties"]["parameters"]["properties"]
    assert {"detections", "confidence", "iou", "max_detections"} <= set(parameters)
    predict = document["paths"]["/v1/models/{model_name}:predict"]["post"]["requestBody"]["content"]
    assert "detections" in predict["application/json"]["schema"]["properties"]
