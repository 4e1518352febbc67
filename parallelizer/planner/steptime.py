"""Step time of a plan as the runtime executes it: what one training step (forward, backward, gradient sync,
optimizer step) costs on the plan's cluster, built from the same prices as the ILP (`costs.Pricer`).

    step_s = forward compute + forward collectives                        (blocking: on the critical path)
           + backward compute + backward collectives except bucketed grad sync      (blocking)
           + exposed bucketed gradient sync                               (what the overlapped sync delays)
           + optimizer step                                               (memory-bound, `cost_model.compute`)

* Blocking collectives (activation redistributions, FSDP/ZeRO-3 all-gathers and their reduce-scatters,
  tensor-parallel all-reduces) are priced in full where they run (`costs.Pricer.step_time_s`), once per
  (value, target layout) as the rewriter emits them (`shared_uses`: later uses read the first use's copy).
* Gradient sync of replicated parameters (`Step.kind == "grad_all_reduce"` as the FIRST step of a parameter's
  edge, DDP: `rewriter.grad_sync.runtime_buckets`; a later one, e.g. the second mesh axis of a parameter
  replicated on two axes, is emitted as a synchronous all-reduce per parameter and priced as blocking, in full
  with its sync wait; round 19, r19f) is what the runtime buckets
  (`rewriter.grad_sync`: first bucket `FIRST_BUCKET_BYTES`, then `DEFAULT_BUCKET_BYTES`, in the order backward
  produces gradients, per mesh axis) and all-reduces asynchronously while backward goes on. Each bucket is
  priced as ONE all-reduce of its bytes (`collective_time_s`, fewer latencies than per parameter; on a
  calibration profile the fit of the functional all-reduce that blocking collectives use, while the bucket runs
  an in-place `dist.all_reduce` after copying its gradients into one buffer: the functional call's output copy
  stands for that copy, `cost_model.measure`), becomes
  ready when backward has produced its last gradient (backward run in reverse graph order, blocking
  collectives included), and the delay it causes is
  `cost_model.communication.overlapped_comm_exposed_s` (buckets one at a time, only the device's
  `comm_overlap` fraction can hide). The ILP prices the same sync in full, each parameter as its share of a
  full bucket's all-reduce (`Pricer.step_time_s(bucketed=True)`: the latency paid once per bucket, not per
  parameter): an upper bound of this estimate up to the last, partly filled bucket (the exposed time is <= the
  full time); the estimate here is the figure to compare with a measured step.
* Gradient compression (`compression=`, `cost_model.compression`): each bucket's all-reduce is priced as the
  codec's sequential all-reduces of its compressed bytes (PowerSGD: uncompressed tensors, P, Q; bf16: half the
  bytes), overlapped as above; the codec's compute (`codec_s`) is added in full (it runs on the device's
  compute, with backward). A PowerSGD bucket is not overlapped: backward waits for it to complete
  (`rewriter.compression.start_compressed`: its P and Q all-reduces come from the hook's callbacks and must not
  interleave with backward's collectives), so its all-reduces are exposed in full. This is the steady state
  after PowerSGD's warm-up (`PlanConfig.powersgd_warmup` exact steps, priced as the uncompressed step).
* The optimizer step: `cost_model.compute.optimizer_step_time_s` over the local (stored) shards of trainable
  parameters, bytes per element from `cost_model.memory.BYTES_PER_PARAM` for the plan's precision and
  optimizer. The ILP does not price it (see `docs/architecture.md`, cost model).
* Every blocking collective waits for the slowest rank (`cost_model.communication.sync_wait_s`, through
  `Pricer.step_time_s`): the calibrated `DeviceSpec.collective_sync_s` (0 on the GPU presets) scaled by the
  compute the rank ran since its previous blocking collective, over the calibration's compute chunk. This
  estimate walks the program in its order for that: forward in graph order (a node's input redistributions,
  then its compute), backward in reverse (a node's parameters re-gathered, its backward compute, then the
  conjugates of its inputs' redistributions); a collective right after another waits for nothing. The ILP,
  the plan's breakdown and the pipeline segments price an edge without the program's order and charge the full
  wait (an upper bound of this estimate, as for the bucketed sync). Each gradient bucket's all-reduce (it runs
  beside backward, not after a rank's compute) gets the full wait. With more ranks than cores (a calibration
  profile's 4 ranks on 2 cores) a collective of every rank waits for none (`collective_wait_s`: the calibrated wait
  is the others' compute, priced by the contention slowdown; round 23, r23c), one of a sub-group still does. Round 20 (r20c): the full wait on each of
  an FSDP step's collectives (159 for the bench's GPT-2 on 4 ranks, 1-2 ms of compute apart) priced the FSDP
  plans of run 16 at +50..+86% over their measured step.
* A ZeRO-3 / FSDP parameter's all-gather is priced with its backward re-gather only where the program gathers
  it again (`Pricer.regathers`: `rewriter.reshard.regathered`, the pass's own rule): a gathered bias or
  embedding table, which no op saves, is freed after forward and not gathered again.
* Recomputation (`Plan.recompute`, region -> mode): in backward each recomputed node
  (`recompute.region_recompute`) runs its forward again, priced as `recompute.price_region`'s `extra_fwd_s`
  (its forward compute), plus the forward collectives of the redistributions into recomputed nodes
  (`RegionRecompute.rerun_edges`: the rewriter emits them inside the region, so they run again;
  `benchmarks/bench_recompute.py` counts them), once per (value, target layout) as the program runs them, as
  `recompute.price_region`'s `rerun_comm_s` (the ILP's form pays them per use, an upper bound).
  `StepTime.recompute_s` is their sum; it delays backward.
* A pipeline plan (`Plan.pipeline`): the search's price of it (`PipelineEstimate.step_s`: the simulated
  schedule, `planner.simulate`, with its tensor-parallel collectives and sends, + the exposed dp gradient
  sync + the tied-gradient exchange) as `pipeline_s`, + the optimizer step of the busiest pipeline rank (its
  stages' local parameter shards; a tied parameter counts on every rank holding it). On a calibration
  profile's cluster (`Cluster.sharing`) that simulation lets ranks in their bubbles leave the shared cores to
  the others (processor sharing, `planner.search` module docstring); the optimizer step is priced on the
  device slowed for all processes at once, as for the other plans.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from cost_model.compression import compressed_sync, compressed_sync_time_s
from cost_model.communication import collective_wait_s, overlapped_comm_exposed_s
from cost_model.compute import optimizer_step_time_s
from cost_model.memory import bytes_per_param
from cost_model.topology import Cluster, MeshTopology

from ..config import PlanConfig
from ..core.layout import local_shape
from ..errors import PlanMismatchError
from ..rewriter.grad_sync import DEFAULT_BUCKET_BYTES, FIRST_BUCKET_BYTES, runtime_buckets
from ..tracer import TracedGraph
from ..tracer.graph import carries_grad
from .costs import Pricer, resolve_precision, traced_in_low_precision
from .plan import Plan
from .problem import grad_axes
from .recompute import region_recompute, regions, shared_inputs
from .shared_uses import FirstUses
from .strategies import build_spaces

__all__ = ["StepTime", "estimate_step_time"]


@dataclass(frozen=True, slots=True)
class StepTime:
    """Seconds of one training step by part (module docstring). `grad_sync_s` is the bucketed sync in full (the
    buckets' all-reduces); `grad_sync_exposed_s` the part of it that delays the step; `buckets` their number;
    `codec_s` the gradient codec's compute (0 without compression); `recompute_s` the recomputation in backward
    (compute and the collectives it repeats); `pipeline_s` a pipeline plan's simulated schedule with its
    syncs (its compute and collectives are not split into the other fields, which are then 0)."""

    forward_compute_s: float
    backward_compute_s: float
    blocking_comm_s: float
    grad_sync_s: float
    grad_sync_exposed_s: float
    optimizer_s: float
    buckets: int
    codec_s: float = 0.0
    recompute_s: float = 0.0
    pipeline_s: float = 0.0

    @property
    def total_s(self) -> float:
        """The step: compute + blocking collectives + exposed grad sync + codec + recomputation + pipeline schedule
        + optimizer step, seconds."""
        return (self.forward_compute_s + self.backward_compute_s + self.blocking_comm_s + self.grad_sync_exposed_s
                + self.codec_s + self.recompute_s + self.pipeline_s + self.optimizer_s)


def estimate_step_time(traced: TracedGraph, plan: Plan, *, cluster: Cluster | str | None = None,
                       topology: MeshTopology | None = None, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                       first_bucket_bytes: int = FIRST_BUCKET_BYTES, compression: str = "none",
                       powersgd_rank: int = 4) -> StepTime:
    """Estimate one training step of `plan` for `traced` on `cluster` (module docstring).

    Args:
        traced: the TracedGraph the plan was made for.
        plan: a `Plan` (its recorded config gives precision, optimizer, roles).
        cluster / topology: what to price on, as for `parallelizer.plan` (`api.resolve_cluster`); a calibration
            profile path prices on the measured machine.
        bucket_bytes, first_bucket_bytes: the runtime's gradient buckets (`ParallelModule(grad_bucket_bytes=)`);
            `bucket_bytes=0` prices every gradient all-reduce as blocking (the synchronous runtime mode).
        compression, powersgd_rank: the codec of the bucketed sync, "none" | "bf16" | "powersgd" (module
            docstring).

    Returns:
        `StepTime`: seconds by part and `total_s`.

    Raises:
        PlanMismatchError: a node of the plan has a strategy the planner would not offer for `traced` (a plan
            made for another model or config); a pipeline plan without the search's estimate.
        ValueError: a profile without a link for the plan's world size (`api.resolve_cluster`).
    """
    from .api import resolve_cluster  # api imports this package's modules; import at call time
    config = PlanConfig.from_record(plan.config)
    if plan.pipeline is not None:
        return _pipeline_step(traced, plan, resolve_cluster(cluster, plan.pipeline.mesh.world_size)[0], config)
    mesh = plan.mesh
    topo = topology or MeshTopology(resolve_cluster(cluster, mesh.world_size)[0], mesh.shape, mesh.axis_names)
    pricer = Pricer(topo, mesh, config, traced)
    spaces = build_spaces(traced, mesh, config)
    strat = {name: _chosen(name, space, plan) for name, space in spaces.items()}
    recomputed, rerun = _recomputed(traced, plan)
    uses = FirstUses(traced)
    fwd_compute = bwd_compute = blocking = recompute = 0.0
    since = 0.0  # compute since the rank's previous blocking collective (`sync_wait_s`), forward in graph order
    nodes: list[tuple[float, list, list[tuple[str, tuple[int, ...], int]]]] = []  # per node in graph order:
    # (backward seconds before its collectives, [(step, param itemsize, regather)] of its blocking backward
    # collectives, [(axis, local gradient shape, bytes per gradient element)] of its bucketed gradients)
    for name, space in spaces.items():
        s = strat[name]
        node_bwd, grads, blocking_bwd = 0.0, [], []
        c = pricer.node_cost(traced, traced.nodes[name], space, s) if space.kind == "op" else None
        if c is not None:
            node_bwd += c.bwd_s + (c.fwd_s if name in recomputed else 0.0)
            bwd_compute += c.bwd_s
            recompute += c.fwd_s if name in recomputed else 0.0
        for k, ti in enumerate(space.inputs):
            prod = spaces[ti.producer]
            req = prod.requires_grad and carries_grad(ti.dtype)
            is_param = prod.kind == "param"
            dtype = pricer.input_dtype(traced, ti)  # as run (`Pricer.input_dtype`)
            axes = grad_axes(s, k, mesh)
            if not uses.first(ti.producer, name, s.inputs[k], axes):
                continue  # the program hands this use the copy an earlier use made (`shared_uses`)
            steps = pricer.steps(strat[ti.producer].output, s.inputs[k], ti.shape, dtype, axes, req, is_param)
            regather = pricer.regathers(traced, ti.producer)  # gathered again in backward (`rewriter.reshard`)
            param_itemsize = dtype.itemsize if is_param else None
            for j, st in enumerate(steps):
                fwd = pricer.step_time_s(st, param_itemsize, regather=regather, compute_before_s=(since, None, None))[0]
                since = 0.0 if st.fwd_collective else since
                blocking += fwd
                if (name, k) in rerun:  # emitted inside a recomputed region: runs again in backward
                    recompute += fwd
                    node_bwd += fwd
                if bucket_bytes and runtime_buckets(steps, j, is_param):  # a later step runs synchronously
                    shape = local_shape(tuple(ti.shape), s.inputs[k], mesh)
                    grads.append((st.mesh_axis, shape, pricer.grad_bytes_per_element))
                else:
                    blocking_bwd.append((st, param_itemsize, regather))
        if c is not None:
            fwd_compute += c.fwd_s
            since += c.fwd_s
        nodes.append((node_bwd, blocking_bwd, grads))
    bwd_work, bwd_blocking = _backward(nodes, pricer)
    blocking += bwd_blocking
    ready, comm, codec = _buckets(bwd_work, topo, bucket_bytes, first_bucket_bytes, compression, powersgd_rank,
                                  pricer.device)
    backward_end = sum(w for w, _ in bwd_work)
    if compression == "powersgd":  # synchronous buckets (module docstring)
        exposed = sum(comm)
    else:
        exposed = overlapped_comm_exposed_s(ready, comm, backward_end, pricer.device.comm_overlap) if comm else 0.0
    return StepTime(fwd_compute, bwd_compute, blocking, sum(comm), exposed, _optimizer_s(plan, pricer, config),
                    len(comm), codec, recompute)


def _backward(nodes, pricer: Pricer) -> tuple[list[tuple[float, list]], float]:
    """(per node in graph order: (its backward seconds, compute and blocking collectives; its bucketed gradients),
    the blocking backward collectives' seconds in all) of `estimate_step_time`'s per-node records, walking
    backward in reverse graph order as autograd runs it: a node's parameters gathered again first (the
    re-gather precedes its consumer's backward, `rewriter.reshard`), then its backward compute, then the
    conjugates of its inputs' redistributions; each collective waits for the slowest rank by the compute since
    the previous one (`Pricer.step_time_s`'s `compute_before_s`)."""
    since, total, work = 0.0, 0.0, []
    for compute, collectives, grads in reversed(nodes):
        node = compute
        for st, param_itemsize, regather in collectives:  # the re-gathers, before the node's backward compute
            if st.regather and regather:
                t = pricer.step_time_s(st, param_itemsize, regather=True, compute_before_s=(None, 0.0, since))[1]
                t -= pricer.step_time_s(st, param_itemsize, regather=False, compute_before_s=(None, 0.0, None))[1]
                node, total, since = node + t, total + t, 0.0
        since += compute
        for st, param_itemsize, regather in collectives:  # the conjugates, after it
            t = pricer.step_time_s(st, param_itemsize, regather=False, compute_before_s=(None, since, None))[1]
            node, total = node + t, total + t
            since = 0.0 if st.bwd_collective else since
        work.append((node, grads))
    return work[::-1], total


def _recomputed(traced: TracedGraph, plan: Plan) -> tuple[frozenset[str], frozenset[tuple[str, int]]]:
    """(nodes the plan's recomputation runs again in backward, the input edges whose redistribution runs again:
    `recompute.RegionRecompute.recomputed` and `rerun_edges` of each region of `Plan.recompute` that is a
    planner region; a user's region outside the repeated blocks is not priced, as in the planner)."""
    members, shared = regions(traced), shared_inputs(traced)
    rrs = [region_recompute(traced, region, members[region], mode, shared)
           for region, mode in sorted(plan.recompute.items()) if region in members]
    return (frozenset(n for rr in rrs for n in rr.recomputed),
            frozenset(e for rr in rrs for e in rr.rerun_edges))


def _pipeline_step(traced: TracedGraph, plan: Plan, cluster: Cluster, config: PlanConfig) -> StepTime:
    """A pipeline plan's step (module docstring): the search's simulated step + the busiest pipeline rank's
    optimizer step. Parameters go to the stages of the nodes using them (`runtime.pipeline.cut_stages`)."""
    from ..runtime.pipeline import cut_stages  # runtime imports the planner; import at call time
    section = plan.pipeline
    if section.estimate is None:
        raise PlanMismatchError("this pipeline plan records no estimate of the search (made before it was "
                                "recorded). Remedy: plan it again with parallelizer.plan")
    cut = cut_stages(traced, len(section.stages), section.blocks_per_stage)
    users: dict[str, set[int]] = {}
    for name, k in cut.stage_of.items():
        for arg in traced.nodes[name].node.all_input_nodes:
            users.setdefault(arg.name, set()).add(section.stages[k].pp_rank)
    per_element = bytes_per_param(resolve_precision(config.precision, cluster.device, traced_in_low_precision(traced)),
                                  config.optimizer)
    optimizer = 0.0
    for rank in range(section.pp):
        mine = [p for p in plan.params.values() if not p.is_buffer
                and any(rank in users.get(ph, ()) for ph in p.placeholders)]
        numel = sum(math.prod(p.local_shape) for p in mine)
        optimizer = max(optimizer, optimizer_step_time_s(numel, len(mine), per_element, cluster.device))
    return StepTime(0.0, 0.0, 0.0, 0.0, 0.0, optimizer, 0, pipeline_s=section.estimate.step_s)


def _chosen(name: str, space, plan: Plan):
    want = plan.nodes.get(name)
    for s in space.strategies:
        if want is not None and (tuple(str(L) for L in s.inputs), None if s.output is None else str(s.output)) == \
                (tuple(want.inputs), want.output):
            return s
    raise PlanMismatchError(f"node {name}: the plan's strategy {want} is not among the strategies the planner offers "
                            f"on mesh {plan.mesh} for this graph. Remedy: estimate with the model and config the plan "
                            "was made for")


def _buckets(bwd_work, topo: MeshTopology, bucket_bytes: int, first_bucket_bytes: int, compression: str,
             powersgd_rank: int, device):
    """(ready seconds, all-reduce seconds, codec seconds in total) of the gradient buckets: backward runs the
    nodes in reverse order; gradients fill a bucket per mesh axis (first one `first_bucket_bytes`, then
    `bucket_bytes`); a full bucket is ready when its last gradient is; the open ones at the end of backward.
    A bucket's all-reduce is priced by `cost_model.compression` (with `compression="none"`: one all-reduce of
    its bytes) + the wait for the slowest rank (`cost_model.communication.collective_wait_s`: the full calibrated
    wait, none for a bucket of every rank on more ranks than cores)."""
    ready, comm, open_grads, started = [], [], {}, set()
    codec_s, t = 0.0, 0.0

    def close(axis: str, at: float) -> None:
        nonlocal codec_s
        shapes, itemsize, _ = open_grads.pop(axis)
        comm_s, codec = compressed_sync_time_s(compressed_sync(compression, shapes, itemsize, powersgd_rank), topo,
                                               (axis,), device)
        comm.append(comm_s + collective_wait_s(topo, (axis,)))  # the bucket's all-reduce waits for the slowest rank too
        codec_s += codec
        ready.append(at)
        started.add(axis)

    for work, grads in reversed(bwd_work):
        t += work
        for axis, shape, itemsize in grads:
            shapes, _, nbytes = open_grads.setdefault(axis, ([], itemsize, 0))
            shapes.append(shape)
            nbytes += math.prod(shape) * itemsize
            open_grads[axis] = (shapes, itemsize, nbytes)
            if nbytes >= (bucket_bytes if axis in started else first_bucket_bytes):
                close(axis, t)
    for axis in sorted(open_grads):
        close(axis, t)
    return ready, comm, codec_s


def _optimizer_s(plan: Plan, pricer: Pricer, config: PlanConfig) -> float:
    trainable = [p for p in plan.params.values() if not p.is_buffer]
    numel = sum(math.prod(p.local_shape) for p in trainable)
    per_element = bytes_per_param(pricer.precision, config.optimizer)
    return optimizer_step_time_s(numel, len(trainable), per_element, pricer.device)
