"""Simulated vs measured step time per pipeline schedule on 4 gloo ranks of this machine (issue 14): gpipe,
1f1b, interleaved_1f1b, zbv, dualpipev and bitpipe, each training the same GPT-2 (8 blocks, hidden 512, 8
heads, vocab 1024, sequence 128, global batch 8 = 8 microbatches of 1) through `auto_parallelize` +
`pm.step` + AdamW.

Plans: made on a calibration profile of this machine (`cost_model.calibrate`; `--profile`, else calibrated
first, ~1 min): each schedule its own plan, gpipe / 1f1b on 4 stages, the others on 8 (bitpipe: two mirrored V
pipelines, two weight copies per stage). (Until round 16 dualpipev and bitpipe ran the interleaved plan's cut
with the schedule renamed, which `Plan.from_json` now refuses: interleaved places stages in a loop, those in a V.)

Simulated (`simulate_schedule`): the schedule's own action list (`planner.simulate`) with
- per model stage the solo seconds of F, I (input gradient) and W (weight gradient) of its segments priced
  by the cost model on the profile's device as ONE process sees it (`planner.segments.price_segments`), and
  the activation transfer between ranks (`send_recv` of the cut's bytes on the profile's 4-process link);
- the 4 ranks sharing the machine's cores (`planner.sharing`, processor sharing): each of k ranks computing
  at once runs slower by the cost model's price on `Profile.device_for(k)` (the measured contention of k
  processes) over its price alone, for the whole model's segments (compute) and for the rank's AdamW step
  (optimizer);
- the runtime's fixed host cost per action (round 16, issue 14): each F / I / W / B its kind's seconds, each
  cross-rank send and receive theirs, and the step's set-up, from the profile's `DeviceSpec.pipeline_action`
  (measured by calibration with torch's runtime, `cost_model.pipeline_actions`); the "before" column prices
  without it (measured factors), as until round 15;
- zbv's and dualpipev's split backward priced as I + W = B in compute: torch's `stage_backward_input` +
  `stage_backward_weight` on a GPT-2 block (hidden 512, sequence 128, one thread) took 38.9 ms against
  39.8 ms for one full backward (30 runs each, medians), so running autograd in two passes adds no
  measurable compute; but the split walks the stage's autograd graph in Python (round 19: ~2-3 ms per I / W
  pair on a quick-size block, measured per schedule), priced per node on each W action
  (`PipelineActionCost.split_backward_per_node_s` x the stage's ATen ops + parameter tensors), and since round 26
  per byte of the stage's weight gradients (`split_backward_per_byte_s` x `StageTimes.weight_grad_bytes`: W adds
  fresh gradients into `.grad` in Python; r26e measured zbv's I + W at full size 58-69 ms per rank and step above
  the same blocks' full backwards, where the per-node price charged 17);
- gloo's threads' CPU per byte of every transfer at both ends (round 19, `comm_thread_per_byte_s`, with
  the cut's bytes as `StageTimes.p2p_bytes`) and of BitPipe's twin exchange (in `copy_exchange_pack_s`), and
  their CPU per P2P op for each tensor of a transfer (round 20, `StageTimes.p2p_ops`: the cut's values, 2 for
  this GPT-2: hidden states and attention mask) and for the exchange's isend and irecv; the "before" column
  prices as until round 19 (one op per transfer, the exchange's ops uncharged);
- what the runtime does besides: the tied wte / lm_head gradient exchange after the schedule between the
  ranks holding stage 0 and stage S - 1 (when they differ), BitPipe's twin-copy gradient exchange of every
  stage (its wire time, and since round 18 the host work of packing / summing it on each copy's rank,
  `cost_model.pipeline_actions.copy_exchange_pack_s`), and each rank's AdamW step over the parameters it
  holds (`cost_model.compute.optimizer_step_time_s`;
  BitPipe holds and steps two weight copies; the counts are taken from the segments and checked against
  the runtime's `pm.parameters()`).

Measured: every rank builds all six `PipelineModule`s first, then `WARMUP` untimed rounds and `ROUNDS` timed
rounds, each round one step of every schedule, in an order of its own (`step_order`: round r in
`_steptime_workers.round_order`'s permutation seeded by r, the same on every rank; round 25: until then every round
ran gpipe first and each schedule after the same neighbour), so that load from other jobs hits all alike; a step
is rank 0's wall time of `pm.step` + `opt.step()` between two barriers, and each rank's CPU (process) time
of it; one thread per rank. Reported per schedule: simulated ms in three variants (the measured sharing
factors; ideal sharing of the profile's cores, factor(k) = max(1, k / cores); one core per rank as on a GPU
cluster), measured median (min-max) ms, the cost model's solo compute of all ranks beside their measured CPU
time, per variant the orders, Spearman's rank correlation and the schedule pairs ordered alike, and (round 20)
per rank its priced solo work beside its measured process CPU, and (round 22) per rank the step's minor page faults
and system CPU (`getrusage`): at full size the schedules that hold more activations fault pages in again every
step (round 22, load ~25: gpipe 7-17 thousand per rank per step, interleaved_1f1b up to 14 thousand, 1f1b none; with
glibc's malloc thresholds pinned in the ranks as the calibration pins them, `cost_model.measure.pin_allocator`, all
but gpipe none), CPU the cost model does not price; and which schedule pairs the measurement orders (round 25, issue 14; before: a
pair "decided" when >= 80% of the rounds ordered it alike, which at full size decided 0 of 15 pairs in 9 rounds):
per pair A vs B the rounds A was faster / slower in, the exact sign test on them, Holm's correction over the 15
pairs at family-wise error 5% (`benchmarks.paired_rounds`: the chance that any pair reported as decided is ordered
by noise alone is at most 5%; nothing can be decided in fewer than 10 rounds), the median per-round ratio A / B with
its 95% bootstrap interval, and the simulated A / B; per variant how many decided pairs it orders alike, naming the
others. Paired per round, a slow minute of the shared machine cancels in A / B: interleaving is what makes the order
meaningful under load, but the absolute milliseconds of a loaded run are not idle figures. The same test on all ranks'
CPU per step (process time) against the priced solo work: with more ranks than cores the work orders the schedules
(round 16), and CPU time moves far less with outside load than the wall clock (round 25 at load 30-55: the full-size
steps decided 0 of 15 pairs, their CPU 12 of 15).

The "first touch" column (round 23, rule of round 27): the measured factors plus the first touch of memory
(`StageTimes.pool_bytes`, `PipelineActionCost.first_touch_per_byte_s`, calibrated; `planner.first_touch`): every
rank's heap keeps the largest in-flight activation peak of the six schedules (`simulate_all`), and each action that
raises the rank's live level (activations + the weight gradients its first backwards allocate anew) above it pays
the kernel's page faults; with the per rank bytes it prices beside the measured faults x 4 KiB. Round 27 (r27c,
`getrusage` per action): a step's new pages are its first backwards' (gpipe's gradients, allocated while all m
microbatches' activations are live), not its forwards' (0-2 pages per step), and they do not follow the schedule
stepped before (round 23-26 priced the previous schedule's activation peak as the pool).

    PYTHONPATH=. python -m benchmarks.bench_schedules_runtime [--profile P.json] [--rounds 24] [--json STEPS.json]
    PYTHONPATH=. python -m benchmarks.bench_schedules_runtime --profile P.json --measured STEPS.json  # report again
    PYTHONPATH=. python -m benchmarks.bench_schedules_runtime --quick   # GPT hidden 64, vocab 256, seq 32, 40 rounds

Time (the lead's quiet re-run, round 25): calibration, planning and pricing ~2 min idle, building the six modules
and 1 + 24 rounds of six full-size steps (~1.7-1.8 s each idle) ~5-6 min: about 8 min in all (10 rounds took 4:56 at
load ~5 in round 23); `--profile` saves the calibration's minute. Under load every step stretches alike (round 25:
20 rounds at load 30-55 took ~30 min). `--quick` ~1 min idle.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import math
import os
import resource
import statistics
import sys
import tempfile
import time

import numpy as np
import torch
import torch.distributed as dist

import parallelizer
from benchmarks._steptime_workers import round_order
from benchmarks.bench_steptime import spearman
from benchmarks.paired_rounds import ALPHA, min_rounds_to_decide, paired_verdicts
from cost_model.calibrate import QUICK_MESSAGE_SIZES_BYTES, calibrate, load_profile, summary
from cost_model.communication import collective_time_s
from cost_model.compute import optimizer_step_time_s
from cost_model.pipeline_actions import copy_exchange_pack_s
from cost_model.topology import Cluster, MeshTopology
from parallelizer import zoo
from parallelizer.config import PlanConfig
from parallelizer.planner.segments import price_segments, segment_graph
from parallelizer.planner.sharing import SharedCores
from parallelizer.planner.simulate import StageTimes, action_schedule, first_touch_bytes, simulate
from parallelizer.runtime import spawn

GPT = dict(n_layer=8, n_embd=512, n_head=8, vocab_size=1024, batch=8, seq_len=128)
PP, MICROBATCHES, WARMUP, ROUNDS, QUICK_ROUNDS = 4, 8, 1, 24, 40
CLEAR = 0.05  # pairs whose simulated step times differ by at least this fraction are counted apart
SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b", "zbv", "dualpipev", "bitpipe")
ADAMW_BYTES = (4, 4, 8)  # fp32 parameter, gradient, AdamW state (two moments) per element


QUICK = dict(n_embd=64, n_head=2, vocab_size=256, seq_len=32)  # --quick: GPT of width 64, QUICK_ROUNDS rounds


def _traced():
    return parallelizer.trace(*zoo.gpt2(**{**GPT, "batch": GPT["batch"] // MICROBATCHES}))


def make_plans(traced, profile_path: str) -> dict[str, parallelizer.Plan]:
    """Plan per schedule on the profile (module docstring): each schedule its own plan."""
    out = {}
    with contextlib.redirect_stdout(io.StringIO()):  # the solver library prints a banner
        for name in SCHEDULES:
            out[name] = parallelizer.plan(traced, {"pp": PP}, cluster=profile_path, schedule=name,
                                          microbatches=MICROBATCHES)
    return out


@dataclasses.dataclass(frozen=True)
class Pricing:
    """What `simulate_schedule` prices with, from one profile: per-segment solo (F, I, W) seconds at the
    trace batch, the segments, the 4-process topology, the sharing curves and the solo device."""

    f: object
    i: object
    w: object
    segments: object
    prices: object
    topo: MeshTopology
    cores: SharedCores
    device: object
    cpu_count: int  # the profile's core count (`Profile.cpu_count`): the ideal-sharing variant
    plan_prices: object  # (F, I, W) per segment on the device the plans were made on (`Profile.cluster(PP)`)


def pricing(traced, profile_path: str) -> Pricing:
    """Price the segments alone and on `Profile.device_for(k)` for every calibrated k (module docstring)."""
    profile = load_profile(profile_path)
    link = profile.cluster(PP).intra_node_link
    seg = segment_graph(traced)

    def priced(device):
        cluster = Cluster(device, num_nodes=1, devices_per_node=PP, intra_node_link=link, inter_node_link=link)
        with contextlib.redirect_stdout(io.StringIO()):
            return price_segments(traced, seg, 1, cluster, PlanConfig())
    solo = priced(profile.device)
    f, b, w = solo.time_s(1.0)
    total = float((f + b + w).sum())
    numel = sum(math.prod(s) for shapes in solo.grad_shapes for s, _ in shapes)
    tensors = sum(len(shapes) for shapes in solo.grad_shapes)
    opt_solo = optimizer_step_time_s(numel, tensors, ADAMW_BYTES, profile.device)
    compute, optimizer = {}, {}
    for k in sorted(profile.contention):
        dev = profile.device_for(k)
        fk, bk, wk = priced(dev).time_s(1.0)
        compute[k] = float((fk + bk + wk).sum()) / total
        optimizer[k] = optimizer_step_time_s(numel, tensors, ADAMW_BYTES, dev) / opt_solo
    cores = SharedCores.measured(compute, PP, optimizer)
    topo = MeshTopology(profile.cluster(PP), (PP, 1, 1), ("pp", "dp", "tp"))
    return Pricing(f, b, w, seg, solo, topo, cores, profile.device, profile.cpu_count or os.cpu_count(),
                   priced(profile.device_for(PP)).time_s(1.0))


def _segs(plan: parallelizer.Plan, L: int) -> list[list[int]]:
    """Segment indices of each stage: block "<group>.<i>" is segment i + 1, the ops before the first block
    (segment 0) go to the first stage, after the last (L + 1) to the last (`planner.stages`)."""
    stages = plan.pipeline.stages
    out = [[int(b.rsplit(".", 1)[1]) + 1 for b in st.blocks] for st in stages]
    out[0].insert(0, 0)
    out[-1].append(L + 1)
    return out


def simulate_schedule(name: str, plan: parallelizer.Plan, pc: Pricing, pool: tuple[float, ...] | None = None) -> dict:
    """Simulated step of one schedule's plan (module docstring): seconds, with and without core sharing,
    the per-rank parameter counts it assumes and its per-rank peak in-flight activation bytes; with `pool` (per
    rank, the bytes its heap keeps when the step starts) also the "first touch" variant and the bytes it touches
    beyond the pool per rank (`planner.first_touch`)."""
    S, L = len(plan.pipeline.stages), pc.segments.num_blocks
    segs = _segs(plan, L)
    send = lambda nbytes: collective_time_s("send_recv", float(nbytes), pc.topo, ("pp",))  # noqa: E731
    cuts = [g[-1] for g in segs[:-1]]  # the cut after a stage's last block segment
    p2p_f = [send(pc.segments.cut_fwd_bytes[j]) for j in cuts]
    p2p_b = [send(pc.segments.cut_bwd_bytes[j]) for j in cuts]
    # the stages priced here are the plan's: its estimate's per-stage seconds (on the plan's device, with
    # the sends, no recomputation) are these segments' on that device
    f4, i4, w4 = pc.plan_prices
    mine = [float((f4[g] + i4[g] + w4[g]).sum()) + (p2p_f[s] if s < S - 1 else 0) + (p2p_b[s - 1] if s else 0)
            for s, g in enumerate(segs)]
    theirs = plan.pipeline.estimate.stage_s
    if any(abs(a / b - 1) > 1e-6 for a, b in zip(mine, theirs)):
        raise ValueError(f"{name}: stage seconds {mine} differ from the plan's {theirs} (recomputation?)")
    sched = action_schedule(name, PP, MICROBATCHES)
    holds = {r: [sched.model_stage(x) for x, rr in sched.stage_to_rank.items() if rr == r] for r in range(PP)}
    pr = pc.prices
    numel = [sum(math.prod(s) for k in holds[r] for g in segs[k] for s, _ in pr.grad_shapes[g]) for r in range(PP)]
    tensors = [sum(len(pr.grad_shapes[g]) for k in holds[r] for g in segs[k]) for r in range(PP)]
    tied_ranks = {sched.stage_to_rank[c * S + k] for c in range(sched.copies) for k in (0, S - 1)}
    tied = send(pr.shared_grad_bytes) if pr.shared_grad_bytes and len(tied_ranks) > 1 else 0.0
    ops = np.bincount(list(pc.segments.owner.values()), minlength=L + 2)  # ATen ops per segment
    times = StageTimes(
        tuple(float(pc.f[g].sum()) for g in segs), tuple(float(pc.i[g].sum()) for g in segs),
        tuple(float(pc.w[g].sum()) for g in segs),
        tuple(p2p_f), tuple(p2p_b),
        copy_sync_s=tuple(send(pr.grads_bytes[g].sum()) for g in segs) if sched.copies > 1 else None,
        copy_pack_s=tuple(copy_exchange_pack_s(float(pr.grads_bytes[g].sum()), pc.device) for g in segs)
        if sched.copies > 1 else None,
        grad_sync_s=tuple(tied if r in tied_ranks else 0.0 for r in range(PP)),
        optimizer_s=tuple(optimizer_step_time_s(n, t, ADAMW_BYTES, pc.device) for n, t in zip(numel, tensors)),
        action_overhead=pc.device.pipeline_action,
        p2p_bytes=tuple(float(pc.segments.cut_fwd_bytes[j]) for j in cuts),
        p2p_bwd_bytes=tuple(float(pc.segments.cut_bwd_bytes[j]) for j in cuts),
        backward_nodes=tuple(float(sum(ops[g] + len(pr.grad_shapes[g]) for g in segs[k])) for k in range(S)),
        p2p_ops=tuple(float(len(pc.segments.cut_values[j])) for j in cuts),
        weight_grad_bytes=tuple(float(pr.grads_bytes[g].sum()) for g in segs),
        act_bytes=tuple(float(pr.act_bytes[g].sum()) for g in segs))
    ms = {variant: simulate(name, PP, MICROBATCHES, times, cores).makespan_s * 1e3 for variant, cores in (
        ("measured", pc.cores), ("ideal", SharedCores.ideal(pc.cpu_count, PP)), ("own", None))}
    # "before": as priced until round 19 (one op per transfer, the exchange's two ops uncharged)
    old = dataclasses.replace(times, p2p_ops=None, copy_pack_s=None if times.copy_pack_s is None else tuple(
        x - 2 * pc.device.pipeline_action.comm_thread_s * (x > 0) for x in times.copy_pack_s))
    ms["before"] = simulate(name, PP, MICROBATCHES, old, pc.cores).makespan_s * 1e3
    rank_work = [b + o for b, o in zip(simulate(name, PP, MICROBATCHES, times).busy_s, times.optimizer_s)]
    work = sum(rank_work)
    before = sum(simulate(name, PP, MICROBATCHES, old).busy_s)
    peak = simulate(name, PP, MICROBATCHES, times).peak_inflight_bytes
    touched = None
    if pool is not None:  # round 23 / 27: first touch of the live level beyond the kept heap
        touch = dataclasses.replace(times, pool_bytes=tuple(pool))
        ms["first touch"] = simulate(name, PP, MICROBATCHES, touch, pc.cores).makespan_s * 1e3
        res = simulate(name, PP, MICROBATCHES, touch)
        touched = [float(first_touch_bytes(res.compiled, touch)[idx].sum()) for idx in res.compiled.by_rank]
    return {"peak_bytes": list(peak), "touched_bytes": touched, "ms": ms, "work_ms": work * 1e3, "rank_work_ms": [x * 1e3 for x in rank_work], "work_before_ms": (before + sum(times.optimizer_s)) * 1e3,
            "numel": numel, "tensors": tensors, "stages": S, "times": times}


def step_order(warmup: int, rounds: int) -> list[str]:
    """The schedules in the order `bench_rank` steps them: round r (warm-up rounds included) in
    `_steptime_workers.round_order`'s order for round r (seeded by r, the same on every rank): every schedule runs
    once per round, no schedule always first or after the same neighbour (a randomised complete block design)."""
    return [SCHEDULES[k] for r in range(warmup + rounds) for k in round_order(list(SCHEDULES), r)]


def predecessors(order: list[str], warmup: int) -> dict[str, list[str]]:
    """Per schedule, the schedule stepped just before each of its timed steps in `order` (`step_order`; the very
    first step of a run has none: it follows itself, as a training loop would)."""
    out: dict[str, list[str]] = {name: [] for name in SCHEDULES}
    for n, name in enumerate(order):
        if n >= warmup * len(SCHEDULES):
            out[name].append(order[n - 1] if n else name)
    return out


def simulate_all(plans: dict[str, parallelizer.Plan], pc: Pricing) -> dict:
    """`simulate_schedule` of every schedule, each also with the "first touch" variant (round 27): every rank's heap
    keeps, when a timed step starts, the largest in-flight activation peak of the six schedules on that rank (each
    rank stepped all six in the warm-up round, and a step's forwards then touch no new pages: r27c measured 0-2 per
    step), and each step pays the first touch of its live level above that: its activations plus the weight
    gradients its first backwards allocate anew (`planner.first_touch`; at full size only gpipe's live peak is above
    it, by its gradients). Until round 26 the pool was the activation peak of the schedule stepped just before, and
    the touch was charged to forwards: measured, the new pages are the backwards' and do not follow the predecessor."""
    first = {name: simulate_schedule(name, plans[name], pc) for name in SCHEDULES}
    kept = [max(first[name]["peak_bytes"][r] for name in SCHEDULES) for r in range(PP)]
    out = {}
    for name in SCHEDULES:
        res = simulate_schedule(name, plans[name], pc, pool=tuple(kept))
        res["ms"] = {**first[name]["ms"], "first touch": res["ms"]["first touch"]}
        out[name] = res
    return out


