"""Predicted memory per pipeline rank of a pipeline `Plan` (issue 13 item 5): the ONE place that turns a
Plan with `Plan.pipeline` and its traced graph into bytes per rank, for `show`, benchmarks and the planner.

A pipeline Plan holds one intra-stage plan for the whole graph (`Plan.mesh`, `Plan.nodes`, `Plan.params`),
and `Plan.cost.memory_bytes` prices that plan as if one device held every stage. What a rank of pipeline rank
r holds at its peak (the runtime: `runtime.pipeline.build`, one `StageModule` per stage, each with its own
copy of the parameters and buffers it uses):

    params, grads, optimizer = sum over r's stages k of the training state of the parameters stage k uses,
                               local shards as the plan stores them (`Pricer.param_state_bytes`: bytes per
                               parameter by precision and optimizer, `cost_model.memory.BYTES_PER_PARAM`);
                               a parameter used by two stages (a tied embedding) counts in each
    buffers                  = sum over r's stages of the buffers they use (replicated)
    activations              = inflight(schedule, pp, microbatches, r) x sum over r's stages of A_k
    outputs                  = on the ranks of the last stage: one microbatch of the model's returned values
                               that the step reads (`runtime.pipeline.step_returns`: the model's own loss
                               alone when its first output is one), whole (`planner.problem.returned_bytes`:
                               the runtime gathers them over the mesh each microbatch and hands them to the loss)

with A_k the bytes stage k saves for backward for ONE microbatch (the traced batch): `Pricer.node_cost` of
every op of the stage under the plan's strategies, each storage charged once WITHIN the stage
(`cost_model.memory.saved_tensor_owners` on the stage's own graph, `runtime.pipeline.stage_graph`: a value
received from the previous stage is a new tensor on this rank, even if an earlier stage saved it too), and
inflight from `planner.schedules.inflight_microbatches` (GPipe: all microbatches; 1F1B: pp - r; Narayanan
et al. SC'21 Sec. 2.2). Where a rank holds its stages: `runtime.pipeline.stage_pp_rank` (looped, or a V for
zbv / dualpipev). BitPipe holds every stage twice (rank q and its mirror pp - 1 - q,
`runtime.bitpipe.stage_holders`), so its parameters, gradients and optimizer state count on both ranks, and
its activations are the peak over its action list (`planner.bitpipe`: a stage's forward adds A_k until its
backward) instead of an in-flight count, with the receive buffers its runner posts at the step's start, each held
until its action runs (`planner.bitpipe.held_with_posted_receives`; the local shapes and dtypes the runner allocates,
`runtime.pipeline._examples`; round 25, r25i). Not counted: the stage outputs and receive buffers torch's pipelining
keeps per microbatch, and transient buffers of sends and collectives.
"""
from __future__ import annotations

import math

from cost_model.memory import backward_nodes
from cost_model.topology import MeshTopology

from .config import PlanConfig
from .errors import PipelineError
from .planner.api import resolve_cluster
from .planner.bitpipe import bitpipe_actions, held_with_posted_receives
from .planner.costs import Pricer
from .planner.local_storage import local_saved_bytes, plan_choice
from .planner.problem import returned_bytes
from .planner.plan import Plan
from .planner.schedules import inflight_microbatches
from .planner.strategies import tensor_inputs
from .tracer import TracedGraph

__all__ = ["pipeline_rank_memory", "MEMORY_CATEGORIES"]

MEMORY_CATEGORIES = ("params", "grads", "optimizer", "activations", "outputs", "buffers")


