"""Nodes put in topological order, what a subgraph reads from outside it counted: onnx's checker requires it.

Silero VAD's static int8 was refused by the checker: onnxruntime's pre-processing folded the `If` on its
pinned `sr` and inlined a branch after another `If` whose branches read that branch's output.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from pipeline.optimize.order import sort_nodes


def _branch(name: str, op: str) -> onnx.GraphProto:
    """A branch of an If that reads `late`, a value of the graph around it, and makes `out_<name>`."""
    out = helper.make_tensor_value_info(f"out_{name}", TensorProto.FLOAT, [2])
    return helper.make_graph([helper.make_node(op, ["late"], [f"out_{name}"])], name, [], [out])


def _model() -> onnx.ModelProto:
    """y = If(flag, then: Neg(late), else: Abs(late)), listed before the node that makes `late` = x + 1."""
    branchy = helper.make_node("If", ["flag"], ["y"], "branchy", then_branch=_branch("then", "Neg"),
                               else_branch=_branch("else", "Abs"))  # fmt: skip
    late = helper.make_node("Add", ["x", "one"], ["late"], "late")
    graph = helper.make_graph(
        [branchy, late], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
         helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_node_whose_subgraph_reads_a_later_value_is_moved_after_it() -> None:
    model = _model()
    with pytest.raises(onnx.checker.ValidationError, match="topologically sorted"):
        onnx.checker.check_model(model)
    sort_nodes(model.graph)
    onnx.checker.check_model(model)
    assert [n.name for n in model.graph.node] == ["late", "branchy"]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = session.run(None, {"x": np.array([1.0, -3.0], np.float32), "flag": np.array(True)})[0]
    assert got.tolist() == [-2.0, 2.0]


def test_a_sorted_graph_keeps_its_order_and_a_nested_graph_is_sorted_too() -> None:
    inner = _model()
    sort_nodes(inner.graph)
    before = [n.name for n in inner.graph.node]
    sort_nodes(inner.graph)
    assert [n.name for n in inner.graph.node] == before  # already in order: untouched
    # the same disorder one level down: an If whose then-branch holds the misordered pair
    nested = _model()
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    unsorted = helper.make_graph(list(nested.graph.node), "inner", [], [y],
                                 list(nested.graph.initializer))  # fmt: skip
    outer = helper.make_node("If", ["flag"], ["z"], "outer", then_branch=unsorted, else_branch=_branch("other", "Neg"))
    around = helper.make_graph([outer], "o", [], [])
    sort_nodes(around)
    then = next(a.g for a in around.node[0].attribute if a.name == "then_branch")
    assert [n.name for n in then.node] == ["late", "branchy"]
