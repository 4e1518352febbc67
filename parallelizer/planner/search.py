"""`plan_pipeline`: outer search over mesh shapes (pp, dp, tp), microbatch counts and pipeline schedules.

For every candidate (pp, dp, tp, m, schedule) with pp * dp * tp = the cluster's devices:

1. per-segment prices on tp devices come from ONE intra-stage ILP solve per tp (`segments.price_segments`),
   scaled to the microbatch size mb = global_batch / (dp m);
2. the blocks are partitioned into pp * v stages by the min-max DP of `partition.py` under the memory
   budget, each stage keeping the schedule's in-flight microbatches (`schedules.inflight_microbatches`);
   the even split is priced too and the better feasible one kept (`candidates._Context.evaluate` says why); each
   stage takes the cheapest activation-recomputation mode that fits its in-flight microbatches
   (`PlanConfig.recompute`: "auto" chooses among none / selective / full, another value forces it;
   `segments.SegmentPrices.rc_extra_lin` adds the recomputed forward to B, `rc_act_delta` changes the
   saved bytes); the budget is the device's (or `memory_budget_bytes`) minus the reserve, exactly as
   `parallelizer.plan` (`api.memory_budget`);
   memory-lean stage layouts: the intra-stage ILP chooses each layout for TIME (memory is only a constraint,
   and the segment solve has none), which at tp = 8 keeps part of a block replicated (11.25 s b h per layer
   with selective recomputation against the 4.25 of Megatron's tensor + sequence parallelism, Korthikanti et
   al. 2022 Table 2). Where memory binds for a candidate on tp > 1 (no partition fits, a stage recomputes, or
   the balanced cut is not the one without a memory limit), the segments are priced a second time with the
   memory-lean layout (`ilp.solve_lean`: the fastest within 1% of the least activation bytes; it reaches
   Table 2's TP+SP rows) and the DP's modes become (layout, recomputation) pairs ordered by seconds per
   block: each stage takes the fastest pair that fits (`StageSpec.lean`; `parallelizer.plan` solves those
   stages lean too, `stage_layouts.plan_stages`). Where memory does not bind the lean layout is not priced
   (no extra solves: the time-optimal partition is the best);
   point-to-point transfers at the cuts use Megatron's scatter/gather (Narayanan et al. 2021, Sec. 4.1):
   each tp rank sends 1/tp of the activation over the pipeline link (`send_recv` on the "pp" axis), then
   an all-gather over "tp" inside the node rebuilds it; with `PlanConfig.boundary_compression` the send
   is priced at the codec's wire bytes plus its encode/decode time, per cut the cheapest allowed codec
   (`planner.boundary`), and the partition is priced with and without (`candidates._Context.evaluate`, `exact`);
3. step time = the simulated step of the schedule's own action list (`planner.simulate`: torch's lists,
   BitPipe's from `planner.bitpipe`; transfers paid across ranks only; each stage's gradient all-reduce
   over "dp" in the runtime's buckets (`stage_sync.stage_syncs`: 1 MiB, then 25 MiB each), started as the stage's last
   backward produces them (a bucket is ready once backward has run the segment producing its last byte, in
   backward order: an embedding's gradient at the end) and overlapping it (`rewriter.grad_sync.deferred_sync`; `overlap_grad_sync=False`:
   after the rank's last action), with ZeRO-1 the reduce-scatter + all-gather moves the same bytes (torch's
   ZeroRedundancyOptimizer: its broadcast after the rank's sync); BitPipe's exchange between the two copies of
   a stage started eagerly)
   + the exchange of tied-embedding gradients between the first and last rank. Memory uses the simulated
   peak in-flight activation bytes per rank.
   With `PlanConfig.compression` other than "none" the dp sync of each partition may be compressed
   (`planner.compression.choose`): a codec's sync is its all-reduces of the compressed bytes plus its compute
   (`cost_model.compression`, a rank's gradients as one bucket), and "auto" takes it only when it beats
   the uncompressed sync even fully overlapped with the rank's backward (`DeviceSpec.comm_overlap`).

Pruning (branch and bound), two levels. A candidate's step time is at least
    LB = m * sum(segment seconds per microbatch) / pp + (1 - o) A,   A = all_reduce(sum(gradient bytes) / pp over dp)
(the bottleneck rank does at least the average work, the bubble is >= 0, the all-reduce time is affine in
bytes so the average rank's bucketed sync is >= A, and at most the fraction o (comm_overlap) of a sync hides
under backward; the partition bound below also charges what one stage's last backward cannot hide). The segment seconds
are those without recomputation, which only adds time, so LB stays a lower bound under any recomputation
choice; the lean layout's seconds summed over the segments are at least the time-optimal layout's (it solves
the same ILP under one more row), so LB holds for lean stages too, except for its sync term, which uses the
time-optimal layout's gradient bytes: a lean layout that shards a parameter the time-optimal one replicates
(a bias or norm weight; both shard the matmul weights) syncs that many fewer bytes, a known inexactness of
the bound (< 0.1% of a block's gradients at h >= 1024) left as it is. A candidate whose average
rank memory (all state plus the leanest mode's activations times the fewest in-flight microbatches, / pp)
exceeds the budget cannot fit and is not partitioned. Candidates are partitioned in increasing LB order;
each fitting partition gets a tighter bound (`candidates._Context._price_partition`: per rank, the forward chain
before its first stage + its m microbatches of work + the backward chain below it when backward is not
split, or its gradient sync) and waits in a heap; partitions are simulated in increasing bound order
while their bound is <= the best simulated step, and the search stops once the next candidate's LB exceeds
it. So it returns exactly the optimum of the exhaustive grid (`search="exhaustive"`: every candidate
partitioned; simulation still skips partitions whose bound exceeds the best), typically after simulating
a handful of partitions (`SearchReport.simulated`). With gradient compression allowed the sync term of LB
is 0 and a partition's bound uses each rank's cheaper sync (a codec may shrink it), and a second bound pass
over the same (cached) prices finds the best uncompressed step, against which the plan reports its speedup.

Ranks sharing cores: when the cluster carries a `cost_model.topology.CoreSharing` (a calibration profile's
cluster, `Profile.cluster(n)`: n processes on one machine's cores) the pp x dp x tp devices are processes whose
pipeline ranks wait in their bubbles and leave the cores to the others. The prices stay those of the device
slowed for all n processes computing at once (the intra-stage ILP, the stage seconds recorded in the plan and the
partition DP are unchanged, and so are non-pipeline plans on that cluster); only the simulation changes: every
compute second (F, I, W, with the stage's tp collectives) is multiplied by `sharing.pipeline_cores`'s scale
F(dp*tp) / F(n), which turns the price into the time of one pipeline rank computing alone (dividing by the
applied F(n) rather than pricing again on the unslowed device: no second ILP solve, the same strategies, and all
pp ranks computing give back the slowed price when F(n) is the applied factor), and the schedule is simulated by
processor sharing (`planner.sharing`) with factors F(k*dp*tp) / F(dp*tp) for k computing pipeline ranks;
transfers and the dp gradient sync are waits that use no core (the sharing pass's model). Both lower bounds use
the same scaled compute seconds: under sharing an action takes at least its scaled seconds, so they stay lower
bounds and the search stays exact. The optimizer step is not in the search's step (as on every cluster);
`steptime` adds the busiest rank's on the slowed device.

Throughput: model FLOPs per step = `cost_model.graph_flops` of the traced graph (forward + 2x forward for
backward, no recomputation) x global_batch / trace batch; TFLOP/s per GPU = FLOPs / (step time x devices);
MFU = that / the device's dense peak for the model's parameter dtype (Chowdhery et al. 2022, App. B).
"""
from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
import time
from collections import Counter