def _loss(output, target):
    logits = output.logits if hasattr(output, "logits") else output[0]
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten())


def bench_rank(rank: int, world_size: int, plans: dict[str, str], warmup: int, rounds: int, gpt: dict | None = None
               ) -> dict:
    """Rounds of one step of every schedule, in `step_order` (module docstring). Per schedule: step milliseconds
    (rank 0's wall clock) per timed round, this rank's CPU milliseconds
    (process time) of each, its minor page faults and system CPU milliseconds of each (`getrusage`), the first
    step's loss, and this rank's parameter count and tensors (what its optimizer steps)."""
    torch.set_num_threads(1)
    built = {}
    for name in SCHEDULES:
        torch.manual_seed(0)
        model, (ids,) = zoo.gpt2(**(gpt or GPT))  # the ranks are forked from a server: GPT as main set it
        pm = parallelizer.auto_parallelize(model, (ids,), plan=parallelizer.Plan.from_json(plans[name]))
        params = list(pm.parameters())
        built[name] = (pm, torch.optim.AdamW(params, lr=1e-4), sum(p.numel() for p in params), len(params))
    labels = torch.roll(ids, -1, dims=1)
    out = {name: {"ms": [], "cpu_ms": [], "minflt": [], "sys_ms": [], "loss1": None, "numel": n, "tensors": t}
           for name, (_, _, n, t) in built.items()}
    order = step_order(warmup, rounds)
    for i in range(warmup + rounds):
        for name in order[i * len(SCHEDULES):(i + 1) * len(SCHEDULES)]:
            pm, opt, _, _ = built[name]
            dist.barrier()
            start, cpu, use = time.perf_counter(), time.process_time(), resource.getrusage(resource.RUSAGE_SELF)
            loss = pm.step(ids, target=labels, loss_fn=_loss)
            opt.step()
            opt.zero_grad(set_to_none=True)
            cpu, used = time.process_time() - cpu, resource.getrusage(resource.RUSAGE_SELF)
            dist.barrier()
            if i >= warmup:
                out[name]["ms"].append((time.perf_counter() - start) * 1e3)
                out[name]["cpu_ms"].append(cpu * 1e3)
                out[name]["minflt"].append(used.ru_minflt - use.ru_minflt)
                out[name]["sys_ms"].append((used.ru_stime - use.ru_stime) * 1e3)
            if out[name]["loss1"] is None:
                out[name]["loss1"] = loss.item()
    return out


