from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pipeline.core.errors import RecipeError
from pipeline.recipe.architectures import CNNSpec, CustomSpec
from pipeline.recipe.file import load_recipe
from pipeline.recipe.schema import parse_recipe

MODELS = Path(__file__).resolve().parent.parent / "models"
EXAMPLES = sorted(MODELS.glob("*.yaml"))

BASE = {"name": "t", "model": {"arch": "mlp"}, "data": {"source": "digits"}}


def with_changes(**sections: dict) -> dict:
    recipe = {k: dict(v) if isinstance(v, dict) else v for k, v in BASE.items()}
    for key, value in sections.items():
        recipe[key] = {**recipe.get(key, {}), **value}
    return recipe


def test_examples_exist_for_each_zoo_family() -> None:
    archs = {yaml.safe_load(p.read_text())["model"]["arch"] for p in EXAMPLES}
    assert {"mlp", "cnn", "transformer", "moe"} <= archs


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_recipe_validates(path: Path) -> None:
    recipe = load_recipe(path)
    assert recipe.name == path.stem
    assert len(recipe.digest) == 64
    assert recipe.base_dir == path.parent


def test_defaults_fill_the_sections() -> None:
    recipe = parse_recipe(BASE)
    assert recipe.train.optimizer == "adamw"
    assert recipe.export.opset == 18


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (with_changes(train={"epochz": 3}), "train.epochz: unknown key"),
        (with_changes(train={"epochs": "many"}), "train.epochs: Input should be a valid integer"),
        (
            with_changes(train={"optimizer": "adam"}),
            "train.optimizer: Input should be 'adamw' or 'sgd' (got 'adam')",
        ),
        (
            with_changes(model={"arch": "mlp", "hidden": [64, "wide"]}),
            "model.hidden[1]: Input should be a valid integer",
        ),
        (with_changes(model={"arch": "cnn", "chanels": [8]}), "model.chanels: unknown key"),
        (
            with_changes(model={"arch": "resnet"}),
            "model: Input tag 'resnet' found using 'arch' does not match",
        ),
        (with_changes(data={"source": "csv"}), "data: source 'csv' reads a file: set data.path"),
        (with_changes(data={"source": "parquet"}), "data.source: Input should be"),
        (
            with_changes(data={"source": "images", "path": "imgs", "image_size": [8]}),
            "data.image_size: List should have at least 2 items after validation, not 1",
        ),
        (
            with_changes(data={"source": "iris", "as_image": True}),
            "data: data.as_image applies to the digits dataset only (source is 'iris'); remove it",
        ),
        ({**BASE, "trainn": {}}, "trainn: unknown key"),
        ({"model": {"arch": "mlp"}, "data": {"source": "digits"}}, "name: Field required"),
        (
            with_changes(model={"arch": "transformer", "d_model": 30, "heads": 4}),
            "must be divisible by heads",
        ),
    ],
)
def test_errors_name_the_key_path(raw: dict, expected: str) -> None:
    with pytest.raises(RecipeError) as err:
        parse_recipe(raw, "r.yaml")
    assert expected in str(err.value)
    assert str(err.value).startswith("recipe r.yaml is invalid")


def test_every_problem_is_listed_at_once() -> None:
    with pytest.raises(RecipeError) as err:
        parse_recipe(with_changes(train={"epochs": -1, "lr": 0}))
    assert "train.epochs" in str(err.value) and "train.lr" in str(err.value)


def test_custom_factory_must_look_like_module_colon_function() -> None:
    ok = parse_recipe(with_changes(model={"arch": "custom", "factory": "mypkg.nets:build", "kwargs": {"w": 3}}))
    assert isinstance(ok.model, CustomSpec) and ok.model.kwargs == {"w": 3}
    with pytest.raises(RecipeError, match=r"model\.factory: String should match pattern"):
        parse_recipe(with_changes(model={"arch": "custom", "factory": "mypkg.nets.build"}))


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match="not found"):
        load_recipe(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(RecipeError, match="not valid YAML"):
        load_recipe(bad)
    bad.write_text("name: a\n\tmodel: {arch: mlp}\n")  # a tab: yaml's message spans four lines with a caret
    with pytest.raises(RecipeError, match="not valid YAML") as caught:
        load_recipe(bad)
    assert "\n" not in str(caught.value) and "line 2, column 1: found character '\\t'" in str(caught.value)
    bad.write_text("name: a\nmodel: " + "[" * 5000 + "]" * 5000 + "\n")  # was a RecursionError, exit 3
    with pytest.raises(RecipeError, match="not valid YAML: nested more than"):
        load_recipe(bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("just a string\n")
    with pytest.raises(RecipeError, match="must be a mapping"):
        load_recipe(scalar)


def test_data_path_resolves_against_the_recipe(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(with_changes(data={"source": "npz", "path": "d/x.npz"})))
    assert load_recipe(path).data_path() == tmp_path / "d" / "x.npz"


def test_cnn_spec_is_frozen() -> None:
    spec = CNNSpec(arch="cnn")
    with pytest.raises(Exception, match="frozen"):
        spec.hidden = 3  # type: ignore[misc]
