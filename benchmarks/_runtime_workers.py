"""Rank-side code of `benchmarks.bench_runtime` (spawned functions must live in an importable module).

`bench_rank` runs on every gloo rank: for DP and for TP it builds our sharded program (`ParallelModule`) and
the hand-written torch equivalent (`DistributedDataParallel`, or `parallelize_module` with `ColwiseParallel` /
`RowwiseParallel`) from the same seeded weights, and times one training step (forward, MSE loss, backward,
AdamW step, barrier) of each. Our DP program is the planner's plan with `axis_roles={"dp": "ddp"}`; for TP
both the planner's plan with `axis_roles={"tp": "tp"}` and a hand-written Megatron spec with exactly torch's
split are timed. Rank 0's figures are reported.
"""
from __future__ import annotations

import contextlib
import copy
import io
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

import parallelizer
from parallelizer import zoo
from parallelizer.core.layout import Layout
from parallelizer.core.mesh import MeshSpec
from parallelizer.rewriter.apply import _tensor_args
from parallelizer.rewriter.spec import NodeSharding, ShardingSpec, all_axis_groups, spec_from_plan
from parallelizer.runtime.launch import create_groups
from parallelizer.runtime.module import ParallelModule
from parallelizer.tracer.graph import Role, TracedGraph

R, S0, S1, P = (Layout.parse(s) for s in ("R", "S(0)", "S(1)", "P"))
LR = 1e-3


def planned_spec(tg: TracedGraph, mesh: dict[str, int], roles: dict[str, str]) -> ShardingSpec:
    """The planner's plan for `mesh` with the given axis roles (deterministic: every rank gets the same)."""
    with contextlib.redirect_stdout(io.StringIO()):  # the solver library prints a banner
        return spec_from_plan(parallelizer.plan(tg, mesh, axis_roles=roles))


def tp_spec(tg: TracedGraph, world_size: int, col: set[str], row: set[str]) -> ShardingSpec:
    """Hand-written Megatron tensor parallelism on a 1-D mesh "tp".

    Linear modules in `col` are column-parallel (weight and bias stored and used S(0), output S(1)); modules in
    `row` are row-parallel (weight S(1), input S(1), matmul output Partial, all-reduced before the replicated
    bias is added). An op outside these modules whose input is S(1) (the gelu between up and down) stays
    S(1); everything else (proj, head, residual adds) is replicated. The tracer splits each linear into
    `linear(x, W)` then `add(y, b)`, both owned by the linear's module.
    """
    params = {}
    for fqn in tg.parameters:
        module, _, leaf = fqn.rpartition(".")
        params[fqn] = (S0 if module in col else S1 if module in row and leaf == "weight" else R)
    nodes, layout = {}, {name: R for name in tg.input_names}
    for n in tg.graph_module.graph.nodes:
        args = _tensor_args(n)
        if n.op == "output":
            nodes[n.name] = NodeSharding(tuple(R for _ in args), R)
            continue
        if n.op != "call_function":
            continue
        info = tg.node(n.name)
        is_param = [tg.node(a.name).role in (Role.PARAMETER, Role.BUFFER) for a in args]
        owner = info.module_fqn
        if owner in col:
            ins = tuple(S0 if p else (R if n.target is torch.ops.aten.linear.default else S1) for p in is_param)
            out = S1
        elif owner in row and n.target is torch.ops.aten.linear.default:
            ins, out = (S1, S1), P
        elif any(layout.get(a.name) == S1 for a in args) and not any(is_param):
            ins, out = tuple(S1 for _ in args), S1  # elementwise op between column and row linears
        else:
            ins, out = tuple(R for _ in args), R
        layout[n.name] = out
        nodes[n.name] = NodeSharding(ins, out)
    return ShardingSpec(MeshSpec(("tp",), (world_size,)), nodes, params)