def pairwise_agreement(a, b, min_gap: float = 0.0) -> tuple[int, int]:
    """(pairs (i, j) that `a` and `b` order alike, pairs counted): Kendall's concordant pairs (a tie in either
    counts as disagreement), over the pairs whose `a` values differ by at least `min_gap` (relative)."""
    n = len(a)
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n) if abs(a[i] - a[j]) >= min_gap * min(a[i], a[j])]
    return sum((a[i] - a[j]) * (b[i] - b[j]) > 0 for i, j in pairs), len(pairs)


def decided_table(simulated: dict[str, float], rounds: dict[str, list[float]], what: str, priced: str
                  ) -> tuple[list, list[str]]:
    """(the `paired_rounds.PairVerdict` of every schedule pair, markdown rows): per pair A vs B the timed rounds in
    which A's `what` (`rounds[name]`, one value per round) was lower / higher / equal, the exact sign test's p, whether
    Holm's procedure over the 15 pairs decides it at family-wise `paired_rounds.ALPHA` (the measurement's own
    confidence in its order: an undecided pair is within its noise), the median per-round ratio A / B with its 95%
    bootstrap interval, and the `priced` A / B (`simulated[name]`)."""
    verdicts = paired_verdicts([rounds[n] for n in SCHEDULES])
    rows = [f"| pair A vs B | rounds A's {what} lower / higher / tied | sign-test p | decided (Holm, family-wise "
            f"{ALPHA:.0%}) | measured A / B, median per round [95% bootstrap] | {priced} A / B | alike |",
            "|---" * 7 + "|"]
    for v in verdicts:
        a, b = SCHEDULES[v.i], SCHEDULES[v.j]
        ratio = simulated[a] / simulated[b]
        alike = "-" if not v.decided else ("yes" if (ratio - 1) * v.sign > 0 else "NO")
        rows.append(f"| {a} vs {b} | {v.wins} / {v.losses} / {v.ties} | {v.p:.2g} | {'yes' if v.decided else 'no'} | "
                    f"{v.ratio:.3f} [{v.low:.3f}, {v.high:.3f}] | {ratio:.3f} | {alike} |")
    return verdicts, rows


