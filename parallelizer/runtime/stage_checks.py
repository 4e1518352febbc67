"""Checks of a stage cut before a pipeline is built (`runtime.pipeline.build`) or searched (`api.plan`): what
torch's pipelining runtime cannot run exactly on it is refused with a PipelineError naming the value, its
stages and a remedy."""
from __future__ import annotations

from ..errors import PipelineError
from ..tracer.graph import TracedGraph

SPLIT_BACKWARD = {"interleaved_zero_bubble", "zbv", "dualpipev"}  # torch runs input (I) and weight (W) backward apart


def uses_by_stage(traced: TracedGraph, fqn: str, cut) -> dict[int, list[str]]:
    """stage -> the nodes of `cut` (a `runtime.pipeline.StageCut`) that read parameter or buffer `fqn`."""
    out: dict[int, list[str]] = {}
    for u in traced.parameters[fqn].uses:
        if u in cut.stage_of:
            out.setdefault(cut.stage_of[u], []).append(u)
    return out


def check_buffer_copies(traced: TracedGraph, cut: StageCut) -> None:
    """Refuse a buffer (or parameter) updated in forward (`TracedGraph.mutated_state`) whose placeholder several
    stages use:
    each stage holds its own copy of the buffers it uses, so the update made by one stage never reaches the
    copy another stage reads (read in stage 0, updated in stage 1: stage 0 reads the initial value forever;
    one device keeps it once). A read AFTER the update uses the in-place op's result, an activation sent to
    the later stage like any other, so that case is exact and allowed. Parameters used by several stages are
    fine (their gradients are summed) unless forward writes them (a per-block EMA teacher): written values are
    not summed, so they count as buffers.

    Raises:
        PipelineError: names the buffer, its stages and the remedy.
    """
    for fqn, node in traced.mutated_state().items():
        stages = sorted(uses_by_stage(traced, fqn, cut))
        if len(stages) > 1:
            kind = "buffer" if traced.parameters[fqn].is_buffer else "parameter"
            raise PipelineError(f"{kind} {fqn!r} is updated in forward (node {node}) and used by stages {stages}: "
                                "each stage keeps its own copy, so the update would not reach the others. Remedy: "
                                "stage cuts that keep its uses in one stage, or a plan without 'pp'")


def check_split_backward(traced: TracedGraph, cut: StageCut, schedule: str) -> None:
    """Refuse a zero-bubble schedule (`SPLIT_BACKWARD`: torch's stage_backward_input, then
    stage_backward_weight from the saved intermediates) on a stage in which a trained parameter is read by
    two or more ops: torch's weight pass walks each parameter's uses separately, and when two such parameters
    share the path (a Linear applied to its own output: its weight and its split-off bias each used twice)
    the second walk finds the graph freed by the first, a RuntimeError from inside torch in the middle of
    a step; torch's pytorch#180952 reports the same split path double-counting a weight used twice on one
    path. Parameters used by several STAGES (tied weights) are fine (one use per stage, gradients summed).

    Raises:
        PipelineError: names the stage, the parameter, its uses and the remedy.
    """
    if schedule not in SPLIT_BACKWARD:
        return
    for fqn, p in traced.parameters.items():
        if not p.requires_grad:
            continue
        for k, uses in sorted(uses_by_stage(traced, fqn, cut).items()):
            if len(uses) > 1:
                raise PipelineError(
                    f"schedule {schedule!r} splits each stage's backward into an input pass and a weight pass "
                    f"(torch.distributed.pipelining), which is not exact when a trained parameter is read by "
                    f"several ops of one stage: {fqn!r} is read by {len(uses)} ops of stage {k} ({', '.join(uses)}; "
                    f"a module applied twice, or a weight reused in its own block). Remedy: schedule='1f1b', "
                    f"'interleaved_1f1b' or 'gpipe' (one backward pass), or a model that reads it once per stage")


def read_twice_by_a_stage(traced: TracedGraph) -> list[str]:
    """The trained parameters that `check_split_backward` may refuse for some stage cut: read by two ops anywhere,
    unless one read is before the first repeated block (always stage 0) and the other after the last (always
    the last stage), as a tied embedding and head are. Reads in two blocks count (the cut may put both blocks
    on one stage; e.g. ALBERT's one layer shared by every block). The search (`api.plan`) leaves the
    zero-bubble schedules out for such a model, so that it never picks a schedule the build refuses."""
    order = {name: i for i, name in enumerate(traced.nodes)}
    in_blocks = [order[n] for n, info in traced.nodes.items() if info.block is not None]
    first, last = (min(in_blocks), max(in_blocks)) if in_blocks else (len(order), -1)

    def where(u: str):
        return "pre" if order[u] < first else "post" if order[u] > last else "block"
    out = []
    for fqn, p in traced.parameters.items():
        places = sorted(where(u) for u in p.uses if u in traced.nodes)
        if p.requires_grad and len(places) > 1 and places != ["post", "pre"]:
            out.append(fqn)
    return out
