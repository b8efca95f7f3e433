"""Nodes in topological order, subgraphs included: what onnx's checker requires of every graph.

A converter that appends or moves nodes can leave one before a node that makes its input: onnxruntime's
fp16 converter appends its input casts last, and its quantization pre-processing of Silero VAD (its
`sr` input pinned, so the `If` on it folds) inlined a branch after an `If` node whose subgraphs read
the inlined branch's output from the outer scope. The checker refuses either ("Nodes in a graph must be
topologically sorted"); onnxruntime runs both. `sort_nodes` puts every graph in order, counting what a
node's subgraphs read from outside them as the node's own inputs.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

import onnx


def sort_nodes(graph: onnx.GraphProto) -> None:
    """Reorder `graph.node`, and every subgraph's, so each node follows the nodes making its inputs, the ones its
    subgraphs read from this graph included; otherwise in their order. A cycle is left as it was."""
    for node in graph.node:
        for sub in _subgraphs(node):
            sort_nodes(sub)
    made_by = {name: i for i, node in enumerate(graph.node) for name in node.output if name}
    after: list[list[int]] = [[] for _ in graph.node]  # i -> the nodes that need an output of node i
    waiting = [0] * len(graph.node)
    for i, node in enumerate(graph.node):
        needs = {made_by[name] for name in (*node.input, *_outer_reads(node)) if name in made_by}
        needs.discard(i)
        waiting[i] = len(needs)
        for j in needs:
            after[j].append(i)
    ready = [i for i, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for j in after[i]:
            waiting[j] -= 1
            if waiting[j] == 0:
                heapq.heappush(ready, j)
    if len(order) < len(graph.node):  # a cycle: keep the rest in its order, for the checker to name
        placed = set(order)
        order += [i for i in range(len(graph.node)) if i not in placed]
    if order == list(range(len(graph.node))):
        return
    copies = [onnx.NodeProto.FromString(graph.node[i].SerializeToString()) for i in order]
    del graph.node[:]  # detaches the originals: the copies are put back
    graph.node.extend(copies)


def _subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield attr.g
        elif attr.type == onnx.AttributeProto.GRAPHS:
            yield from attr.graphs


def _outer_reads(node: onnx.NodeProto) -> set[str]:
    """The names `node`'s subgraphs (at any depth) read but do not make: values of the scopes around them."""
    reads: set[str] = set()
    for sub in _subgraphs(node):
        own = {v.name for v in (*sub.input, *sub.initializer)} | {o for n in sub.node for o in n.output}
        for inner in sub.node:
            reads.update(name for name in (*inner.input, *_outer_reads(inner)) if name and name not in own)
    return reads
