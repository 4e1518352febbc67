"""Where a pipeline cuts the traced graph: the stages' ops, the values crossing each boundary (`StageCut`), what
the last stage returns to the step (`step_returns`), each stage as a TracedGraph of its own (`stage_graph`) and
which pp rank holds a stage (`stage_pp_rank`). Split out of `runtime.pipeline` (which re-exports these names)."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.fx

from ..errors import PipelineError
from ..planner.stages import step_reads
from ..tracer.blocks import pipeline_unit
from ..tracer.graph import Role, TracedGraph

V_PLACED = {"zbv", "dualpipev", "bitpipe"}  # 2 stages per rank in a V (bitpipe: its down pipeline's copies)


def stage_pp_rank(schedule: str, stage: int, num_stages: int, pp: int) -> int:
    """Pipeline rank of stage `stage`: looped (stage % pp) for torch's interleaved schedules, a V (stage, or
    2 pp - 1 - stage past the turn) for zbv / dualpipev (torch's `generate_stage_to_rank_mapping(style="v")`)
    and for bitpipe's down pipeline (`planner.bitpipe.bitpipe_placement`)."""
    if schedule in V_PLACED and num_stages == 2 * pp and stage >= pp:
        return 2 * pp - 1 - stage
    return stage % pp


@dataclass(frozen=True)
class StageCut:
    """Which stage computes each op, and what each stage receives and sends (fx value names, in order).

    The last stage's `outputs` are what a pipeline step reads of the model's outputs (`step_returns`: the
    model's own loss alone when its first output is one); `model_outputs` are all of them, which the last
    stage returns only to a step given a `loss_fn` (`StageModule.returns_all`)."""

    num_stages: int
    stage_of: dict[str, int]
    inputs: tuple[tuple[str, ...], ...]
    outputs: tuple[tuple[str, ...], ...]
    model_outputs: tuple[str, ...] = ()


def cut_stages(traced: TracedGraph, num_stages: int, blocks_per_stage: tuple[int, ...] | None = None) -> StageCut:
    """Cut between the members of the pipeline unit (`tracer.blocks.pipeline_unit`: the first repeated-block
    group, or the layer stack of a model whose layers differ): stage k gets `blocks_per_stage[k]` consecutive
    members (default: as even as possible, earlier stages first); ops before the first member go to stage 0,
    ops after the last to the last stage, other ops to the stage of the op before them.

    Raises ValueError when the graph has no repeated blocks or the counts do not add up.
    """
    group = pipeline_unit(traced)
    if group is None:
        raise ValueError("cannot cut stages: the traced graph has no repeated blocks; pipeline parallelism "
                         "splits at block boundaries (e.g. transformer layers)")
    if blocks_per_stage is None:
        base, extra = divmod(group.count, num_stages)
        blocks_per_stage = tuple(base + (k < extra) for k in range(num_stages))
    if len(blocks_per_stage) != num_stages or sum(blocks_per_stage) != group.count:
        raise ValueError(f"blocks_per_stage={blocks_per_stage} must have {num_stages} entries adding up to the "
                         f"{group.count} blocks of {group.name}")
    first = {n: k for k, count in enumerate(blocks_per_stage)
             for member in group.nodes[sum(blocks_per_stage[:k]):sum(blocks_per_stage[:k]) + count] for n in member}
    stage_of, current, past_last_block = {}, 0, False
    for info in traced.compute_nodes():  # graph order
        if info.name in first:
            current = first[info.name]
        elif past_last_block:
            current = num_stages - 1
        stage_of[info.name] = current
        past_last_block = past_last_block or info.name == group.nodes[-1][-1]
    return _boundaries(traced, stage_of, num_stages)


def plan_cut(traced: TracedGraph, stages) -> StageCut:
    """The cut a plan's stages describe (`PipelineSection.stages`, or their dicts), checked against `traced`:
    the stages' blocks must be the members of the pipeline unit (`tracer.blocks.pipeline_unit`) in order (stage k's run after stage
    k - 1's), and each stage's first / last node the ones those blocks give (`cut_stages`).

    Raises:
        PipelineError: blocks or nodes that differ (a hand-edited cut), naming the stage and the values.
    """
    get = (lambda st, key: st[key]) if stages and isinstance(stages[0], dict) else getattr
    listed = [b for st in stages for b in get(st, "blocks")]
    group = pipeline_unit(traced)
    if group is None or listed != list(group.members):
        raise PipelineError(f"the plan's stages hold blocks {listed}, but the model's blocks to cut between are "
                            f"{list(group.members) if group else []} ({group.name if group else 'none'}): stage k "
                            "holds the next consecutive run of them. Remedy: list them in that order, or re-plan")
    cut = cut_stages(traced, len(stages), tuple(len(get(st, "blocks")) for st in stages))
    nodes: dict[int, list[str]] = {}
    for name, k in cut.stage_of.items():
        nodes.setdefault(k, []).append(name)
    wrong = [f"stage {k}: first_node {get(st, 'first_node')}, last_node {get(st, 'last_node')}; its blocks give "
             f"{nodes[k][0]} .. {nodes[k][-1]}" for k, st in enumerate(stages)
             if (get(st, "first_node"), get(st, "last_node")) != (nodes[k][0], nodes[k][-1])]
    if wrong:
        raise PipelineError("the plan's stage nodes do not match their blocks (a cut edited by hand?):\n  "
                            + "\n  ".join(wrong) + "\nRemedy: write the nodes named, or re-plan")
    return cut


def _boundaries(traced: TracedGraph, stage_of: dict[str, int], num_stages: int) -> StageCut:
    """Values each stage must receive: everything used at or after it that was made before it."""
    produced = {n: 0 for n in traced.input_names} | stage_of
    last_use: dict[str, int] = {}
    for name, k in stage_of.items():
        for arg in _args(traced.node(name).node):
            if arg in produced:
                last_use[arg] = max(last_use.get(arg, 0), k)
    outputs_of_model = tuple(a for a in _args(traced.graph_module.graph.output_node()))
    for arg in outputs_of_model:  # every output reaches the last stage (a step given a loss_fn may read it)
        last_use[arg] = num_stages
    inputs = [tuple(traced.input_names)]
    for k in range(1, num_stages):
        inputs.append(tuple(n for n in produced if produced[n] < k <= last_use.get(n, -1)))
    outputs = [inputs[k + 1] for k in range(num_stages - 1)] + [step_returns(traced)]
    return StageCut(num_stages, stage_of, tuple(inputs), tuple(outputs), outputs_of_model)


def step_returns(traced: TracedGraph) -> tuple[str, ...]:
    """The model outputs (fx value names) the last pipeline stage returns to the step: the first alone when it
    is a 0-d floating value (the model's own loss, all `pm.step(loss_fn=None)` reads), else every output (a
    `loss_fn` reads them). The other outputs stay where their ops made them: neither gathered over the stage's
    (dp, tp) mesh nor held (round 16: GPT-2 with labels= on pp=2 x dp=2 gathered its logits over dp every
    microbatch, and torch's schedule kept every microbatch's until the next step). The planner prices exactly
    this (`stage_graph` of the last stage, `pipeline_memory`)."""
    names = _args(traced.graph_module.graph.output_node())
    return step_reads([(n, tuple(traced.node(n).outputs[0].shape), traced.node(n).outputs[0].dtype)
                       for n in names if traced.node(n).outputs])


def step_returned_share(traced: TracedGraph) -> float:
    """The share of the model's returned bytes that the last pipeline stage returns (`step_returns`): what the
    pipeline search keeps of a whole-graph plan's "outputs" memory."""
    names = _args(traced.graph_module.graph.output_node())
    size = {n: math.prod(traced.node(n).outputs[0].shape) * traced.node(n).outputs[0].dtype.itemsize
            for n in names if traced.node(n).outputs}
    total = sum(size[n] for n in names if n in size)
    return sum(size[n] for n in step_returns(traced) if n in size) / total if total else 1.0


def _args(node: torch.fx.Node) -> list[str]:
    found: list[str] = []
    torch.fx.node.map_arg((node.args, node.kwargs), lambda a: found.append(a.name))
    return found


def stage_graph(traced: TracedGraph, cut: StageCut, k: int, outputs: tuple[str, ...] | None = None) -> TracedGraph:
    """A TracedGraph of stage k alone: its parameters, its received values as inputs, its ops, and the
    values it sends as outputs (pass-through values included; `outputs`: other names to return instead,
    e.g. `cut.model_outputs` for the last stage)."""
    outputs = cut.outputs[k] if outputs is None else outputs
    ops = [n for n, s in cut.stage_of.items() if s == k]
    used = {a for n in ops for a in _args(traced.node(n).node)} | set(outputs)
    params = {fqn: p for fqn, p in traced.parameters.items() if set(p.placeholders) & used}
    graph = torch.fx.Graph()
    env: dict[str, torch.fx.Node] = {}
    for p in params.values():
        for ph in p.placeholders:
            env[ph] = graph.placeholder(ph)
            env[ph].meta = dict(traced.node(ph).node.meta)
    for name in cut.inputs[k]:
        env[name] = graph.placeholder(name)
        env[name].meta = dict(traced.node(name).node.meta)
    for name in ops:
        old = traced.node(name).node
        env[name] = graph.node_copy(old, lambda a: env[a.name])  # keeps the name (no clash in a new graph)
    graph.output(tuple(env[n] for n in outputs))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    nodes = {}
    for node in graph.nodes:
        if node.op == "output":
            continue
        info = traced.node(node.name)
        role = Role.INPUT if node.name in cut.inputs[k] else info.role
        nodes[node.name] = dataclasses.replace(info, node=node, role=role)
    return TracedGraph(traced.exported, gm, nodes, params, [], tuple(cut.inputs[k]),
                       [f"pipeline stage {k} of {cut.num_stages}"], training=traced.training,
                       cut_from=traced.cut_from or traced)