def _decided_lines(verdicts, what: str) -> str:
    npairs, nrounds = len(verdicts), verdicts[0].wins + verdicts[0].losses + verdicts[0].ties
    return (f"Pairs the {nrounds} paired timed rounds decide on {what} (exact sign test per pair, Holm over the "
            f"{npairs} pairs, family-wise error {ALPHA:.0%}; nothing can be decided in fewer than "
            f"{min_rounds_to_decide(npairs)} rounds): {sum(v.decided for v in verdicts)} of {npairs} (the others are "
            "within the measurement's noise).")


VARIANTS = {"measured": "4 ranks sharing the cores, measured factors", "ideal": "ideal sharing of the profile's "
            "cores", "own": "own core each", "before": "measured factors, as priced until round 19 (one P2P op per "
            "transfer)", "first touch": "measured factors + first touch of the live level (activations + fresh "
            "gradients) beyond the kept heap (round 27)"}


def report(sim: dict, measured: dict | None, header: str) -> str:
    """Markdown table + orders + agreement per simulated variant (module docstring)."""
    rows = [header, "", "| schedule | stages | " + " | ".join(f"simulated ms ({v})" for v in VARIANTS.values())
            + " | measured ms median (min-max) | work: simulated solo CPU ms round 19 -> now / "
            "measured CPU ms (all ranks, median) | first loss |", "|---" * (5 + len(VARIANTS)) + "|"]
    for name in SCHEDULES:
        s = sim[name]
        meas = loss = cpu = "-"
        if measured:
            m = measured[name]
            meas = f"{statistics.median(m['ms']):.0f} ({min(m['ms']):.0f}-{max(m['ms']):.0f})"
            loss, cpu = f"{m['loss1']:.6f}", f"{statistics.median(m['cpu_ms']):.0f}"
        rows.append(f"| {name} | {s['stages']} | " + " | ".join(f"{s['ms'][v]:.0f}" for v in VARIANTS)
                    + f" | {meas} | {s['work_before_ms']:.0f} -> {s['work_ms']:.0f} / {cpu} | {loss} |")
    rows.append("")
    for v, what in VARIANTS.items():
        rows.append(f"Simulated order, {what} (fastest first): "
                    f"{' < '.join(sorted(SCHEDULES, key=lambda n: sim[n]['ms'][v]))}.")
    if measured:
        med = {n: statistics.median(measured[n]["ms"]) for n in SCHEDULES}
        b = [med[n] for n in SCHEDULES]
        rows.append(f"Measured order (fastest first): {' < '.join(sorted(SCHEDULES, key=med.get))}.")
        verdicts, table = decided_table({n: sim[n]["ms"]["measured"] for n in SCHEDULES},
                                        {n: measured[n]["ms"] for n in SCHEDULES}, "step", "simulated step (measured factors)")
        decided = [(v.i, v.j, v.sign) for v in verdicts if v.decided]
        rows += ["", _decided_lines(verdicts, "the step"), ""] + table + [""]
        for v, what in VARIANTS.items():
            a = [sim[n]["ms"][v] for n in SCHEDULES]
            (k, n), (kc, nc) = pairwise_agreement(a, b), pairwise_agreement(a, b, CLEAR)
            wrong = [f"{SCHEDULES[i]} vs {SCHEDULES[j]}" for i, j, sign in decided if (a[i] - a[j]) * sign <= 0]
            rows.append(f"{what}: Spearman {spearman(a, b):.2f}; pairs ordered alike {k} of {n}, of the pairs it "
                        f"separates by >= {CLEAR:.0%} {kc} of {nc}, of the pairs the rounds decide "
                        f"{len(decided) - len(wrong)} of {len(decided)}"
                        + (f" (not: {', '.join(wrong)})" if wrong else "") + "; median |simulated / measured - 1| "
                        f"{statistics.median(abs(x / y - 1) for x, y in zip(a, b)):.0%}.")
        # round 25: all ranks' CPU per step moves far less with outside load than the wall clock, and on a machine with
        # fewer cores than ranks the work, not the bubble, orders the schedules (round 16): the priced work beside it
        cpu_verdicts, cpu_table = decided_table({n: sim[n]["work_ms"] for n in SCHEDULES},
                                                {n: measured[n]["cpu_ms"] for n in SCHEDULES}, "CPU (all ranks)",
                                                "priced solo work")
        wrong = [f"{SCHEDULES[v.i]} vs {SCHEDULES[v.j]}" for v in cpu_verdicts if v.decided and
                 (sim[SCHEDULES[v.i]]["work_ms"] - sim[SCHEDULES[v.j]]["work_ms"]) * v.sign <= 0]
        rows += ["", _decided_lines(cpu_verdicts, "all ranks' CPU (process time)") + " The priced solo work orders "
                 f"{sum(v.decided for v in cpu_verdicts) - len(wrong)} of them alike"
                 + (f" (not: {', '.join(wrong)})." if wrong else "."), ""] + cpu_table + [""]
        ranked = [n for n in SCHEDULES if measured[n].get("rank_cpu_ms")]  # steps written before round 20: none
        if ranked:
            rows.append("Per rank CPU ms, priced solo work (busy + AdamW) / measured process CPU (median), rank 0..3: "
                        + "; ".join(n + " " + ", ".join(
                            f"{a:.0f} / {statistics.median(b):.0f}"
                            for a, b in zip(sim[n]["rank_work_ms"], measured[n]["rank_cpu_ms"])) for n in ranked) + ".")
        faulted = [n for n in SCHEDULES if measured[n].get("rank_minflt")]  # steps written before round 22: none
        if faulted:
            rows.append("Per rank minor page faults / system CPU ms per step (median), rank 0..3: " + "; ".join(
                n + " " + ", ".join(f"{statistics.median(f):.0f} / {statistics.median(t):.0f}" for f, t in zip(
                    measured[n]["rank_minflt"], measured[n]["rank_sys_ms"])) for n in faulted) + ".")
        if faulted and all(sim[n].get("touched_bytes") for n in faulted):
            rows.append("Per rank first-touch MB priced (live level beyond the kept heap) / measured "
                        "minor faults x 4 KiB (median), rank 0..3: " + "; ".join(n + " " + ", ".join(
                            f"{a / 2**20:.0f} / {statistics.median(f) * 4096 / 2**20:.0f}" for a, f in zip(
                                sim[n]["touched_bytes"], measured[n]["rank_minflt"])) for n in faulted) + ".")
        bad = [n for n in SCHEDULES if list(measured[n]["numel"]) != sim[n]["numel"]
               or list(measured[n]["tensors"]) != sim[n]["tensors"]]
        rows.append("Parameters per rank priced = held by the runtime: " + ("yes" if not bad else f"NO for {bad}"))
    return "\n".join(rows)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", help="calibration profile JSON of this machine (default: calibrate first)")
    ap.add_argument("--rounds", type=int, help=f"timed rounds (default {ROUNDS}, --quick {QUICK_ROUNDS})")
    ap.add_argument("--warmup", type=int, default=WARMUP, help=f"untimed rounds first (default {WARMUP})")
    ap.add_argument("--simulate-only", action="store_true", help="print the simulated step times only")
    ap.add_argument("--json", help="write the measured steps here (JSON)")
    ap.add_argument("--measured", metavar="STEPS.json", help="report steps written by --json earlier (no run)")
    ap.add_argument("--quick", action="store_true", help=f"a GPT of {QUICK} (per-action costs dominate), "
                    f"{QUICK_ROUNDS} rounds")
    args = ap.parse_args(argv)
    args.rounds_given, args.rounds = args.rounds is not None, args.rounds or ROUNDS
    if args.quick:
        GPT.update(QUICK)
        args.rounds = args.rounds if args.rounds_given else QUICK_ROUNDS
    started = time.perf_counter()
    load0 = os.getloadavg()[0]
    profile_path = args.profile
    if profile_path is None:
        profile_path = os.path.join(tempfile.mkdtemp(), "cpu.profile.json")
        calibrate(out_path=profile_path, message_sizes_bytes=QUICK_MESSAGE_SIZES_BYTES, progress=False)
    traced = _traced()
    plans = make_plans(traced, profile_path)
    pc = pricing(traced, profile_path)
    measured = None
    load1 = os.getloadavg()[0]
    if args.measured:
        with open(args.measured) as f:
            measured = json.load(f)
    elif not args.simulate_only:
        print(f"measuring {len(SCHEDULES)} schedules x {args.rounds} rounds (load average {load1:.1f})",
              file=sys.stderr)
        measured = spawn(bench_rank, PP, {k: v.to_json() for k, v in plans.items()}, args.warmup, args.rounds, dict(GPT),
                         timeout_s=3600)
        measured = {name: {**measured[0][name], "numel": [r[name]["numel"] for r in measured],
                           "tensors": [r[name]["tensors"] for r in measured],
                           "cpu_ms": [sum(v) for v in zip(*(r[name]["cpu_ms"] for r in measured))],
                           "rank_cpu_ms": [r[name]["cpu_ms"] for r in measured],
                           "rank_minflt": [r[name]["minflt"] for r in measured],
                           "rank_sys_ms": [r[name]["sys_ms"] for r in measured],
                           "after": predecessors(step_order(args.warmup, args.rounds), args.warmup)[name]}
                    for name in SCHEDULES}
        if args.json:
            with open(args.json, "w") as f:
                json.dump(measured, f, indent=1)
    sim = simulate_all(plans, pc)
    factors = ", ".join(f"{k} ranks x{pc.cores.factor(k):.2f} (AdamW x{pc.cores.factor(k, True):.2f})"
                        for k in range(2, PP + 1))
    profile_line = summary(load_profile(profile_path)).replace("\n", "; ")
    header = (f"Profile `{profile_path}`: {profile_line}\n\nSharing factors (cost "
              f"model on `device_for(k)` / alone): {factors}.\n\nLoad average (1 min, {os.cpu_count()} cores): "
              f"{load0:.1f} at start, {load1:.1f} before measuring, {os.getloadavg()[0]:.1f} at the end; "
              + (f"steps read from {args.measured}." if args.measured else
                 f"{args.warmup} warm-up + {args.rounds} timed rounds."))
    print(report(sim, measured, header))
    print(f"\n_bench_schedules_runtime: {time.perf_counter() - started:.0f} s_")


if __name__ == "__main__":
    main()
