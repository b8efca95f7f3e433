"""Operator/opset diagnostics: name the operator a chosen opset lacks and the opset that has it.

Exporters report this badly: the TorchScript exporter names the aten op, and the dynamo exporter,
asked for an opset older than 18, silently keeps 18 when it cannot convert down. Both cases become
one message here: the ONNX operator, the requested opset, and the first opset that defines it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import onnx
import onnx.defs

DEFAULT_DOMAINS = ("", "ai.onnx")


@dataclass(frozen=True)
class OpsetGap:
    """An operator the graph uses that `opset` does not define; it first appears in `since`."""

    op_type: str
    opset: int
    since: int | None  # None: no ONNX opset defines it (a custom or misspelled op)

    def __str__(self) -> str:
        if self.since is None:
            return f"operator {self.op_type} is not defined in any ONNX opset (custom domain or misspelled)"
        return f"operator {self.op_type} is not in ONNX opset {self.opset}; it first appears in opset {self.since}"


def first_opset(op_type: str, domain: str = "") -> int | None:
    """The first opset version that defines `op_type`, or None when ONNX has no such operator."""
    versions = [
        s.since_version for s in onnx.defs.get_all_schemas_with_history() if s.name == op_type and s.domain == domain
    ]
    return min(versions) if versions else None


def default_opset(model: onnx.ModelProto) -> int | None:
    """The model's opset for the default ONNX domain."""
    for entry in model.opset_import:
        if entry.domain in DEFAULT_DOMAINS:
            return entry.version
    return None


def _graph_ops(graph: onnx.GraphProto) -> set[str]:
    """Default-domain operator types in a graph and its subgraphs (If/Loop/Scan bodies)."""
    ops: set[str] = set()
    for node in graph.node:
        if node.domain in DEFAULT_DOMAINS:
            ops.add(node.op_type)
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                ops |= _graph_ops(attr.g)
            for sub in attr.graphs:
                ops |= _graph_ops(sub)
    return ops


def missing_operators(model: onnx.ModelProto, opset: int) -> list[OpsetGap]:
    """Every default-domain operator in `model` that ONNX opset `opset` does not define."""
    gaps = []
    for op in sorted(_graph_ops(model.graph)):
        try:
            onnx.defs.get_schema(op, opset, "")
        except onnx.defs.SchemaError:
            gaps.append(OpsetGap(op, opset, first_opset(op)))
    return gaps


def opset_advice(gaps: list[OpsetGap], requested: int, fix: str = "choose --opset {opset} or later") -> str:
    """One message for every gap, with `fix` naming the smallest opset that has them all."""
    lines = [str(g) for g in gaps]
    needed = max((g.since for g in gaps if g.since is not None), default=None)
    fix = "; " + fix.format(opset=needed) if needed is not None and needed > requested else ""
    return f"the model needs operators ONNX opset {requested} lacks{fix}:\n  " + "\n  ".join(lines)


_TORCHSCRIPT_UNSUPPORTED = re.compile(
    r"operator '(?P<aten>[\w:.]+)' to ONNX opset version (?P<opset>\d+) is not supported"
    r"(?:\. Support for this operator was added in version (?P<since>\d+))?"
)


# torch's message when an index (a token id) is past an nn.Embedding's rows, raised by both exporters while they
# run the model on the example inputs: the data is wrong, not the model's code
_INDEX_PAST_TABLE = "index out of range in self"


def explain_exporter_error(message: str) -> str | None:
    """Rewrite an exporter failure whose cause is known in our terms: 'operator X not supported at opset N',
    or an example input indexing past a table (a token id past the embedding), if it is one of them."""
    if _INDEX_PAST_TABLE in message:
        return (
            f"the model failed on its example inputs ({_INDEX_PAST_TABLE}): an input indexes past a table, most "
            "often a token id at or past the embedding's rows; the data's ids must be below the model's vocab_size "
            "(set model.vocab_size above the largest id, or re-tokenize the data with the model's tokenizer)"
        )
    found = _TORCHSCRIPT_UNSUPPORTED.search(message)
    if not found:
        return None
    text = f"operator {found['aten']} cannot be exported at ONNX opset {found['opset']}"
    if found["since"]:
        return f"{text}; it is supported from opset {found['since']}: choose --opset {found['since']} or later"
    return f"{text}; no opset supports it in this exporter: rewrite that part of the model"
