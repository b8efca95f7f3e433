"""Data sources and splits, on real bundled data and small files written inline."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline.core.errors import InputError
from pipeline.data import load_splits
from pipeline.data.make_tokens import main as make_tokens_main
from pipeline.data.splits import split_indices
from pipeline.recipe.schema import parse_recipe


def recipe(tmp_path: Path, data: dict, model: dict | None = None, **train: object):
    raw = {"name": "t", "model": model or {"arch": "mlp"}, "data": data, "train": train}
    return parse_recipe(raw, "test", tmp_path)


@pytest.mark.parametrize(
    ("source", "n", "features", "classes"),
    [("digits", 1797, 64, 10), ("iris", 150, 4, 3), ("wine", 178, 13, 3), ("breast_cancer", 569, 30, 2)],
)
def test_bundled_datasets_split_deterministically(tmp_path: Path, source: str, n: int, features: int, classes: int):
    splits = load_splits(recipe(tmp_path, {"source": source}))
    again = load_splits(recipe(tmp_path, {"source": source}))
    assert len(splits.train) + len(splits.val) + len(splits.test) == n
    assert splits.info.sample_shape == [features] and splits.info.num_classes == classes
    assert np.array_equal(splits.test.inputs["input"], again.test.inputs["input"])
    assert splits.fingerprint == again.fingerprint
    other_seed = load_splits(recipe(tmp_path, {"source": source}, seed=1))
    assert not np.array_equal(splits.test.inputs["input"], other_seed.test.inputs["input"])
    assert other_seed.fingerprint == splits.fingerprint  # same content, different split


def test_splits_are_disjoint_and_stats_come_from_train(tmp_path: Path) -> None:
    parts = split_indices(100, 0.15, 0.2, seed=3)
    assert [len(p) for p in parts] == [65, 15, 20]
    assert sorted(np.concatenate(parts).tolist()) == list(range(100))  # a partition: disjoint, complete
    splits = load_splits(recipe(tmp_path, {"source": "digits"}))
    x = splits.train.inputs["input"].astype(np.float64)
    assert np.allclose(splits.info.mean, x.mean(axis=0), atol=1e-4)
    std = x.std(axis=0)
    assert np.allclose(np.where(std < 1e-6, 1.0, std), splits.info.std, atol=1e-4)


def test_digits_as_image_gives_nchw(tmp_path: Path) -> None:
    splits = load_splits(recipe(tmp_path, {"source": "digits", "as_image": True}))
    assert splits.info.kind == "image" and splits.info.sample_shape == [1, 8, 8]
    assert splits.train.inputs["input"].shape[1:] == (1, 8, 8)
    assert len(splits.info.mean) == 1  # per channel


def test_csv_with_string_labels(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    lines = ["a,b,kind,c"] + [f"{rng.normal():.4f},{rng.normal():.4f},{['cat', 'dog'][i % 2]},{i}" for i in range(60)]
    (tmp_path / "d.csv").write_text("\n".join(lines) + "\n")
    splits = load_splits(recipe(tmp_path, {"source": "csv", "path": "d.csv", "label_column": "kind"}))
    assert splits.info.labels == ["cat", "dog"] and splits.info.sample_shape == [3]
    chosen = load_splits(
        recipe(tmp_path, {"source": "csv", "path": "d.csv", "label_column": "kind", "feature_columns": ["a", "c"]})
    )
    assert chosen.info.sample_shape == [2]


def test_csv_errors_name_the_problem(tmp_path: Path) -> None:
    (tmp_path / "d.csv").write_text("x,y\n1,0\nhello,1\n")
    with pytest.raises(InputError, match=r"label column 'label' is not in .*its columns are \['x', 'y'\]"):
        load_splits(recipe(tmp_path, {"source": "csv", "path": "d.csv", "label_column": "label"}))
    with pytest.raises(InputError, match=r"line 3: column 'x' holds 'hello', not a number"):
        load_splits(recipe(tmp_path, {"source": "csv", "path": "d.csv", "label_column": "y"}))
    with pytest.raises(InputError, match=r"data file .*missing.csv does not exist"):
        load_splits(recipe(tmp_path, {"source": "csv", "path": "missing.csv", "label_column": "y"}))


def test_csv_from_a_spreadsheet_byte_order_mark_and_blank_lines(tmp_path: Path) -> None:
    rows = "".join(f"{i % 2},{i}\n" for i in range(40))
    (tmp_path / "d.csv").write_bytes(b"\xef\xbb\xbflabel,a\n" + rows.encode() + b"\n\n")
    splits = load_splits(recipe(tmp_path, {"source": "csv", "path": "d.csv", "label_column": "label"}))
    assert splits.info.labels == ["0", "1"] and len(splits.train) + len(splits.val) + len(splits.test) == 40
    (tmp_path / "gap.csv").write_text("x,y\n1,0\n\nhello,1\n")
    with pytest.raises(InputError, match=r"line 4: column 'x' holds 'hello'"):  # lines counted as in an editor
        load_splits(recipe(tmp_path, {"source": "csv", "path": "gap.csv", "label_column": "y"}))
    (tmp_path / "latin.csv").write_bytes("a,label\n1,café\n".encode("latin-1"))
    with pytest.raises(InputError, match=r"latin.csv is not UTF-8 text .*save the CSV as UTF-8"):
        load_splits(recipe(tmp_path, {"source": "csv", "path": "latin.csv", "label_column": "label"}))


def test_npz_features_and_labels(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", X=rng.normal(size=(80, 5)), y=np.arange(80) % 4, labels=np.array(list("abcd")))
    splits = load_splits(recipe(tmp_path, {"source": "npz", "path": "d.npz"}))
    assert splits.info.labels == list("abcd") and splits.train.inputs["input"].dtype == np.float32
    np.savez(tmp_path / "bad.npz", features=np.zeros((4, 2)), y=np.zeros(4))
    with pytest.raises(InputError, match=r"lacks array\(s\) \['X'\]; it holds \['features', 'y'\]"):
        load_splits(recipe(tmp_path, {"source": "npz", "path": "bad.npz"}))
    np.savez(tmp_path / "empty.npz", X=np.zeros((0, 2)), y=np.zeros(0, dtype=int), labels=np.array(["a", "b"]))
    with pytest.raises(InputError, match=r"array\(s\) \['X', 'y'\] hold no samples"):
        load_splits(recipe(tmp_path, {"source": "npz", "path": "empty.npz"}))


def test_a_truncated_or_corrupt_npz_is_an_input_error_naming_the_file(tmp_path: Path) -> None:
    from pipeline.data.sources import load_npz

    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", X=rng.normal(size=(80, 5)), y=np.arange(80) % 4)
    whole = (tmp_path / "d.npz").read_bytes()
    np.savez_compressed(tmp_path / "z.npz", X=rng.normal(size=(80, 5)), y=np.arange(80) % 4)
    squeezed = bytearray((tmp_path / "z.npz").read_bytes())
    squeezed[60:110] = b"\x13" * 50  # inside the first member's deflated data: zlib's error
    broken = {
        "cut.npz": whole[:100],  # a copy or download that stopped early: zipfile's BadZipFile
        "nothing.npz": b"",  # numpy's EOFError
        "squeezed.npz": bytes(squeezed),
    }
    for name, content in broken.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(InputError, match=rf"{name} is not a readable .npz file .*write it with numpy.savez"):
            load_npz(tmp_path / name)
    with pytest.raises(InputError, match=r"cut.npz is not a readable .npz file"):
        load_splits(recipe(tmp_path, {"source": "npz", "path": "cut.npz"}))
    np.save(tmp_path / "lone.npy", np.zeros((4, 2)))  # np.load gives an array, not named arrays
    with pytest.raises(InputError, match=r"lone.npy holds a single unnamed array \(.npy\), not an .npz"):
        load_npz(tmp_path / "lone.npy")


def test_image_folder(tmp_path: Path) -> None:
    from PIL import Image

    rng = np.random.default_rng(0)
    for cls, base in (("dark", 30), ("light", 220)):
        (tmp_path / "imgs" / cls).mkdir(parents=True)
        for i in range(12):
            pixels = np.clip(base + rng.normal(0, 10, size=(10, 12, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(tmp_path / "imgs" / cls / f"{i}.png")
    (tmp_path / "imgs" / "light" / "._0.png").write_bytes(b"macOS metadata")  # hidden: not an image
    (tmp_path / "imgs" / ".ipynb_checkpoints").mkdir()  # hidden: not a class
    splits = load_splits(recipe(tmp_path, {"source": "images", "path": "imgs", "image_size": [8, 6]}))
    assert splits.info.kind == "image" and splits.info.sample_shape == [3, 8, 6]
    assert splits.info.labels == ["dark", "light"]
    x = splits.train.inputs["input"]
    assert 0.0 <= x.min() and x.max() <= 1.0


def test_tokens_generator_is_deterministic_and_loads(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    make_tokens_main([str(tmp_path / "a.npz"), "--samples", "300"])
    make_tokens_main([str(tmp_path / "b.npz"), "--samples", "300"])
    assert (tmp_path / "a.npz").read_bytes() == (tmp_path / "b.npz").read_bytes()
    splits = load_splits(recipe(tmp_path, {"source": "tokens", "path": "a.npz"}, {"arch": "transformer"}))
    tokens = splits.train.inputs["tokens"]
    assert tokens.dtype == np.int64 and tokens.shape[1] == 32 and splits.info.vocab_size <= 64
    assert splits.info.mean is None  # token ids are never normalized
    assert splits.info.labels == ["none", "a", "b", "both"]


def test_committed_tokens_file_matches_its_generator(tmp_path: Path) -> None:
    committed = Path(__file__).resolve().parents[2] / "models" / "data" / "tokens.npz"
    make_tokens_main([str(tmp_path / "t.npz")])
    assert (tmp_path / "t.npz").read_bytes() == committed.read_bytes()


def test_too_small_dataset_is_refused(tmp_path: Path) -> None:
    np.savez(tmp_path / "d.npz", X=np.zeros((3, 2)), y=np.array([0, 1, 0]))
    with pytest.raises(InputError, match="too few for a train/val/test split"):
        load_splits(recipe(tmp_path, {"source": "npz", "path": "d.npz"}))