def pipeline_rank_memory(plan: Plan, traced: TracedGraph) -> list[dict[str, int]]:
    """Bytes per device by category (`MEMORY_CATEGORIES`, plus "total") for each pipeline rank r = 0 .. pp-1
    (module docstring). A plan without a pipeline gives one entry: `plan.cost.memory_bytes`' categories.

    Args:
        plan: a Plan, pipeline or not (`parallelizer.plan`).
        traced: the graph the plan was made for (ONE microbatch for a pipeline plan).
    Raises:
        PipelineError: the plan's stage nodes are not the traced graph's (plan made for another model: re-plan).
    """
    if plan.pipeline is None:
        mem = {k: int(plan.cost.memory_bytes.get(k, 0)) for k in MEMORY_CATEGORIES}
        return [dict(mem, total=sum(mem.values()))]
    from .runtime.pipeline import cut_stages, stage_graph, stage_pp_rank  # the runtime builds the ranks' stages
    from .runtime.bitpipe import stage_holders as holders

    pipe = plan.pipeline
    cut = cut_stages(traced, len(pipe.stages), pipe.blocks_per_stage)
    for st in pipe.stages:
        if cut.stage_of.get(st.first_node) != st.stage or cut.stage_of.get(st.last_node) != st.stage:
            raise PipelineError(f"stage {st.stage} of the plan spans {st.first_node} .. {st.last_node}, which the "
                                "traced graph cuts elsewhere: the plan was made for another model; re-plan")
    mesh = plan.mesh
    topo = MeshTopology(resolve_cluster(None, mesh.world_size)[0], mesh.shape, mesh.axis_names)
    pricer = Pricer(topo, mesh, PlanConfig(precision=plan.config.get("precision"),
                                           optimizer=plan.config.get("optimizer", "adamw")), traced)
    trainable = [ph for p in traced.parameters.values() if not p.is_buffer and p.requires_grad
                 for ph in p.placeholders]
    live = backward_nodes(traced.graph_module, trainable)
    ranks = [dict.fromkeys(MEMORY_CATEGORIES, 0) for _ in range(pipe.pp)]
    acts = [0] * pipe.pp
    stage_act = []
    S = len(pipe.stages)
    for st in pipe.stages:
        tg = stage_graph(traced, cut, st.stage)
        for q in holders(pipe.schedule, st.stage, S, pipe.pp):
            mem = ranks[q]
            for fqn, p in tg.parameters.items():
                if p.is_buffer:
                    mem["buffers"] += p.nbytes
                    continue
                parts = pricer.param_state_bytes(math.prod(plan.params[fqn].local_shape), p.requires_grad)
                for key, b in zip(("params", "grads", "optimizer"), parts):
                    mem[key] += b
        # the stage's own graph: a received value is a placeholder, a new tensor on this rank (`local_storage`)
        act = sum(local_saved_bytes(tg, *plan_choice(tg, plan.nodes, live), pricer).values())
        acts[stage_pp_rank(pipe.schedule, st.stage, S, pipe.pp)] += act
        stage_act.append(act)
    returned = returned_bytes(tuple(ti for ti in tensor_inputs(traced, traced.nodes["output"])
                                    if ti.producer in cut.outputs[-1]), pricer, traced)
    for q in holders(pipe.schedule, S - 1, S, pipe.pp):
        ranks[q]["outputs"] = returned
    peaks = (_bitpipe_peaks(pipe.pp, pipe.microbatches, stage_act, *_boundary_bytes(plan, traced, cut))
             if pipe.schedule == "bitpipe" else None)
    for r, mem in enumerate(ranks):
        mem["activations"] = int(round(peaks[r] if peaks is not None else
                                       inflight_microbatches(pipe.schedule, pipe.pp, pipe.microbatches, r) * acts[r]))
        mem["total"] = sum(mem[k] for k in MEMORY_CATEGORIES)
    return ranks


def _bitpipe_peaks(pp: int, microbatches: int, stage_act: list[int], received: list[int],
                   grads_received: list[int]) -> list[int]:
    """Peak bytes per rank of BitPipe's saved activations and pre-posted receive buffers, replayed from its action
    lists (`planner.bitpipe.bitpipe_actions`, run in list order): a forward of model stage k adds A_k until its
    backward; F of stage k > 0 consumes `received[k]` bytes sent from another rank, B of stage k < S - 1
    `grads_received[k]` (`_boundary_bytes`), 0 for a same-rank hand-off (`held_with_posted_receives`)."""
    schedule = bitpipe_actions(pp, microbatches)
    S, peaks = schedule.num_stages, []
    for r in range(pp):
        now, saved, got = 0, [], []
        for a in schedule.actions[r]:
            k, x, forward = schedule.model_stage(a.stage_index), a.stage_index, a.computation_type.value == "F"
            now += stage_act[k] if forward else -stage_act[k]
            saved.append(now)
            peer = x - 1 if forward else x + 1
            crosses = (k > 0 if forward else k < S - 1) and schedule.stage_to_rank[peer] != r
            got.append((received[k] if forward else grads_received[k]) if crosses else 0)
        peaks.append(int(round(held_with_posted_receives(saved, got))))
    return peaks


def _boundary_bytes(plan: Plan, traced: TracedGraph, cut) -> tuple[list[int], list[int]]:
    """Per model stage k: the bytes of the values it receives (`cut.inputs[k]`) and of the gradients it receives
    back from stage k + 1 (those of stage k + 1's inputs that carry one), as the runner allocates them: the local
    shapes of the plan's layouts under its recipe's dtypes (`runtime.pipeline._examples`), the largest over the
    intra-stage mesh's ranks. The first stage receives nothing, the last no gradient."""
    from .rewriter.spec import spec_from_plan
    from .runtime.pipeline import _examples, boundary_dtypes, stage_spec

    spec = spec_from_plan(plan)
    dtypes = boundary_dtypes(traced, cut, spec.autocast)
    S = cut.num_stages
    values, grads = [0] * S, [0] * S
    for k in range(1, S):
        layouts = stage_spec(spec, traced, cut, k, 0).inputs
        per_local = [_examples(traced, cut.inputs[k], layouts, spec, local, dtypes)
                     for local in range(spec.mesh.world_size)]
        values[k] = max(sum(t.nbytes for t in ex) for ex in per_local)
        grads[k - 1] = max(sum(t.nbytes for t in ex if t.requires_grad) for ex in per_local)
    return values, grads