def _measure(steps: dict[str, Callable[[], torch.Tensor]], warmup: int, iters: int, rounds: int) -> dict:
    """Warm each step function up, then time them in alternating rounds (iters // rounds steps each) so that
    slow drift of the machine affects both alike. Every timed step ends with a barrier.
    Returns name -> {"ms": [per-step ms], "loss1": loss of the first step (this rank's)}."""
    out = {name: {"ms": [], "loss1": None} for name in steps}
    for name, step in steps.items():
        for i in range(warmup):
            loss = step()
            if i == 0:
                out[name]["loss1"] = loss.detach().clone()
    dist.barrier()
    per_round = max(1, iters // rounds)
    for _ in range(rounds):
        for name, step in steps.items():
            for _ in range(per_round):
                t0 = time.perf_counter()
                step()
                dist.barrier()
                out[name]["ms"].append((time.perf_counter() - t0) * 1e3)
    return out


def _median_ms(fn: Callable[[], object], n: int = 5) -> float:
    """Median wall time in ms of `fn()` over `n` calls after one warm-up call, each between barriers."""
    fn()
    times = []
    for _ in range(n):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        dist.barrier()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _train_step(module: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor):
    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = F.mse_loss(module(x), y)
        loss.backward()
        opt.step()
        return loss
    return step


def setup_rank(sizes: dict) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor, float, TracedGraph]:
    """Common start of a rank: one torch thread (two ranks share two cores), the seeded `zoo.mlp(**sizes)`
    (kept pristine: copy it), its input x, a fixed random MSE target y, the single-device model's loss on
    them, and the model traced."""
    torch.set_num_threads(1)
    pristine, (x,) = zoo.mlp(**sizes)
    y = torch.randn(x.shape[0], pristine.head.out_features, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref_loss1 = F.mse_loss(pristine(x), y).item()
    return pristine, x, y, ref_loss1, parallelizer.trace(copy.deepcopy(pristine), (x,))


def bench_rank(rank: int, world_size: int, sizes: dict, warmup: int, iters: int, rounds: int) -> dict:
    """One rank of the benchmark. Returns {"dp"|"tp": {"ours"|"torch": {"ms", "median_ms", "loss1"}},
    "dp_parts"|"tp_parts": {part: median ms}, "ref_loss1", "collectives": {"dp"|"tp": our program's
    collectives}, "threads"}."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    from torch.nn.parallel import DistributedDataParallel

    pristine, x, y, ref_loss1, traced = setup_rank(sizes)
    depth = len(pristine.blocks)
    result = {"ref_loss1": ref_loss1, "collectives": {}, "threads": torch.get_num_threads()}

    # Data parallel: each rank computes on its half of the batch.
    spec = planned_spec(traced, {"dp": world_size}, {"dp": "ddp"})
    create_groups(all_axis_groups(spec.mesh))
    ours = ParallelModule(traced, spec, rank, copy.deepcopy(pristine))
    result["collectives"]["dp"] = dict(ours.program.collectives)
    half = x.shape[0] // world_size
    xl, yl = x[rank * half:(rank + 1) * half], y[rank * half:(rank + 1) * half]
    ddp = DistributedDataParallel(copy.deepcopy(pristine))
    dp = _measure({
        "ours": _train_step(ours, torch.optim.AdamW(ours.parameters(), lr=LR), x, y),  # slices x itself
        "torch": _train_step(ddp, torch.optim.AdamW(ddp.parameters(), lr=LR), xl, yl),
    }, warmup, iters, rounds)
    local = dp["torch"]["loss1"]  # DDP's loss is this rank's half-batch mean: average it for comparison
    dist.all_reduce(local)
    dp["torch"]["loss1"] = local / world_size
    result["dp"] = dp
    del ours, ddp

    # Where a DP step's time goes, measured apart: compute without communication, the gradient all-reduces
    # alone (one per parameter, as ours issues them, and as one flat 68 MB buffer), the AdamW step alone.
    plain = copy.deepcopy(pristine)
    plain_opt = torch.optim.AdamW(plain.parameters(), lr=LR)

    def fwd_bwd() -> None:
        plain_opt.zero_grad(set_to_none=True)
        F.mse_loss(plain(xl), yl).backward()

    fwd_bwd()
    grads = [p.grad.clone() for p in plain.parameters()]
    flat = torch.cat([g.flatten() for g in grads])
    result["dp_parts"] = {
        "fwd_bwd_half_batch": _median_ms(fwd_bwd),
        "per_param_all_reduce": _median_ms(lambda: [dist.all_reduce(g) for g in grads]),
        "flat_all_reduce": _median_ms(lambda: dist.all_reduce(flat)),
        "adamw": _median_ms(plain_opt.step),
    }
    del plain, plain_opt, grads, flat

    # Tensor parallel (Megatron): full batch on every rank, blocks' up column-, down row-parallel.
    # Lists, not sets: parallelize_module scatters each weight in plan order, which must be the same on every
    # rank (a set's order depends on the per-process string hash seed).
    col = [f"blocks.{i}.up" for i in range(depth)]
    row = [f"blocks.{i}.down" for i in range(depth)]
    spec = tp_spec(traced, world_size, set(col), set(row))
    create_groups(all_axis_groups(spec.mesh))
    ours = ParallelModule(traced, spec, rank, copy.deepcopy(pristine))
    planned = ParallelModule(traced, planned_spec(traced, {"tp": world_size}, {"tp": "tp"}), rank,
                             copy.deepcopy(pristine))
    result["collectives"]["tp"] = dict(ours.program.collectives)
    result["collectives"]["tp_plan"] = dict(planned.program.collectives)
    mesh = init_device_mesh("cpu", (world_size,))
    plan = {**{m: ColwiseParallel() for m in col}, **{m: RowwiseParallel() for m in row}}
    tp_model = parallelize_module(copy.deepcopy(pristine), mesh, plan)
    opts = {"ours": torch.optim.AdamW(ours.parameters(), lr=LR),
            "plan": torch.optim.AdamW(planned.parameters(), lr=LR),
            "torch": torch.optim.AdamW(tp_model.parameters(), lr=LR)}
    result["tp"] = _measure({
        "ours": _train_step(ours, opts["ours"], x, y),
        "plan": _train_step(planned, opts["plan"], x, y),
        "torch": _train_step(tp_model, opts["torch"], x, y),
    }, warmup, iters, rounds)
    # AdamW alone on each side's parameters (gradients of the last step are still there): plain local
    # shards for ours, DTensors for torch.
    result["tp_parts"] = {f"adamw_{impl}": _median_ms(opts[impl].step) for impl in ("ours", "torch")}
    for kind, impls in (("dp", ("ours", "torch")), ("tp", ("ours", "plan", "torch"))):
        for impl in impls:
            result[kind][impl]["loss1"] = float(result[kind][impl]["loss1"])
            result[kind][impl]["median_ms"] = statistics.median(result[kind][impl]["ms"])
    return result