from tqdm.auto import tqdm

from cost_model.topology import Cluster, get_cluster

from ..config import PlanConfig
from ..errors import InfeasiblePlanError, PipelineError, format_bytes
from ..tracer import TracedGraph
from .alternatives import note, schedule_alternatives
from .api import memory_budget
from .compression import keeps_compression
from .costs import GraphTables, resolve_precision, traced_in_low_precision
from .pipeline import PipelinePlan, SearchReport
from .schedules import RUNNER_SCHEDULES, SCHEDULES, buffer_copies_reason, get_schedule, invalid_reason
from .segments import segment_graph, sent_nbytes
from .candidates import Candidate, _Context


def plan_pipeline(traced: TracedGraph, cluster: Cluster | str, *, global_batch: int,
                  memory_budget_bytes: int | None = None, pp: int | tuple[int, ...] | None = None,
                  tp: int | tuple[int, ...] | None = None, num_microbatches: int | tuple[int, ...] | None = None,
                  schedules: tuple[str, ...] | None = None, zero1: bool = True, config: PlanConfig | None = None,
                  search: str = "bound", partitioner: str = "dp", progress: bool | None = None,
                  overlap_grad_sync: bool = True, **options) -> PipelinePlan:
    """Choose mesh (pp, dp, tp), schedule, microbatches and stages for training `traced` on `cluster`.

    Args:
        traced: from `parallelizer.trace`, typically of a model on the meta device traced with ONE sample
            (any batch b0 works: prices scale by microbatch / b0, see `segments.py`). Needs repeated blocks.
        cluster: a `cost_model.topology.Cluster` (e.g. `dgx_a100(64)`) or a preset string "a100:64x8".
        global_batch: samples per optimizer step over all replicas; must split as dp x microbatches x mb.
        memory_budget_bytes: per device; default the device's HBM. The plan's tensors must fit this minus
            the reserve (`PlanConfig.memory_reserve_bytes`, `api.memory_budget`: as `parallelizer.plan`).
        pp, tp, num_microbatches: restrict the search to these values (an int or a tuple); tp must divide
            the devices per node (tensor parallelism stays inside a node).
        schedules: names from `schedules.SCHEDULES` (default: all six: gpipe, 1f1b, interleaved_1f1b, zbv,
            dualpipev, bitpipe).
        zero1: shard optimizer state over dp (Megatron's distributed optimizer, ZeRO stage 1: its
            reduce-scatter + all-gather priced as the all-reduce's bytes). With `PlanConfig.zero1 == "dp"` (the
            user's path, run by torch's ZeroRedundancyOptimizer: all-reduce, then a broadcast of the stepped
            parameters) an all-gather of each rank's parameters over dp is priced on top.
        config / options: `PlanConfig` fields for the intra-stage ILP (optimizer, precision, solver...).
        search: "bound" (branch and bound, exact) or "exhaustive" (price every candidate).
        partitioner: "dp" (balanced, memory-aware) or "uniform" (equal blocks per stage, for comparison).
        progress: tqdm bar over candidates; None = only on a terminal.
        overlap_grad_sync: True (what our runtime does, as Megatron-LM's `--overlap-grad-reduce` since 2023):
            each stage's bucketed dp all-reduce overlaps its last backward (step 3). False prices it after
            each rank's last action (Megatron-LM's local DDP before that flag, NVIDIA/Megatron-LM#391 and #428:
            to compare with measurements of that runtime).
    Returns:
        The best `PipelinePlan` (lowest estimated step time; ties by (pp, dp, tp, m, schedule)).
    Raises:
        ValueError: bad arguments, or a fixed (dp, m) that does not divide global_batch; the text says why.
        InfeasiblePlanError: no candidate fits the memory budget; names the smallest need and remedies.
    """
    start = time.perf_counter()
    cluster = get_cluster(cluster) if isinstance(cluster, str) else cluster
    if not (isinstance(global_batch, int) and global_batch >= 1):
        raise ValueError(f"global_batch={global_batch!r}: must be an int >= 1 (samples per optimizer step)")
    if search not in ("bound", "exhaustive") or partitioner not in ("dp", "uniform"):
        raise ValueError(f"search={search!r}, partitioner={partitioner!r}: use 'bound'|'exhaustive', 'dp'|'uniform'")
    if not isinstance(overlap_grad_sync, bool):
        raise ValueError(f"overlap_grad_sync={overlap_grad_sync!r}: must be True or False")
    config = dataclasses.replace(config or PlanConfig(), **options)
    if memory_budget_bytes is not None:
        config = dataclasses.replace(config, memory_budget_bytes=memory_budget_bytes)
    total_budget, reserve = memory_budget(config, cluster.device)
    budget = total_budget - reserve
    tables = GraphTables()  # the traced graph's facts: the boundary bytes' dtypes as run, the per-tp solves
    ctx = _Context(traced, segment_graph(traced, sent_nbytes(traced, cluster, config, tables)), cluster, config,
                   budget, global_batch, zero1, partitioner, tables)
    ctx.reserve, ctx.overlap_grad_sync = reserve, overlap_grad_sync
    ctx.sync_overlap = cluster.device.comm_overlap if overlap_grad_sync else 0.0
    cands, excluded, total = _enumerate(ctx, _tuple(pp), _tuple(tp), _tuple(num_microbatches),
                                        tuple(schedules or SCHEDULES))
    bounds = sorted((ctx.lower_bound_s(c), c) for c in cands)
    with tqdm(total=len(bounds), desc="pipeline search", disable=(None if progress is None else not progress),
              leave=False) as bar:
        best, evaluated, infeasible, simulated, leanest, by_schedule = _bound_search(ctx, bounds, "step_s", search,
                                                                                     bar)
    if best is None:
        need, cand = leanest
        raise InfeasiblePlanError(
            f"memory: no pipeline configuration fits {format_bytes(budget)} per device "
            + (f"(after a reserve of {format_bytes(reserve)}) " if reserve else "")
            + (f"with recompute={config.recompute!r} " if config.recompute != "auto" else "with recomputation ")
            + f"on {cluster.world_size} "
            f"{cluster.device.name} devices; the leanest (pp={cand.pp}, dp={cand.dp}, tp={cand.tp}, "
            f"m={cand.num_microbatches}, {cand.schedule}) needs {format_bytes(need)} per device. Remedies: more "
            "devices, a smaller global batch"
            + (" or more microbatches, " if global_batch // (cand.dp * cand.num_microbatches) > 1 else ", ")
            # only remedies not already in effect (a bf16 plan was told to use bf16, ZeRO-1 plan to use ZeRO-1)
            + ("bf16 precision (precision='bf16'), " if resolve_precision(
                config.precision, cluster.device, traced_in_low_precision(traced)) != "bf16" else "")
            + ("ZeRO-1 (zero1='dp'; CLI --zero1 dp; plan_pipeline: zero1=True), " if not zero1 else "")
            + ("activation recomputation (recompute='auto' or 'full'), " if config.recompute in ("none", "selective")
               else "") + "a smaller memory reserve (memory_reserve_bytes=).")
    report = SearchReport(total, dict(sorted(excluded.items())), len(bounds) - evaluated, evaluated, infeasible,
                          len(ctx.cache) + 2 * len(ctx.lean_cache), time.perf_counter() - start, simulated)
    alternatives = schedule_alternatives(ctx, best, by_schedule, bounds)
    uncompressed = best[2]["uncompressed_step_s"]
    if ctx.codecs:  # the best plan without gradient compression (its own bound pass over cached prices)
        plain = sorted((ctx.lower_bound_s(c, compressed=False), c) for c in cands)
        uncompressed, cand, res = _bound_search(ctx, plain, "uncompressed_step_s", search, None)[0]
        if not keeps_compression(config.compression, best[2]["compression"], best[0], uncompressed):
            best = (uncompressed, cand, dict(res, step_s=uncompressed, dp_grad_sync=res["uncompressed_dp_grad_sync"],
                                             compression="none"))
    return ctx.to_plan(best[1], best[2], report, search, uncompressed, alternatives)


def _bound_search(ctx: "_Context", bounds: list, key: str, search: str, bar):
    """Branch and bound over `bounds` ((LB, candidate) in increasing order; module docstring) minimising
    `res[key]` ("step_s", or "uncompressed_step_s" for the best plan without gradient compression): each
    candidate's fitting partitions wait in a heap by their bound and are simulated (`candidates._Context.exact`) in
    increasing bound order while it is <= the best found. Returns (best (value, candidate, res) or None,
    candidates partitioned, infeasible ones, partitions simulated, leanest (need_bytes, candidate) or None,
    per (schedule, exact?) the lowest-priced candidate for `alternatives.schedule_alternatives`)."""
    best: tuple[float, Candidate, dict] | None = None
    evaluated = infeasible = simulated = 0
    leanest: tuple[float, Candidate] | None = None
    tie = itertools.count()
    pending: list = []  # heap of (partition's step lower bound, candidate, tie, priced partition)
    by_schedule: dict[tuple, tuple] = {}  # (schedule, exact?) -> its lowest (step, candidate, result)

    def settle(limit: float) -> None:  # simulate the pending partitions whose bound is <= limit and <= best
        nonlocal best, simulated, leanest
        while pending and pending[0][0] <= limit and (best is None or pending[0][0] <= best[0]):
            _, cand, _, res = heapq.heappop(pending)
            res = ctx.exact(cand, res)
            simulated += 1
            if "step_s" not in res:
                leanest = min(leanest or (math.inf, cand), (res["need_bytes"], cand))
                continue
            note(by_schedule, cand, res, True)
            if best is None or (res[key], cand) < (best[0], best[1]):
                best = (res[key], cand, res)

    for lb, cand in bounds:
        if search == "bound":
            settle(lb)
            if best is not None and lb > best[0]:
                break
        if bar is not None:
            bar.update(1)
        evaluated += 1
        fits = ctx.evaluate(cand)
        if "step_lb" not in fits[0]:
            infeasible += 1
            leanest = min(leanest or (math.inf, cand), (fits[0]["need_bytes"], cand))
            continue
        for res in fits:
            heapq.heappush(pending, (res["step_lb"], cand, next(tie), res))
            note(by_schedule, cand, res, False)
    settle(math.inf)
    return best, evaluated, infeasible, simulated, leanest, by_schedule


def _tuple(x) -> tuple[int, ...] | None:
    return None if x is None else (x,) if isinstance(x, int) else tuple(x)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _enumerate(ctx: "_Context", pps, tps, ms, schedules) -> tuple[list[Candidate], Counter, int]:
    """Valid candidates, exclusion reasons (counted), and the number enumerated."""
    for name in schedules:
        get_schedule(name)
    world, per_node, L = ctx.cluster.world_size, ctx.cluster.devices_per_node, ctx.segments.num_blocks
    for t in tps or ():
        if per_node % t:
            raise ValueError(f"tp={t} must divide devices_per_node={per_node}: tensor parallelism stays in a node")
    excluded: Counter = Counter()
    mutated = ctx.traced.mutated_state()
    ctx.refused = {name: why for name in schedules if (why := buffer_copies_reason(name, mutated))}
    cands: list[Candidate] = []
    total = 0
    for t in tps or _divisors(per_node):
        for p in pps or _divisors(world // t):
            if world % (t * p):
                if pps and tps:  # both fixed by the caller: say so; otherwise skip this combination
                    raise ValueError(f"pp={p} x tp={t} does not divide the {world} devices of the cluster")
                excluded[f"pp x tp does not divide the {world} devices"] += 1
                continue
            d = world // (t * p)
            for m in ms or (_divisors(ctx.global_batch // d) if ctx.global_batch % d == 0 else (1,)):
                for name in schedules:
                    total += 1
                    if ctx.global_batch % (d * m):
                        excluded[f"global batch {ctx.global_batch} not divisible by dp x microbatches"] += 1
                    elif p == 1 and name != ("1f1b" if "1f1b" in schedules else schedules[0]):  # kept under a
                        excluded["pp=1: one schedule (1f1b = gradient accumulation) suffices"] += 1  # restriction too
                    elif (why := invalid_reason(name, p, m, L) or buffer_copies_reason(name, mutated)) is not None:
                        excluded[why] += 1
                    elif name in RUNNER_SCHEDULES and ctx.config.boundary_compression != "none":
                        excluded[f"{name} runs no pipeline-boundary compression (our own P2P runner)"] += 1
                    else:
                        cands.append(Candidate(p, d, t, m, name))
    if not cands:
        batch_only = set(excluded) == {f"global batch {ctx.global_batch} not divisible by dp x microbatches"}
        if pps and tps and ms and len(pps) == len(tps) == len(ms) == 1 and batch_only:
            d = world // (tps[0] * pps[0])
            raise PipelineError(f"global_batch={ctx.global_batch} does not split into dp={d} x microbatches={ms[0]} "
                                f"x an integer microbatch size. Remedy: a global batch divisible by {d * ms[0]}, or "
                                "other microbatches= / pp / tp.")
        if ctx.refused and len(ctx.refused) == len(schedules):  # only multi-copy schedules were asked for
            raise PipelineError(next(iter(ctx.refused.values())))
        raise PipelineError(f"no valid pipeline configuration; excluded: {dict(excluded)}. Remedy: change what "
                            "excluded them: microbatches= (1f1b needs >= pp, interleaved_1f1b a multiple of pp, zbv and "
                            "dualpipev >= 2 x pp, bitpipe a multiple of an even pp), another schedule=, or a smaller pp "
                            "(a schedule with v stages per rank needs pp x v <= the model's repeated blocks)")
    return cands, excluded, total

