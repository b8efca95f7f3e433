"""Feature rows as people write them: objects keyed by column name, categories by their names.

A model trained on a table records its columns on the input (`TensorSpec.features`: names in input
order, and the categories of a string column, whose index the model takes). TF Serving's row form
may then send `{"instances": [{"alcohol": 13.2, "color": "red", ...}]}`; `feature_rows` turns that,
and a plain row naming a category in place of its index, into the numeric rows the model takes.
"""

from __future__ import annotations

from typing import Any

from pipeline.artifact.tensors import Feature
from pipeline.serve.errors import RequestError

SHOWN = 10  # category names quoted in an error


def is_keyed(instance: Any, input_name: str) -> bool:
    """An object of column values, not `{input: value}` nor TF Serving's `{"b64": ...}`."""
    return isinstance(instance, dict) and set(instance) != {input_name} and set(instance) != {"b64"}


def feature_rows(
    instances: list[Any], input_name: str, features: tuple[Feature, ...], key: str = "instances"
) -> list[Any]:
    """Keyed objects -> rows in the recorded column order, and category names -> their indices.

    Rows that are neither keyed nor lists pass unchanged: the tensor checks say what is wrong.
    """
    names = [f.name for f in features]
    rows = []
    for i, instance in enumerate(instances):
        if is_keyed(instance, input_name):
            missing = [n for n in names if n not in instance]
            unknown = sorted(str(k) for k in instance if k not in names)
            if missing or unknown:
                raise RequestError(
                    f"{key}[{i}]: "
                    + "; ".join(
                        part
                        for part in (
                            f"missing column(s) {missing[:SHOWN]}" if missing else "",
                            f"unknown column(s) {unknown[:SHOWN]}" if unknown else "",
                        )
                        if part
                    )
                    + f"; input {input_name!r} takes the columns {names}"
                )
            instance = [instance[n] for n in names]
        if isinstance(instance, list) and len(instance) == len(features):
            instance = [_coded(v, f, i) if f.categories else v for v, f in zip(instance, features, strict=True)]
        rows.append(instance)
    return rows


def feature_list(features: tuple[Feature, ...]) -> list[dict[str, Any]]:
    """A table input's columns as metadata shows them: `{"name"}`, or `{"name", "categories"}`."""
    return [
        {"name": f.name, **({"categories": list(f.categories)} if f.categories else {}),
         **({"unknown_index": f.unknown_index} if f.unknown_index is not None else {})}
        for f in features
    ]  # fmt: skip


def _coded(value: Any, feature: Feature, row: int) -> Any:
    """A categorical column's value: a category name, or its index 0..k-1."""
    categories = feature.categories or []
    if isinstance(value, str):
        if value in categories:
            return categories.index(value)
        if value.strip() in categories:
            return categories.index(value.strip())
    elif isinstance(value, int | float) and not isinstance(value, bool):
        if float(value).is_integer() and 0 <= value < len(categories):
            return value
    if feature.unknown_index is not None:  # data.unseen_categories: unknown
        return feature.unknown_index
    shown = categories[:SHOWN] + (["..."] if len(categories) > SHOWN else [])
    raise RequestError(
        f"instances[{row}]: column {feature.name!r} holds {value!r:.60}, not one of its categories {shown} "
        f"(or their index 0..{len(categories) - 1})"
    )
