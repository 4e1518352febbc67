"""Reads of a parameter or buffer that a pipeline stage's forward writes in place, made to read a copy
(`snapshot_written_state`, `runtime.pipeline.build`)."""
from __future__ import annotations

import torch

from ..tracer.graph import TracedGraph, alias_source, mutated_args, returns_written


def snapshot_written_state(gm: torch.fx.GraphModule, traced: TracedGraph) -> int:
    """Make each read of a parameter or buffer that the stage's forward writes in place (`mutated_state`: a
    per-block EMA teacher's `shadow.weight.mul_(m).add_(...)`) read a copy taken at that point; returns how many.

    A pipeline runs the forwards of several microbatches before their backwards, so the write of microbatch 1
    came between microbatch 0's read of the state (saved by `mm` for its backward) and that backward: every
    rank raised torch's "modified by an inplace operation ... is at version 4; expected version 2" (1f1b,
    interleaved_1f1b; round 13, r13b). One device with gradient accumulation runs each backward right after
    its forward and reads the values the copy holds, so the copies give its numbers. Writes (`mutated_args`)
    and the views / in-place results that carry a write stay on the state itself."""
    written = set(traced.mutated_state())
    alias: set[torch.fx.Node] = set()
    for node in gm.graph.find_nodes(op="placeholder"):
        info = traced.param_of_placeholder(node.name)
        if info is not None and info.fqn in written:
            alias.add(node)
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        if (alias_source(node) or (node.args[0] if returns_written(node) else None)) in alias:
            alias.add(node)  # the state itself under another name: writes through it reach the state
            continue
        writes = set(mutated_args(node))
        for i, arg in enumerate(node.args):
            if arg in alias and i not in writes:
                with gm.graph.inserting_before(node):
                    copy = gm.graph.call_function(torch.ops.aten.clone.default, (arg,))
                node.update_arg(i, copy)
                count += 1
    if count:
        gm.recompile()
    return count
