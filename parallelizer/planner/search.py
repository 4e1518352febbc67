"""`plan_pipeline`: outer search over mesh shapes (pp, dp, tp), microbatch counts and pipeline schedules.

For every candidate (pp, dp, tp, m, schedule) with pp * dp * tp = the cluster's devices:

1. per-segment prices on tp devices come from ONE intra-stage ILP solve per tp (`segments.price_segments`),
   scaled to the microbatch size mb = global_batch / (dp m);
2. the blocks are partitioned into pp * v stages by the min-max DP of `partition.py` under the memory
   budget, each stage keeping the schedule's in-flight microbatches (`schedules.inflight_microbatches`);
   the even split is priced too and the better feasible one kept (`_Context.evaluate` says why); each
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
   (`planner.boundary`), and the partition is priced with and without (`_Context.evaluate`, `exact`);
3. step time = the simulated step of the schedule's own action list (`planner.simulate`: torch's lists,
   BitPipe's from `planner.bitpipe`; transfers paid across ranks only; each stage's gradient all-reduce
   over "dp" in the runtime's buckets (`stage_sync.stage_syncs`: 1 MiB, then 25 MiB each), started as the stage's last
   backward produces them and overlapping it (`rewriter.grad_sync.deferred_sync`; `overlap_grad_sync=False`:
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
each fitting partition gets a tighter bound (`_Context._price_partition`: per rank, the forward chain
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
from dataclasses import dataclass

import numpy as np
from tqdm.auto import tqdm

from cost_model.communication import collective_time_s
from cost_model.compression import compressed_sync, compressed_sync_time_s
from cost_model.compute import graph_flops
from cost_model.topology import Cluster, MeshTopology, get_cluster

from ..config import PlanConfig
from ..core.mesh import MeshSpec
from ..errors import InfeasiblePlanError, PipelineError, format_bytes
from ..tracer import TracedGraph
from . import boundary
from .alternatives import note, schedule_alternatives
from .api import memory_budget
from .compression import choose, codecs_of, keeps_compression, make_record
from .costs import GraphTables, mfu_dtype, resolve_precision, traced_in_low_precision
from .partition import ChainCosts, partition_chain, uniform_partition
from .recompute import RECOMPUTE_MODES
from .pipeline import PipelinePlan, RankCost, SearchReport, StageKindSummary, StageSpec
from .schedules import (RUNNER_SCHEDULES, SCHEDULES, V_PLACED, bubble_fraction, bubble_ratio, copies,
                        buffer_copies_reason, get_schedule, inflight_microbatches, invalid_reason, ranks_of_stage)
from .sharing import SharedCores, pipeline_cores
from .simulate import StageTimes, simulate
from .stage_sync import exposed_lb, stage_syncs, sync_times
from .segments import COMM_KINDS, SegmentPrices, Segments, price_segments, segment_graph

AXES = ("pp", "dp", "tp")


@dataclass(frozen=True, slots=True, order=True)
class Candidate:
    """One point of the search space; ordering = the deterministic tie-break."""

    pp: int
    dp: int
    tp: int
    num_microbatches: int
    schedule: str


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
    ctx = _Context(traced, segment_graph(traced), cluster, config, budget, global_batch, zero1, partitioner)
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
            "devices, a smaller global batch or more microbatches, "
            # only remedies not already in effect (a bf16 plan was told to use bf16, zero1=True to use ZeRO-1)
            + ("bf16 precision (precision='bf16'), " if resolve_precision(
                config.precision, cluster.device, traced_in_low_precision(traced)) != "bf16" else "")
            + ("ZeRO-1 (zero1=True), " if not zero1 else "")
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
    candidate's fitting partitions wait in a heap by their bound and are simulated (`_Context.exact`) in
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
                                "another num_microbatches / pp / tp.")
        if ctx.refused and len(ctx.refused) == len(schedules):  # only multi-copy schedules were asked for
            raise PipelineError(next(iter(ctx.refused.values())))
        raise PipelineError(f"no valid pipeline configuration; excluded: {dict(excluded)}. Remedy: change what "
                            "excluded them: microbatches= (1f1b needs >= pp, interleaved_1f1b a multiple of pp, zbv and "
                            "dualpipev >= 2 x pp, bitpipe a multiple of an even pp), another schedule=, or a smaller pp "
                            "(a schedule with v stages per rank needs pp x v <= the model's repeated blocks)")
    return cands, excluded, total


class _Context:
    """The fixed inputs of one search plus per-tp price caches (the only state; no globals)."""

    def __init__(self, traced, segments: Segments, cluster: Cluster, config: PlanConfig, budget: int,
                 global_batch: int, zero1: bool, partitioner: str) -> None:
        self.traced, self.segments, self.cluster, self.config = traced, segments, cluster, config
        self.budget, self.global_batch, self.zero1, self.partitioner = budget, global_batch, zero1, partitioner
        self.cache: dict[int, SegmentPrices] = {}
        self.lean_cache: dict[int, SegmentPrices] = {}  # tp -> the memory-lean layout's prices (`prices`)
        self.built: dict[int, tuple] = {}  # tp -> the intra-stage ILP's (problem, pricer), for both layouts
        self.tables = GraphTables()  # the traced graph's facts, shared by the per-tp solves
        self.reserve = 0  # bytes kept out of `budget` (`api.memory_budget`); set by plan_pipeline
        self.overlap_grad_sync = True  # plan_pipeline's argument; the fraction of a dp sync that can hide:
        self.sync_overlap = cluster.device.comm_overlap
        self.refused: dict[str, str] = {}  # schedule -> why the model rules it out (`_enumerate`)
        self.modes = RECOMPUTE_MODES if config.recompute == "auto" else (config.recompute,)
        self.codecs = codecs_of(config)  # data-parallel gradient codecs (`planner.compression`)
        self.evaluated: dict[Candidate, list[dict]] = {}
        self.boundary_codecs = boundary.codecs_of(config.boundary_compression)  # stage-boundary codecs
        self.boundary_prices = boundary.price_codecs(traced, segments.cut_values, self.boundary_codecs,
                                                     config.boundary_rank, cluster.device)
        self.shared: dict[tuple[int, int, int], tuple[SharedCores | None, float]] = {}

    def sharing(self, c: Candidate) -> tuple[SharedCores | None, float]:
        """(cores, scale) of candidate c's simulation (module docstring, "Ranks sharing cores"): without
        `Cluster.sharing` (every GPU preset) (None, 1.0); else `sharing.pipeline_cores`, cached per mesh."""
        key = (c.pp, c.dp, c.tp)
        if key not in self.shared:
            share = self.cluster.sharing
            self.shared[key] = (None, 1.0) if share is None else pipeline_cores(share, *key)
        return self.shared[key]

    def prices(self, tp: int, lean: bool = False) -> SegmentPrices:
        """Per-segment prices on tp devices of the time-optimal intra-stage layout, or (`lean`) of the
        memory-lean one (`ilp.solve_lean`), each solved once per tp."""
        cache = self.lean_cache if lean else self.cache
        if tp not in cache:
            cache[tp] = price_segments(self.traced, self.segments, tp, self.cluster, self.config, self.tables, lean,
                                       self.built)
        return cache[tp]

    def topology(self, c: Candidate) -> MeshTopology:
        return MeshTopology(self.cluster, (c.pp, c.dp, c.tp), AXES)

    def _scale(self, c: Candidate) -> float:
        return self.global_batch / (c.dp * c.num_microbatches) / self.segments.trace_batch

    def _state(self, pr: SegmentPrices, dp: int) -> np.ndarray:
        return pr.params_bytes + pr.grads_bytes + pr.optimizer_bytes / (dp if self.zero1 else 1)

    def lower_bound_s(self, c: Candidate, compressed: bool = True) -> float:
        """LB of the module docstring (sync term 0 when a codec may compress it and `compressed`)."""
        pr = self.prices(c.tp)
        f, b, w = pr.time_s(self._scale(c))
        shared = self.sharing(c)[1]
        sync = 0.0
        if not (self.codecs and compressed):
            whole = collective_time_s("all_reduce", float(pr.grads_bytes.sum()) / c.pp, self.topology(c), ("dp",))
            sync = (1 - self.sync_overlap) * whole  # at most the fraction o of a sync hides (a lean stage's
            # backward, which the sync may overlap, can be longer than this layout's: no window term here)
        return c.num_microbatches * float((f + b + w).sum()) * shared / c.pp + sync

    def _one_window(self, c: Candidate) -> bool:
        """Whether every rank of c holds one stage and runs alone on its device: then the window its stage syncs
        overlap (that stage's last backward) lasts at most one microbatch's B (= I + W) seconds."""
        return (get_schedule(c.schedule).virtual_stages == 1 and copies(c.schedule) == 1
                and self.sharing(c)[0] is None)

    def _p2p_s(self, nbytes: float, c: Candidate, topo: MeshTopology) -> float:
        if c.pp == 1 or nbytes == 0:
            return 0.0
        return (collective_time_s("send_recv", nbytes / c.tp, topo, ("pp",))
                + collective_time_s("all_gather", nbytes, topo, ("tp",)))

    def evaluate(self, c: Candidate) -> list[dict]:
        """Price one candidate's partitions by their lower bound: the fitting ones ({"step_lb", ...}, to be
        simulated by `exact`), or [{"need_bytes"}] (the smallest need) when none fits the memory budget.

        The DP partition (balanced, memory-aware) and the even split are both priced and the better feasible
        one kept: the DP is exact for v = 1, but for v > 1 a rank's time sums its chunks and the DP bounds
        chunk memory conservatively (budget / v each), and neither sees the dp gradient sync. Each stage
        takes the cheapest recomputation mode that fits (`partition.py`; `PlanConfig.recompute` other than
        "auto" allows only that mode). With boundary compression allowed (`planner.boundary`), the partitions
        are priced again with each cut's codec chosen (`boundary.choose`), each carrying the uncompressed
        price of its own stages ("boundary"); `exact` keeps the compressed one under "auto" only when its
        simulated step is >= `boundary.MIN_GAIN` faster, a forced codec always. Results are cached per
        candidate."""
        if c not in self.evaluated:
            self.evaluated[c] = self._evaluate(c)
        return self.evaluated[c]

    def _evaluate(self, c: Candidate) -> list[dict]:
        """`evaluate` with the time-optimal stage layout; where memory binds on a tp > 1 mesh (no partition
        fits, a stage recomputes, or the balanced cut is not the one without a memory limit) again with each
        stage free to take the memory-lean layout instead (`ilp.solve_lean`, priced once per tp only then):
        a mode of the partition DP is then a (layout, recomputation) pair (`partition.py`). Where memory does
        not bind the time-optimal layout's partition is the best one, so the lean layout is not priced."""
        if c.tp in self.lean_cache:  # priced already: one DP over both layouts (the same result where memory
            return self._evaluate_layouts(c, (False, True))[0]  # does not bind: the fastest mode everywhere)
        plain, binds = self._evaluate_layouts(c, (False,))
        if c.tp == 1 or not binds:
            return plain
        return self._evaluate_layouts(c, (False, True))[0]

    def _evaluate_layouts(self, c: Candidate, layouts: tuple[bool, ...]) -> tuple[list[dict], bool]:
        """(`evaluate`'s results with stages free to take any of `layouts` (False: time-optimal, True: lean),
        whether memory binds: see `_evaluate`)."""
        seg, L = self.segments, self.segments.num_blocks
        v, p, m = get_schedule(c.schedule).virtual_stages, c.pp, c.num_microbatches
        scale, topo = self._scale(c), self.topology(c)
        by_layout, t_by, act_by = {}, {}, {}
        for lean in layouts:
            pr = self.prices(c.tp, lean)
            f, b, w = pr.time_s(scale)
            by_layout[lean] = (f, b, w, self._state(pr, c.dp))
            for k in self.modes:
                t_by[(lean, k)] = f + b + w + pr.rc_extra_lin[k] * scale
                act_by[(lean, k)] = (pr.act_bytes + pr.rc_act_delta[k]) * scale
        # modes of the partition DP: fastest per block first (`partition.py`); ties keep (layout, mode) order;
        # a mode no faster than an earlier one that holds no more bytes anywhere can never be chosen: dropped
        order = sorted(t_by, key=lambda k: float(t_by[k][1:L + 1].sum()))
        state_of = {k: by_layout[k[0]][3] for k in order}
        modes = tuple(k for i, k in enumerate(order) if not any(
            (state_of[j] <= state_of[k]).all() and (act_by[j] <= act_by[k]).all() and (t_by[j] <= t_by[k]).all()
            for j in order[:i]))
        rank = [ranks_of_stage(c.schedule, s, p) for s in range(p * v)]  # per copy (bitpipe holds 2)
        held = copies(c.schedule)
        inflight = [inflight_microbatches(c.schedule, p, m, r) for r in range(p)]
        # no partition fits when the average rank does not (state + the leanest mode's activations, each
        # kept for at least the fewest in-flight microbatches): skip the DP
        need_lb = min(held * (float(by_layout[lean][3].sum()) + min(inflight) * float(np.minimum.reduce(
            [act_by[(lean, k)] for k in self.modes]).sum())) / p for lean in layouts)
        if need_lb > self.budget:
            return [{"need_bytes": need_lb}], True
        p2p = {x: self._p2p_s(x * scale, c, topo) for x in set(seg.cut_fwd_bytes) | set(seg.cut_bwd_bytes)}
        cut_f, cut_b = tuple(p2p[x] for x in seg.cut_fwd_bytes), tuple(p2p[x] for x in seg.cut_bwd_bytes)
        arrays = (by_layout, t_by, act_by, modes)
        plain, binds = self._partitions(c, arrays, cut_f, cut_b, rank, inflight, held, topo)
        if not self.boundary_codecs or c.pp == 1 or "step_lb" not in plain[0]:
            return plain, binds
        codecs, comp_f, comp_b = boundary.choose(self.boundary_codecs, self.config.boundary_compression != "auto",
                                                 self.boundary_prices, lambda x: self._p2p_s(x, c, topo),
                                                 seg.cut_fwd_bytes, seg.cut_bwd_bytes, scale)
        comp, _ = self._partitions(c, arrays, comp_f, comp_b, rank, inflight, held, topo)
        if "step_lb" not in comp[0]:
            return plain, binds
        for res in comp:  # the uncompressed price of the same stages, and what each boundary sends
            again = self._price_partition(c, res["cuts"], res["modes"], (by_layout, act_by, cut_f, cut_b),
                                          rank, inflight, topo)
            choices = tuple(boundary.BoundaryChoice(
                k, codecs[j], 8 if codecs[j] == "int8" else None,
                self.config.boundary_rank if codecs[j] == "lowrank" else None,
                self.boundary_prices[codecs[j]].fwd_ratio[j] if codecs[j] != "none" else 1.0,
                comp_f[j] + comp_b[j], cut_f[j] + cut_b[j]) for k, j in enumerate(res["cuts"][1:-1]))
            res["boundary"] = (dict(again, partition=res["partition"], cuts=res["cuts"], modes=res["modes"]),
                               choices)
        return (comp if self.config.boundary_compression != "auto" else plain + comp), binds

    def _partitions(self, c: Candidate, arrays, cut_f, cut_b, rank, inflight, held: int, topo
                    ) -> tuple[list[dict], bool]:
        """The DP partition and the even split of one candidate for boundary transfer seconds cut_f / cut_b
        per cut (`evaluate`), each priced by `_price_partition`: (the fitting ones, or [{"need_bytes"}];
        whether memory binds: none fits, a stage takes a mode other than the fastest, or the DP's cut is
        slower than the one without a memory limit). A mode is a (lean layout?, recomputation) pair."""
        by_layout, t_by, act_by, modes = arrays
        L, v, p = self.segments.num_blocks, get_schedule(c.schedule).virtual_stages, c.pp
        state_by = {k: by_layout[k[0]][3] for k in modes}
        ends = tuple((float(t_by[k][0]), float(t_by[k][L + 1]), float(state_by[k][0]), float(act_by[k][0]),
                      float(state_by[k][L + 1]), float(act_by[k][L + 1])) for k in modes)
        t0, a0, s0 = t_by[modes[0]], act_by[modes[0]], state_by[modes[0]]
        chain = ChainCosts(tuple(t0[1:L + 1]), tuple(s0[1:L + 1]), tuple(a0[1:L + 1]), *ends[0][:2],
                           ends[0][2], ends[0][3], ends[0][4], ends[0][5], cut_f, cut_b,
                           tuple(("lean:" if lean else "") + k for lean, k in modes),
                           tuple(tuple(t_by[k][1:L + 1]) for k in modes),
                           tuple(tuple(act_by[k][1:L + 1]) for k in modes),
                           tuple(tuple(state_by[k][1:L + 1]) for k in modes), ends)
        limit = self.budget / (v * held)
        stage_inflight = tuple(inflight[r[0]] for r in rank)
        options = {}
        binds = False
        if self.partitioner == "dp":
            part = partition_chain(chain, p * v, stage_inflight, limit)
            if part is not None:
                options[part.cuts] = ("dp", part.modes)
                if not any(part.modes):  # every stage in the fastest mode: is the cut the unlimited one?
                    free = partition_chain(chain, p * v, stage_inflight)
                    binds = free is not None and free.max_stage_s < part.max_stage_s
        cuts = uniform_partition(L, p * v)
        if cuts not in options:
            options[cuts] = ("uniform", tuple(chain.stage_mode(s, p * v, cuts[s], cuts[s + 1], stage_inflight[s], limit)
                                              for s in range(p * v)))
        results = []
        for cuts, (how, chosen) in options.items():
            named = tuple(modes[k] for k in chosen)
            res = self._price_partition(c, cuts, named, (by_layout, act_by, cut_f, cut_b), rank, inflight, topo)
            results.append(dict(res, partition=how, cuts=cuts, modes=named))
        fits = [r for r in results if r["need_bytes"] <= self.budget]
        binds = binds or not fits or any(k != modes[0] for r in fits for k in r["modes"])
        return fits or [{"need_bytes": min(r["need_bytes"] for r in results)}], binds

    def _price_partition(self, c: Candidate, cuts, modes, arrays, rank, inflight, topo) -> dict:
        """Stages, ranks, memory (closed-form in-flight counts, equal to the simulated ones: tested) and a
        lower bound on the step time of one partition, stage s in recomputation mode modes[s] (module
        docstring, step 3). Bound: rank r starts no earlier than microbatch 0's forward chain reaches its
        first stage (head) and then computes m x its per-microbatch seconds (busy); with full backwards
        (no B/W split), its last backward, on its first stage, is followed by the backward chain below it
        (tail); its gradient all-reduce delays its end by at least (1 - o) sync + o max(0, sync - W) (`stage_sync.exposed_lb`;
        o the hidden fraction, W its one stage's B when it holds one stage alone on its device, else
        unbounded): step >= max_r head + busy + max(tail, that + ZeRO-1's broadcast) + the tied exchange.
        `exact` simulates the partition's action list. modes[s] = (lean layout?, recomputation mode) of stage
        s (`_partitions`)."""
        L = self.segments.num_blocks
        by_layout, act_by, cut_f, cut_b = arrays
        S, p, m = len(cuts) - 1, c.pp, c.num_microbatches
        scale, shared = self._scale(c), self.sharing(c)[1]  # shared: compute seconds -> simulated (sharing)
        stages = []
        for s in range(S):
            i, j = cuts[s], cuts[s + 1]
            lean, rc = modes[s]
            pr = self.prices(c.tp, lean)
            f, b, w, state = by_layout[lean]
            segs = ([0] if s == 0 else []) + list(range(i + 1, j + 1)) + ([L + 1] if s == S - 1 else [])
            f_c = float(f[segs].sum())
            b_c = float(b[segs].sum() + pr.rc_extra_lin[rc][segs].sum() * scale)
            stages.append(dict(segs=segs, blocks=(i, j - 1), fwd=f_c + (cut_f[j] if s < S - 1 else 0),
                               bwd=b_c + (cut_b[i] if s > 0 else 0), wgrad=float(w[segs].sum()),
                               fwd_c=f_c, bwd_c=b_c, state=float(state[segs].sum()),
                               act=float(act_by[modes[s]][segs].sum()), rank=rank[s][0], recompute=rc, lean=lean,
                               grads=float(pr.grads_bytes[segs].sum()), params=float(pr.params_bytes[segs].sum())))
        # transfers: the simulator charges them across ranks only; the bound and the byte count likewise
        p2p_f, p2p_b = [cut_f[cuts[s + 1]] for s in range(S - 1)], [cut_b[cuts[s + 1]] for s in range(S - 1)]
        held = len(rank[0])
        cross = [[rank[s][k] != rank[s + 1][k] for s in range(S - 1)] for k in range(held)]
        ranks, bounds = [], []
        split = c.schedule in V_PLACED  # backward split into I and W: no tail bound
        syncs, ready = stage_syncs(c.dp, [st["grads"] for st in stages], topo, self.cluster.device,
                                   self.overlap_grad_sync)
        # the last stage returns the model's outputs a step reads (`runtime.pipeline.step_returns`: its own loss
        # alone, when it has one) of each microbatch whole over dp and tp, so its ranks hold one microbatch of them
        from ..runtime.pipeline import step_returned_share  # runtime imports the planner
        out_bytes = (self.prices(c.tp).plan.cost.memory_bytes.get("outputs", 0) * scale * c.dp
                     * step_returned_share(self.traced))
        for r in range(p):
            mine = [s for s in range(S) if r in rank[s]]  # model stages r holds (bitpipe: of both copies)
            tot = {k: sum(stages[s][k] for s in mine) for k in ("fwd", "bwd", "wgrad", "state", "act")}
            grads = sum(stages[s]["grads"] for s in mine)
            sync, after = sum(sum(syncs[s]) for s in mine), 0.0
            if self.config.zero1 == "dp":  # torch's ZeroRedundancyOptimizer runs it: it broadcasts the stepped
                # parameters after the all-reduce (an all-gather's bytes more than the distributed optimizer's)
                params = sum(stages[s]["params"] for s in mine)
                after = collective_time_s("all_gather", params, topo, ("dp",))
            window = sum(stages[s]["bwd_c"] + stages[s]["wgrad"] for s in mine) * shared \
                if self._one_window(c) else math.inf  # the simulated B of its one stage
            heads, tails = [], []
            for k in range(held):
                first = min((s for s in range(S) if rank[s][k] == r), default=None)
                if first is not None:
                    heads.append(sum(stages[s]["fwd_c"] * shared + p2p_f[s] * cross[k][s] for s in range(first)))
                    tails.append(sum((stages[s]["bwd_c"] + stages[s]["wgrad"]) * shared + p2p_b[s] * cross[k][s]
                                     for s in range(first)))
            tail = 0.0 if split or held > 1 else tails[0]
            busy = m / held * sum(stages[s]["fwd_c"] + stages[s]["bwd_c"] + stages[s]["wgrad"]
                                  for s in mine) * shared
            bounds.append((min(heads) + busy, tail))
            held_out = out_bytes if S - 1 in mine else 0.0
            ranks.append(dict(stages=tuple(mine), **tot, grads=grads, sync=sync, after=after, window=window,
                              outputs=held_out, inflight=inflight[r],
                              memory=tot["state"] + held_out + inflight[r] * tot["act"]))
        codec, codec_sync = self._compression(c, stages, ranks, topo)
        for r, rc in enumerate(ranks):  # the sync each rank runs: the chosen codec's, or the plain all-reduce
            rc["plain_sync"] = rc["sync"]
            rc["sync"] = codec_sync[codec][r] if codec != "none" else rc["sync"]
        # a valid bound for both passes (`_bound_search`): each rank's cheaper exposed sync (PowerSGD's in full)
        lb = max(head_busy + max(tail, rc["after"] + min(
            rc["sync"] if codec == "powersgd" else exposed_lb(rc["sync"], rc["window"], self.sync_overlap),
            exposed_lb(rc["plain_sync"], rc["window"], self.sync_overlap))) for (head_busy, tail), rc in zip(bounds, ranks))
        tied = 0.0
        shared_grads = self.prices(c.tp, stages[0]["lean"]).shared_grad_bytes  # the first stage's copy
        if shared_grads and any(rank[0][k] != rank[S - 1][k] for k in range(held)):
            tied = collective_time_s("send_recv", shared_grads, topo, ("pp",))
        seg = self.segments
        sent = [0.0] * p  # bytes each device sends per step: activations out of its stages, gradients back
        for k in range(held):
            for s in range(S - 1):
                if cross[k][s]:
                    sent[rank[s][k]] += seg.cut_fwd_bytes[cuts[s + 1]]
                    sent[rank[s + 1][k]] += seg.cut_bwd_bytes[cuts[s + 1]]
        p2p_bytes = m / held * scale * max(sent) / c.tp
        # BitPipe: the two copies of a stage exchange gradients (Wu et al. Sec. 3: eager, overlapping compute)
        copy_sync = tuple(collective_time_s("send_recv", st["grads"], topo, ("pp",))
                          for st in stages) if held > 1 else None
        return dict(step_lb=lb + tied, tied_grad_sync=tied, stages=stages, ranks=ranks, scale=scale,
                    stage_sync=(syncs, ready),
                    p2p=(tuple(p2p_f), tuple(p2p_b)), p2p_bytes=p2p_bytes, copy_sync=copy_sync,
                    need_bytes=max(r["memory"] for r in ranks), compression=codec)

    def _compression(self, c: Candidate, stages: list[dict], ranks: list[dict], topo: MeshTopology
                     ) -> tuple[str, dict[str, list[float]]]:
        """(chosen codec, codec -> per-rank seconds of the dp sync with it) for one partition (module
        docstring, step 3): per codec a rank's compressed all-reduces + codec compute; "auto" compares the
        slowest rank's with the uncompressed sync minus what can hide under the rank's backward (m
        microbatches of B + W)."""
        if c.dp == 1 or not self.codecs:
            return "none", {}
        device, m = self.cluster.device, c.num_microbatches
        grads = [[g for s in r["stages"] for seg in stages[s]["segs"]
                  for g in self.prices(c.tp, stages[s]["lean"]).grad_shapes[seg]] for r in ranks]
        per_rank = {codec: [sum(compressed_sync_time_s(
            compressed_sync(codec, [shape for shape, _ in g], g[0][1] if g else 4, self.config.powersgd_rank),
            topo, ("dp",), device)) for g in grads] for codec in self.codecs}
        floor = max(max(0.0, r["sync"] - device.comm_overlap * m * (r["bwd"] + r["wgrad"])) for r in ranks)
        return choose(self.config.compression, floor, {k: max(v) for k, v in per_rank.items()}), per_rank

    def exact(self, c: Candidate, res: dict) -> dict:
        """Simulate a partition priced by `_price_partition` (`planner.simulate`: the schedule's own action
        list): step = the last rank's end including its dp gradient all-reduce, + the tied exchange;
        memory with the simulated peak in-flight activation bytes per rank. Returns res with "step_s",
        "pipeline" (compute makespan), "bubble", "dp_grad_sync" (the exposed part), or {"need_bytes"} when
        the simulated memory exceeds the budget."""
        out = self._simulate(c, res)
        if "boundary" not in res or "step_s" not in out:
            return out
        again, choices = res["boundary"]  # the same stages without boundary compression
        plain = self._simulate(c, again)
        if (self.config.boundary_compression == "auto" and "step_s" in plain
                and out["step_s"] * (1 + boundary.MIN_GAIN) > plain["step_s"]):
            return plain
        return dict(out, boundary_compression=boundary.BoundaryCompression(
            self.config.boundary_compression, out["step_s"], plain.get("step_s", math.inf), self.config.boundary_rank,
            choices))

    def _simulate(self, c: Candidate, res: dict) -> dict:
        """`exact` for one priced partition: its simulated step with the chosen dp sync ("step_s") and with
        the uncompressed one ("uncompressed_step_s"; equal when no gradient codec is chosen)."""
        st, ranks = res["stages"], res["ranks"]
        cores, shared = self.sharing(c)  # (None, 1.0) on a GPU cluster: the prices as they are

        def run(codec):
            return simulate(c.schedule, c.pp, c.num_microbatches, StageTimes(
                tuple(s["fwd_c"] * shared for s in st), tuple(s["bwd_c"] * shared for s in st),
                tuple(s["wgrad"] * shared for s in st), res["p2p"][0], res["p2p"][1], tuple(s["act"] for s in st),
                res["copy_sync"], **sync_times(res, codec, self.sync_overlap)), cores)

        sim = run(res["compression"])
        plain = sim if res["compression"] == "none" else run("none")
        ranks = [dict(r, inflight=sim.inflight_microbatches[k],
                      memory=r["state"] + r["outputs"] + sim.peak_inflight_bytes[k])
                 for k, r in enumerate(ranks)]
        need = max(r["memory"] for r in ranks)
        if need > self.budget:
            return {"need_bytes": need}
        tied = res["tied_grad_sync"]
        return dict(res, ranks=ranks, need_bytes=need, step_s=sim.makespan_s + tied,
                    pipeline=sim.compute_end_s, bubble=sim.bubble_s, dp_grad_sync=sim.makespan_s - sim.compute_end_s,
                    rank_bubble=sim.bubble_fraction, uncompressed_step_s=plain.makespan_s + tied,
                    uncompressed_dp_grad_sync=plain.makespan_s - plain.compute_end_s)

    def to_plan(self, c: Candidate, res: dict, report: SearchReport, search: str, uncompressed_step_s: float,
                alternatives: tuple = ()) -> PipelinePlan:
        pr, seg, L = self.prices(c.tp), self.segments, self.segments.num_blocks
        sched = get_schedule(c.schedule)
        per_stage = c.dp * c.tp
        stages = tuple(StageSpec(
            s, st["rank"], st["blocks"][0], st["blocks"][1], 0 in st["segs"], L + 1 in st["segs"],
            tuple(range(st["rank"] * per_stage, (st["rank"] + 1) * per_stage)),
            tuple(dict.fromkeys(n for k in st["segs"] for n in seg.nodes[k])),
            st["fwd"], st["bwd"], st["wgrad"], int(st["state"]), int(st["act"]), st["recompute"], st["lean"],
            ", ".join(seg.block_kinds[st["blocks"][0]:st["blocks"][1] + 1]))
            for s, st in enumerate(res["stages"]))
        ranks = tuple(RankCost(r, rc["stages"], rc["fwd"] + rc["bwd"] + rc["wgrad"], rc["inflight"], int(rc["memory"]))
                      for r, rc in enumerate(res["ranks"]))
        world = self.cluster.world_size
        fwd_flops, bwd_flops = graph_flops(self.traced.graph_module)
        flops = int((fwd_flops + bwd_flops) * self.global_batch / seg.trace_batch)
        peak = float(self.cluster.device.peak_flops_per_s[mfu_dtype(self.traced, self.cluster.device)])
        step = res["step_s"]
        s = pr.plan.solver
        return PipelinePlan(
            mesh=MeshSpec(AXES, (c.pp, c.dp, c.tp)), schedule=c.schedule, torch_schedule=sched.torch_class,
            virtual_stages=sched.virtual_stages, global_batch=self.global_batch, num_microbatches=c.num_microbatches,
            microbatch_size=self.global_batch // (c.dp * c.num_microbatches), trace_batch=seg.trace_batch,
            stages=stages, ranks=ranks, bubble_fraction=bubble_fraction(res["pipeline"], res["bubble"]),
            bubble_ratio=bubble_ratio(res["pipeline"], res["bubble"]), step_time_s=step,
            step_breakdown_s={k: res[k] for k in ("pipeline", "bubble", "dp_grad_sync", "tied_grad_sync")},
            flops_per_step=flops, tflops_per_gpu=flops / step / world / 1e12, mfu=flops / step / world / peak,
            peak_flops_per_s=peak, device=self.cluster.device.name,
            stage_kinds=self._kinds(stages, res, c.tp), block_group=seg.group, partition=res["partition"],
            intra_stage_solver={"mesh": str(pr.plan.mesh), "solver": s.solver, "status": s.status,
                                "optimal": s.optimal, "objective_s_at_trace_batch": s.objective_s,
                                "num_groups": s.num_groups, "num_variables": s.num_variables},
            search=report,
            config={"memory_budget_bytes": self.budget + self.reserve, "memory_reserve_bytes": self.reserve,
                    "recompute": self.config.recompute, "zero1": self.zero1, "search": search,
                    "overlap_grad_sync": self.overlap_grad_sync,
                    "partitioner": self.partitioner, "optimizer": self.config.optimizer,
                    "precision": resolve_precision(self.config.precision, self.cluster.device,
                                                   traced_in_low_precision(self.traced)), "cluster": {
                        "nodes": self.cluster.num_nodes, "devices_per_node": self.cluster.devices_per_node}},
            compression=make_record(self.config, res["compression"], step, uncompressed_step_s,
                                    res.get("uncompressed_step_s", step)),
            boundary_compression=res.get("boundary_compression"), alternatives=alternatives,
            intra_stage_plan=pr.plan)

    def _kinds(self, stages: tuple[StageSpec, ...], res: dict, tp: int) -> tuple[StageKindSummary, ...]:
        """One summary per distinct stage kind: compute and collectives per microbatch, memory at peak."""
        by_kind: dict[str, list[int]] = {}
        for st in stages:
            by_kind.setdefault(st.kind, []).append(st.index)
        out = []
        for kind, idx in by_kind.items():
            st, segs = res["stages"][idx[0]], res["stages"][idx[0]]["segs"]
            pr = self.prices(tp, st["lean"])
            comm = {k: float(pr.comm_lin_s[k][segs].sum() * res["scale"] + pr.comm_fixed_s[k][segs].sum())
                    for k in COMM_KINDS}
            total = float((pr.fwd_lin[segs].sum() + pr.bwd_lin[segs].sum() + pr.rc_extra_lin[st["recompute"]][segs].sum())
                          * res["scale"] + pr.fwd_fixed[segs].sum() + pr.bwd_fixed[segs].sum())
            mem = {"params": int(pr.params_bytes[segs].sum()), "grads": int(pr.grads_bytes[segs].sum())}
            mem["optimizer"] = int(st["state"]) - mem["params"] - mem["grads"]
            mem["activations"] = int(st["act"] * res["ranks"][st["rank"]]["inflight"])
            if st["segs"][-1] == self.segments.num_blocks + 1:  # the last stage: one microbatch of the returned outputs (`_price_partition`)
                mem["outputs"] = int(res["ranks"][st["rank"]]["outputs"])
            mem["total"] = sum(mem.values())
            out.append(StageKindSummary(kind, tuple(idx), total - sum(comm.values()), comm, mem))
        return tuple(out)
