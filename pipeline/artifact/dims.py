"""The dims of a model's tensors as a user gives them: `--input-shape NAME:d0,d1,...`, shared by
`pipe import` (the dims written into the imported graph) and `pipe export --target edge` (the dims an
edge model is converted at).

An int fixes a dim, a name names it (axes given one name are equal), `?` or `-1` leaves it as
declared. A real symbolic name (`batch`, `N`, `unk__12`) is told apart from the placeholders some
exporters write (`?`, `-1`, `None`, ``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from pipeline.artifact.tensors import TensorSpec
from pipeline.core.errors import InputError

FREE = "?"  # in --input-shape: leave this dim as declared
MAX_DIM = 2**31 - 1  # the largest dim --input-shape takes (protobuf holds int64; no real tensor is near this)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.:/-]*")
_NOT_NAMES = {"None", "null", "unk", "unknown"}  # placeholders some exporters write as if names
Shapes = dict[str, list[int | str]]


def is_dim_name(text: str) -> bool:
    """True for a real symbolic name (`batch`, `N`, `unk__12`); False for a placeholder (`?`, `-1`, ``)."""
    return bool(_NAME.fullmatch(text)) and text not in _NOT_NAMES


def parse_input_shapes(values: Iterable[str]) -> Shapes:
    """`--input-shape NAME:d0,d1,...` values (repeatable) as {input: dims}; `?` and `-1` become FREE.

    The name is everything before the last colon, so TensorFlow names like `input:0` work.
    """
    shapes: Shapes = {}
    for value in values:
        name, _, text = value.rpartition(":")
        usage = "give NAME:d0,d1,... e.g. x:1,3,48,192 (an int fixes a dim, a name names it, ? or -1 leaves it free)"
        if not name or not text:
            raise InputError(f"--input-shape {value!r} has no input name or no dims; {usage}")
        if name in shapes:
            raise InputError(f"--input-shape names input {name!r} twice; give each input once")
        dims: list[int | str] = []
        for token in (t.strip() for t in text.split(",")):
            if token in (FREE, "-1"):
                dims.append(FREE)
            elif token.isdigit() and int(token) > MAX_DIM:
                raise InputError(f"--input-shape {value!r}: dim {token!r} is larger than {MAX_DIM}; {usage}")
            elif token.isdigit() and int(token) > 0:
                dims.append(int(token))
            elif is_dim_name(token):
                dims.append(token)
            else:
                raise InputError(
                    f"--input-shape {value!r}: dim {token!r} is not a positive int, a name, ? or -1; {usage}"
                )
        shapes[name] = dims
    return shapes


def apply_input_shapes(given: Shapes, inputs: list[TensorSpec], outputs: list[TensorSpec]) -> None:
    """Fix or name the dims `given` by the user, wherever each dim's name appears (inputs and outputs).

    Refuses an unknown input, a wrong rank, a change to a dim the model fixes, and one dim given two
    different values.
    """
    by_name = {spec.name: spec for spec in inputs}
    chosen: dict[str, int | str] = {}  # symbolic dim -> the user's int or name
    for name, dims in given.items():
        spec = by_name.get(name)
        if spec is None:
            shown = ", ".join(f"{s.name}: {s.shape}" for s in inputs)
            raise InputError(f"--input-shape names {name!r}, which is not a model input; the inputs are {shown}")
        if len(dims) != len(spec.shape):
            raise InputError(
                f"--input-shape {name}: {len(dims)} dims given, but {name!r} has {len(spec.shape)}: {spec.shape}"
            )
        for axis, (declared, wanted) in enumerate(zip(spec.shape, dims, strict=True)):
            if wanted == FREE or wanted == declared:
                continue
            if isinstance(declared, int):
                raise InputError(
                    f"--input-shape {name}: axis {axis} is fixed at {declared} by the model, not {wanted}; "
                    f"give {declared} or ? there"
                )
            if chosen.setdefault(declared, wanted) != wanted:
                raise InputError(
                    f"--input-shape: dim {declared!r} is given as {chosen[declared]} and as {wanted}; "
                    "axes sharing a name are equal, so give them one value"
                )
    for spec in [*inputs, *outputs]:
        spec.shape = [chosen.get(d, d) if isinstance(d, str) else d for d in spec.shape]
