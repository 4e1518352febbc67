"""Pipeline execution: cut a traced graph into stages at block boundaries, emit each stage's sharded
program on its (dp, tp) sub-mesh, and run the stages with torch.distributed.pipelining schedules.

Mesh: (pp, dp, tp), pp outermost, so stage group p holds global ranks p*dp*tp ... (p+1)*dp*tp - 1 and a
rank's pipeline peers share its (dp, tp) coordinates. Stage k runs on stage group k % pp (looped
placement, which torch's interleaved schedules expect), or in a V for zbv / dualpipev (`stage_pp_rank`);
bitpipe runs two copies of every stage through our own runner (`runtime.bitpipe`). Every stage uses the SAME intra-stage plan (a
ShardingSpec for the (dp, tp) mesh made on the whole graph), so a value crossing a stage boundary leaves
in its producer's layout and arrives in that layout: each rank sends its local shard to the rank with
the same (dp, tp) coordinates in the next stage group, and nothing is redistributed at the boundary.

Cross-stage rules: values needed by a later stage travel through every stage in between (a stage
forwards what it does not use); parameters and buffers are never sent: each stage holds its own copy of
those it uses (buffers such as rotary tables are replicated per stage), and a parameter used by several
stages (GPT-2's tied embedding / lm_head) has its gradient summed over its copies before the optimizer
step (`sync_shared_grads`), so the copies stay equal. The microbatch size is the traced batch size: trace
the model with one microbatch (`global batch / microbatches`); `step` rejects a batch that does not split.
"""
from __future__ import annotations

import dataclasses
import zlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.fx
from torch.distributed import pipelining

from ..core.boundary_codec import KINDS, BoundaryCodec, compressible
from ..core.layout import Layout, local_shape
from ..core.redistribute import sum_dtype
from ..errors import PipelineError
from ..planner.schedules import RUNNER_SCHEDULES
from ..rewriter.collectives import find_group
from ..rewriter.grad_sync import deferred_sync, narrow_grads, wide_grad, widen_grads
from ..rewriter.recompute import recompute_within
from ..rewriter.spec import NodeSharding, ShardingSpec, all_axis_groups, hierarchical_sub_groups, mesh_coords
from ..tracer.graph import TracedGraph, carries_grad
from .grad_reach import OutputReach, drop_unreached, output_reach
from .in_place import all_reduce_in_place
from .microbatch_loss import MicrobatchLoss, batch_loss, counts_no_item, weighted_loss  # noqa: F401 (re-exported)
from .launch import create_groups
from .microbatches import check_batch
from .module import ParallelModule
from .stage_checks import SPLIT_BACKWARD, check_buffer_copies, check_split_backward, uses_by_stage  # noqa: F401
from .written_state import snapshot_written_state
from .tree_reading import TreeReading, held, read_tree
from .stage_cut import (StageCut, _args, _boundaries, cut_stages, plan_cut, stage_graph,  # noqa: F401
                        stage_pp_rank, step_returned_share, step_returns, V_PLACED)
from ..rewriter.apply import AsEmitted, RankProgram, rewrite
from ..rewriter.verify import verify

SCHEDULES = {"gpipe": pipelining.ScheduleGPipe, "1f1b": pipelining.Schedule1F1B,
             "interleaved_1f1b": pipelining.ScheduleInterleaved1F1B,
             "interleaved_zero_bubble": pipelining.ScheduleInterleavedZeroBubble,
             "zbv": pipelining.ScheduleZBVZeroBubble, "dualpipev": pipelining.ScheduleDualPipeV}
_MULTI_STAGE = {"interleaved_1f1b", "interleaved_zero_bubble", "zbv", "dualpipev"}


def stage_spec(spec: ShardingSpec, traced: TracedGraph, cut: StageCut, k: int, stage_rank_offset: int,
               outputs: tuple[str, ...] | None = None) -> ShardingSpec:
    """The intra-stage plan of stage k: the whole-graph spec restricted to the stage; received values
    arrive in their producer's layout, sent values leave in it (the last stage returns `outputs`, default
    `cut.outputs[k]`, in the layouts of the spec's output node)."""
    def produced_layout(name: str) -> Layout:
        if name in spec.nodes and name not in traced.input_names:
            return spec.nodes[name].output
        # a user input passed through (e.g. labels for the last stage's loss) travels whole: the next stage
        # takes it as a global input and slices it by its own plan, as the first stage does
        return Layout.replicate(spec.mesh.ndim)

    received = {n: produced_layout(n) for n in cut.inputs[k] if n not in traced.input_names}
    nodes = {n: spec.nodes[n] for n, s in cut.stage_of.items() if s == k}
    if k == cut.num_stages - 1:
        whole = spec.nodes["output"]  # the layouts the model's outputs are returned in, by output position
        by_name = dict(zip(cut.model_outputs or cut.outputs[k], whole.inputs))
        nodes["output"] = NodeSharding(tuple(by_name[n] for n in (cut.outputs[k] if outputs is None else outputs)),
                                       whole.output)
    else:
        nodes["output"] = NodeSharding(tuple(produced_layout(n) for n in cut.outputs[k]),
                                       Layout.replicate(spec.mesh.ndim))
    return ShardingSpec(spec.mesh, nodes, spec.params, received, stage_rank_offset,
                        recompute_within(spec.recompute, [n for n in nodes if n != "output"], traced),
                        spec.compression, spec.hierarchy, spec.autocast, spec.zero1)


class StageModule(ParallelModule):
    """One pipeline stage of one rank: `forward(*received)` returns the tuple of values it sends. A stage
    runs in the train/eval mode the model was traced in (switching raises PlanMismatchError).

    Boundary compression (`core.boundary_codec`): `in_codecs[i]` decodes received value i (None: sent as is)
    before the program runs, `out_codecs[j]` encodes sent value j after it; autograd compresses the
    activation gradients on the way back. A value only passed through with the same codec on both sides
    (same kind, shape and seed) is forwarded as received, still encoded, so its error is not compounded.

    Under a mixed-precision recipe (`spec.autocast`, `runtime.precision`) the stage program runs inside its
    autocast context, as `ParallelModule.forward` runs the whole program; codecs and the loss (torch's schedule
    calls it on the last stage's output, as `pm.step` calls it on the forward's output) run outside it. The
    values sent are then in the dtypes autocast gives them (`boundary_dtypes`), which `sent_dtypes` records
    and `forward` checks (a mismatch would be sent into a receive buffer of another size)."""

    _retraces = False
    _no_retrace = "a pipeline stage runs in the mode the model was traced in"
    in_codecs: tuple[BoundaryCodec | None, ...] = ()
    out_codecs: tuple[BoundaryCodec | None, ...] = ()
    sent_dtypes: tuple[torch.dtype, ...] = ()  # under a recipe: the dtypes its boundary buffers were made in
    # the last stage when it returns less than all the model's outputs (`step_returns`): (stage graph, spec)
    # returning all of them, and whether the running step reads them all (a `loss_fn`: `PipelineModule.step`)
    whole: tuple[TracedGraph, ShardingSpec] | None = None
    returns_all = False

    def reading(self) -> TreeReading:
        """This step's walk of the stage's tree (lent by `tree_reading.held` for the step: one walk per stage and
        step), or outside a step a fresh one."""
        held = self.__dict__.get("_held_reading")
        return held if held is not None else read_tree(self)

    def _frozen(self) -> frozenset[str]:
        """The frozen set of this step's reading (`reading`): read once per step, not once per action."""
        return self.reading().frozen

    def _returning(self) -> RankProgram:
        """The program this call runs: the stage's own, or under `returns_all` the one returning all the
        model's outputs (made on first use, as another mode's program: `ParallelModule._program_for`); either
        made for the parameters' CURRENT requires_grad, as `ParallelModule` keys its programs by the frozen set:
        a parameter frozen at build and unfrozen later gets its dp gradient sync (before, round 19: the build's
        program ran on, and the two dp replicas of an unfrozen weight trained on their local gradients)."""
        frozen = self._frozen()
        if not (self.returns_all and self.whole is not None):
            fresh = (self._first_modes, frozen) not in self.programs
            self._active = self._program_for(self._first_modes, frozen, None, None)
            if fresh:  # the build's first program got its snapshot in `build`
                snapshot_written_state(self.program.graph_module, self.traced)
            return self.program
        whole = self.__dict__.setdefault("_whole_programs", {})
        if frozen not in whole:
            traced, spec = self.whole
            program = rewrite(traced, spec, self.rank, grad_bucket_bytes=self.grad_bucket_bytes, frozen=frozen)
            verify(program, traced, spec)
            snapshot_written_state(program.graph_module, traced)
            whole[frozen] = program
        return whole[frozen]

    def forward(self, *wire):
        wire = tuple(_ContiguousGrad.apply(w) if w.requires_grad else w for w in wire)
        received = tuple(c.decode(w) if c is not None else w for c, w in zip(self.in_codecs, wire)) + \
            wire[len(self.in_codecs):]
        program = self._returning()
        state = self._state(program)
        with self._autocast(state):  # the plan's mixed-precision recipe (a no-op without one), as ParallelModule
            out = program.graph_module(*state, *received)
        if self.sent_dtypes and program is self.program:
            _check_sent_dtypes(self, out)
        sent = []
        for j, t in enumerate(out):
            codec = self.out_codecs[j] if j < len(self.out_codecs) else None
            i = next((i for i, r in enumerate(received) if t is r), None)
            if i is not None and codec is not None and i < len(self.in_codecs) and self.in_codecs[i] == codec:
                sent.append(wire[i].clone())  # passed through still encoded (a copy: see below)
            elif codec is not None:
                sent.append(codec.encode(t))
            else:  # a value only passed through is returned as a copy, so autograd links the stage's output to
                # its input (a view would do, but torch's split backward (zbv, dualpipev) detaches stage outputs
                # in place, which a view refuses)
                sent.append(t.clone() if i is not None else t)
        # torch's P2P (dist.isend in _batch_p2p) sends only contiguous tensors; a stage output may be a
        # transposed / sliced view (ViT's class token, a permuted attention output). A contiguous view (OPT's
        # block ends in `.view(batch, seq, hidden)`) is copied too: torch's split backward (zbv, dualpipev)
        # detaches stage outputs in place, which a view refuses ("Can't detach views in-place", every rank)
        return tuple(t.clone() if t._is_view() and t.is_contiguous() else t.contiguous() for t in sent)


def returning_all(module: StageModule, traced: TracedGraph, spec: ShardingSpec, cut: StageCut, k: int,
                  offset: int) -> None:
    """Give the last stage's module (k the last stage) what it needs to return all the model's outputs to a step
    given a `loss_fn` (`StageModule.whole`), when `cut` has it return less (`step_returns`)."""
    if k == cut.num_stages - 1 and cut.model_outputs and cut.outputs[k] != cut.model_outputs:
        module.whole = (stage_graph(traced, cut, k, cut.model_outputs),
                        stage_spec(spec, traced, cut, k, offset, cut.model_outputs))


def _check_sent_dtypes(module: StageModule, out) -> None:
    """Raise PipelineError if the stage program's outputs are not in the dtypes its boundary buffers were
    allocated in (`boundary_dtypes`: inferred on fake tensors under the recipe)."""
    got = tuple(t.dtype for t in out)
    if got != module.sent_dtypes:
        names = module.traced.graph_module.graph.output_node().args[0]
        wrong = [f"{n.name}: {d} (expected {e})" for n, d, e in zip(names, got, module.sent_dtypes) if d != e]
        raise PipelineError(f"pipeline stage ({module.traced.notes[0] if module.traced.notes else 'stage'}) under "
                            f"the recipe {module.spec.autocast!r} produced {', '.join(wrong)}: its sharded program "
                            "computes other dtypes than the stage graph run under autocast on fake tensors "
                            "(`runtime.pipeline.boundary_dtypes`), so the send/receive buffers would not fit. "
                            "Remedy: plan with precision='fp32' (--precision fp32), or without 'pp'")


def boundary_dtypes(traced: TracedGraph, cut: StageCut, recipe: str | None,
                    device_type: str = "cpu") -> dict[str, torch.dtype]:
    """The dtype of every value a stage receives or sends (`cut.inputs` / `cut.outputs` names) when the stages
    run under the mixed-precision `recipe` (`runtime.precision.autocast`; None: the traced dtypes).

    Stage by stage, each stage graph (`stage_graph`) runs on fake tensors (`FakeTensorMode`: no data, no
    collectives: the unsharded graph, whose ops produce the dtypes the sharded program's local ops produce)
    inside the recipe's autocast on `device_type` (autocast's op lists differ by device): its parameters and
    buffers in their traced dtypes, its received values in the dtypes the earlier stages' runs gave them, the
    model's inputs as traced. Under bf16 autocast a value made by a matmul or linear is bfloat16, one made by a
    residual add of an fp32 and a bf16 tensor, a norm or a softmax is float32. The gradient of a received value
    that comes back over the same boundary has the value's dtype (autograd's contract: a tensor's grad has its
    dtype), so these dtypes size the gradient buffers too.

    Raises:
        PipelineError: a stage graph that cannot run on fake tensors (names the stage and the error).
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    from .precision import autocast

    dtypes = {n: traced.node(n).outputs[0].dtype for k in range(cut.num_stages)
              for n in cut.inputs[k] + cut.outputs[k] if traced.node(n).outputs}
    if recipe is None:
        return dtypes
    for k in range(cut.num_stages):
        tg = stage_graph(traced, cut, k)
        try:
            with FakeTensorMode(allow_non_fake_inputs=False):
                args = []
                for node in tg.graph_module.graph.find_nodes(op="placeholder"):
                    meta = traced.node(node.name).outputs[0]
                    dtype = dtypes.get(node.name, meta.dtype) if node.name in cut.inputs[k] else meta.dtype
                    args.append(torch.empty(meta.shape, dtype=dtype).requires_grad_(carries_grad(dtype)))
                with autocast(recipe, device_type):  # the emitted program's semantics (a split bias in the
                    out = AsEmitted(tg.graph_module).run(*args)  # product's dtype: `rewriter.apply.AsEmitted`)
        except Exception as err:  # noqa: BLE001 (any op's failure on fake tensors; named in the message)
            raise PipelineError(f"pipeline stage {k}: could not infer the dtypes its boundary values have under the "
                                f"recipe {recipe!r} by running the stage on fake tensors ({type(err).__name__}: "
                                f"{err}). Remedy: plan with precision='fp32' (--precision fp32), or without "
                                "'pp'") from err
        dtypes.update((n, t.dtype) for n, t in zip(cut.outputs[k], out))
    return dtypes


class _ContiguousGrad(torch.autograd.Function):
    """Identity in forward; makes the gradient contiguous in backward. Wraps each received activation, so the
    gradient torch's stage sends back to the previous stage (the received value's `.grad`) is contiguous
    whatever layout the stage's first op produced it in (a permute's or expand's backward gives a strided one)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad.contiguous()


@dataclass
class PipelineRun:
    """What a rank holds: its stage modules, the schedule object, the groups for shared parameters, and
    the batch it expects (microbatches x the traced microbatch size).

    Gradients accumulate over several `step` calls exactly as over several `loss.backward()` of the eager
    model: each step adds the gradient of the batch's loss. torch's schedules would instead divide the
    whole `.grad` by the microbatch count after every step (`scale_grads=True`), shrinking what earlier steps
    accumulated; here the schedules run with `scale_grads=False` and the loss of each microbatch is weighted
    before its backward (`MicrobatchLoss`: by 1 / microbatches, as Megatron-LM does, or by its share of the
    batch's items), so earlier gradients are untouched. The losses a step reports are the unscaled
    per-microbatch losses. Float16 / bfloat16 gradients add up over the step's microbatches in float32 and are
    rounded once (`_SyncOnceStage`, `sum_over_copies`; the batch loss too, `batch_loss`), as one device's backward
    of the whole batch accumulates in its kernels (round 26).
    """

    stages: list[StageModule]
    schedule: object
    shared: dict[str, list[int]]  # parameter FQN -> global ranks holding a copy (same dp, tp coordinates)
    microbatches: int
    microbatch_size: int
    first: bool
    last: bool
    loss: MicrobatchLoss
    pipe: list = dataclasses.field(default_factory=list)  # this rank's torch stages (`_SyncOnceStage`)
    # the parameters each model output reaches: those no output the step's loss read reaches keep .grad None, as on
    # one device (`grad_reach`)
    reach: OutputReach = OutputReach()

    def step(self, *inputs, target=None, losses: list | None = None, loss_fn=None,
             item_count=None, readings: list[TreeReading] | None = None) -> torch.Tensor | None:
        """One forward/backward of the global batch (inputs on the first stage's ranks, target on the last
        stage's), ADDING the batch's gradient to `.grad` (zero the gradients before the first of several
        accumulated steps, step the optimizer after the last), then the gradient sum of shared parameters.

        Args:
            inputs: the traced graph's tensor inputs, global (microbatches x the traced batch in dim 0).
            loss_fn: this step's `loss_fn(last stage outputs (tuple), target_j)`; None: the one given to `build`.
            item_count: `item_count(target) -> n`: weight microbatch j's loss by n_j / N (`MicrobatchLoss`);
                None: by 1 / microbatches.
            losses: gets the unscaled microbatch losses (last stage's ranks).
            readings: each stage's walk of its tree for this step (`PipelineContract._check_modes`), else made
                here: lent to the stages for the step (`tree_reading.held`: their frozen sets and parameters are
                read once per step, not once per action).
        Returns:
            The batch loss (sum of the weighted microbatch losses, detached) on the last stage's ranks, else None.
        Raises:
            PipelineError: the batch is not `microbatches` x the traced microbatch size (torch's splitter would
                silently make uneven microbatches, and the loss would weigh them wrongly).
        """
        check_batch(inputs + ((target,) if isinstance(target, torch.Tensor) else ()), self.microbatches,
                    self.microbatch_size, [None] * len(inputs) + ["target"])
        with held(self.stages, readings or [read_tree(stage) for stage in self.stages]):
            # a failed step's float32 running sums (`_SyncOnceStage`) go to .grad, as its partial .grad did
            narrow_grads(p for stage in self.stages for p in stage.reading().parameters.values())
            earlier = _take_grads(self)  # reduced already: only this step's part is reduced
            self.loss.begin(loss_fn, item_count if self.last else None, target)  # the loss runs on the last stage
            finals = [stage.final_backwards for stage in self.pipe]
            # return_outputs=False: torch's schedule would keep every microbatch's outputs until the next step and
            # concatenate them, which `step` never returns (round 16: 2 x the last stage's gathered logits held)
            self.schedule.step(*(inputs if self.first else ()), target=target if self.last else None,
                               return_outputs=False)
        _check_synced(self, finals)
        if losses is not None:
            losses.extend(loss for loss, _ in self.loss.recorded)
        sync_shared_grads(self)
        # the zeros torch's stages send for a missing gradient (collective when outputs reach different parameters)
        drop_unreached(self.stages, self.reach.unreached_in_step(self.loss.read))
        _give_back(earlier)
        if not self.last:
            return None
        return batch_loss(self.loss.recorded)


def _take_grads(run: PipelineRun) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Detach the gradients of this rank's stage parameters (set them to None) and return them: the step
    then starts from no gradient, so its deferred dp sync (`grad_sync.deferred_sync`) and the shared-parameter
    sum reduce only this step's part, and `_give_back` adds the earlier (already reduced) part back."""
    taken, seen = [], set()
    for m in run.stages:
        for p in m.reading().parameters.values():
            if p.grad is not None and id(p) not in seen:
                seen.add(id(p))
                taken.append((p, p.grad))
                p.grad = None
    return taken


def _give_back(taken: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    with torch.no_grad():
        for p, grad in taken:
            p.grad = grad if p.grad is None else grad.add_(p.grad)


class _SyncOnceStage(pipelining.PipelineStage):
    """torch's PipelineStage whose backward defers the stage's bucketed dp gradient sync to the stage's last
    backward of the step (`grad_sync.deferred_sync`; torch itself only does this for DDP / FSDP submodules):
    one all-reduce (or one codec run) per bucket and optimizer step, not one per microbatch. torch's schedules
    pass `last_backward=True` with the m-th full backward of a stage (gpipe, 1f1b, interleaved_1f1b) or its
    m-th weight backward (interleaved_zero_bubble: input backwards never reach a parameter);
    `final_backwards` counts them so that `PipelineRun.step` can check every stage got its final one."""

    final_backwards = 0

    def backward_maybe_with_nosync(self, backward_type, bwd_kwargs: dict, last_backward: bool = False):
        with deferred_sync(final=last_backward):
            result = super().backward_maybe_with_nosync(backward_type, bwd_kwargs, last_backward)
        # float16 / bfloat16 gradients add up over the microbatches in float32 and are rounded once (`grad_sync.
        # widen_grads`; the dp-synced ones by the deferred sync of the last backward), as one device's backward
        (narrow_grads if last_backward else widen_grads)(self.submod.reading().parameters.values())
        self.final_backwards += bool(last_backward)
        return result


def _check_synced(run: PipelineRun, before: list[int]) -> None:
    """Raise PipelineError if a stage ran no final backward in the step (its gradients would stay unreduced)."""
    for stage, count in zip(run.pipe, before):
        if stage.has_backward and stage.final_backwards != count + 1:
            raise PipelineError(f"pipeline step: stage {stage.stage_index} ran {stage.final_backwards - count} "
                                "backward passes flagged last_backward by the torch schedule (expected 1), so its "
                                "deferred dp gradient sync did not run exactly once. Remedy: use a schedule of "
                                f"{sorted(SCHEDULES)} (the torch version may have changed the flag)")


def build(traced: TracedGraph, spec: ShardingSpec, cut: StageCut, model: torch.nn.Module, *, pp: int,
          schedule: str, microbatches: int, loss_fn, boundary: tuple[str | None, ...] = (),
          boundary_rank: int = 8) -> PipelineRun:
    """Create this rank's stages and the schedule. Must be called on every rank (it creates groups).

    Args:
        spec: the intra-stage plan for the (dp, tp) mesh, made on the whole traced graph.
        cut: from `cut_stages`; `cut.num_stages` = pp (or pp * v for interleaved schedules, 2 pp for zbv,
            dualpipev and bitpipe).
        schedule: a key of SCHEDULES, or "bitpipe" (`runtime.bitpipe.build_bitpipe`, our P2P runner).
        loss_fn: `loss_fn(last stage outputs, target) -> scalar`.
        boundary: per stage boundary k (stage k -> k + 1) its codec kind ("int8", "lowrank") or None; () or
            a shorter tuple: the rest uncompressed (`boundary_codecs`). boundary_rank: the lowrank rank.
    A spec with a mixed-precision recipe (`spec.autocast`, `runtime.precision`) runs every stage's program under
    it (`StageModule`), with send/receive buffers in the dtypes the stages produce under it (`boundary_dtypes`).
    Raises ValueError for an unknown schedule or codec, or a stage count that does not fit pp; PipelineError
    for a buffer updated in forward that several stages (`check_buffer_copies`) or stage copies (bitpipe) would
    hold, a zero-bubble schedule on a stage reading a trained parameter twice (`check_split_backward`), or boundary dtypes that cannot be inferred under the recipe (`boundary_dtypes`).
    """
    if schedule in RUNNER_SCHEDULES:
        if any(boundary):
            raise PipelineError(f"pipeline-boundary compression {boundary} is not implemented for {schedule!r} (our own "
                                "P2P runner). Remedy: plan with boundary_compression='none' or another schedule")
        from .bitpipe import build_bitpipe  # runtime.bitpipe imports this module
        return build_bitpipe(traced, spec, cut, model, pp=pp, microbatches=microbatches, loss_fn=loss_fn)
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; use one of {sorted(SCHEDULES) + sorted(RUNNER_SCHEDULES)}")
    if any(kind not in (None, *KINDS) for kind in boundary):
        raise ValueError(f"boundary={boundary}: each entry must be None or one of {KINDS}")
    per_rank, rem = divmod(cut.num_stages, pp)
    if rem or (per_rank > 1) != (schedule in _MULTI_STAGE) or (schedule in V_PLACED and per_rank != 2):
        raise ValueError(f"{cut.num_stages} stages on pp={pp} with schedule {schedule!r}: use pp stages for "
                         f"gpipe/1f1b, a multiple (>= 2) of pp for interleaved schedules, 2 pp for zbv/dualpipev")
    check_buffer_copies(traced, cut)
    check_split_backward(traced, cut, schedule)
    dtypes = boundary_dtypes(traced, cut, spec.autocast)  # before any group is made: every rank raises alike
    width = spec.mesh.world_size
    rank = dist.get_rank()
    p, local = divmod(rank, width)
    where = [stage_pp_rank(schedule, k, cut.num_stages, pp) for k in range(cut.num_stages)]
    pp_groups = [[q * width + i for q in range(pp)] for i in range(width)]
    shared_by_local = [_shared_params(traced, cut, where, width, i) for i in range(width)]
    create_groups(pp_groups + [g for sh in shared_by_local for g in sh.values() if len(g) > 1]
                  + _sub_mesh_groups(spec, pp, width))
    group = find_group(pp_groups[local])
    stages, pipe = [], []
    for k in (k for k in range(cut.num_stages) if where[k] == p):
        tg = stage_graph(traced, cut, k)
        k_spec = stage_spec(spec, traced, cut, k, p * width)
        module = StageModule(tg, k_spec, local, model)
        snapshot_written_state(module.program.graph_module, tg)
        returning_all(module, traced, spec, cut, k, p * width)
        sent_layouts = _sent_layouts(k_spec, cut.outputs[k])
        module.in_codecs = boundary_codecs(traced, cut, k - 1, k_spec.inputs, spec, local, boundary, boundary_rank,
                                           dtypes)
        module.out_codecs = boundary_codecs(traced, cut, k, sent_layouts, spec, local, boundary, boundary_rank,
                                            dtypes)
        module.sent_dtypes = sent_dtypes(cut, k, dtypes, spec.autocast)
        stages.append(module)
        pipe.append(_SyncOnceStage(
            module, k, cut.num_stages, torch.device("cpu"), group=group,
            input_args=_on_wire(_examples(traced, cut.inputs[k], k_spec.inputs, spec, local, dtypes),
                                module.in_codecs),
            output_args=_on_wire(_examples(traced, *_returned(module, cut, k, sent_layouts), spec, local, dtypes),
                                 module.out_codecs)))
    loss = MicrobatchLoss(loss_fn, microbatches)
    sched = SCHEDULES[schedule](pipe if schedule in _MULTI_STAGE else pipe[0], microbatches,
                                loss_fn=loss, scale_grads=False,
                                output_merge_spec=_merge_spec(traced, cut.outputs[-1]))
    batch = traced.node(traced.input_names[0]).outputs[0].shape[0]
    return PipelineRun(stages, sched, shared_by_local[local], microbatches, batch, p == where[0],
                       p == where[-1], loss, pipe, output_reach(traced))


def _returned(module: StageModule, cut: StageCut, k: int, sent: dict[str, Layout]) -> tuple[tuple[str, ...], dict]:
    """(names, layouts) of the most values stage k's module returns: torch's stage sizes its per-output tables by
    the example outputs, so a last stage that may return all the model's outputs (`StageModule.whole`) declares
    them all (it sends none)."""
    if module.whole is None:
        return cut.outputs[k], sent
    return cut.model_outputs, _sent_layouts(module.whole[1], cut.model_outputs)


def _merge_spec(traced: TracedGraph, names: tuple[str, ...]) -> tuple:
    """How torch's schedule merges the last stage's microbatch outputs: along dim 0 (the batch), except a
    scalar (a model's own loss), which is summed (torch would try to concatenate 0-d tensors and fail)."""
    from torch.distributed.pipelining.microbatch import TensorChunkSpec, _CustomReducer
    return tuple(_CustomReducer(torch.tensor(0.0), lambda a, b: a + b) if not traced.node(n).outputs[0].shape
                 else TensorChunkSpec(0) for n in names)


def _sent_layouts(spec: ShardingSpec, names: tuple[str, ...]) -> dict[str, Layout]:
    return dict(zip(names, spec.nodes["output"].inputs))


def sent_dtypes(cut: StageCut, k: int, dtypes: dict[str, torch.dtype], recipe: str | None) -> tuple[torch.dtype, ...]:
    """What `StageModule.sent_dtypes` checks for stage k: the dtypes of its outputs under `recipe`, () without
    one (the traced dtypes need no check)."""
    return tuple(dtypes[n] for n in cut.outputs[k]) if recipe is not None else ()


def _examples(traced: TracedGraph, names: tuple[str, ...], layouts: dict[str, Layout], spec: ShardingSpec,
              local: int, dtypes: dict[str, torch.dtype] | None = None) -> tuple:
    """Empty tensors of the local shapes of `names` on sub-mesh rank `local` (torch's stages need them;
    shape inference would run the program, collectives included, on meta tensors), in `dtypes` (the
    dtypes under the plan's recipe, `boundary_dtypes`) or the traced dtypes."""
    out = []
    coords = mesh_coords(spec.mesh, local)
    for n in names:
        meta = traced.node(n).outputs[0]
        dtype = (dtypes or {}).get(n, meta.dtype)
        layout = layouts.get(n, Layout.replicate(spec.mesh.ndim))
        example = torch.empty(local_shape(meta.shape, layout, spec.mesh, coords), dtype=dtype)
        # received / sent activations carry gradients: torch's stage allocates its buffers from these flags,
        # which must agree on both sides of a boundary; a model input passed through (a float loss mask) carries
        # none (the receiver's `stage_spec.inputs` leaves model inputs out, the sender's layouts list them)
        out.append(example.requires_grad_(carries_grad(dtype) and n in layouts and n not in traced.input_names))
    return tuple(out)


def boundary_codecs(traced: TracedGraph, cut: StageCut, k: int, layouts: dict[str, Layout], spec: ShardingSpec,
                    local: int, boundary: tuple[str | None, ...], rank: int,
                    dtypes: dict[str, torch.dtype] | None = None) -> tuple[BoundaryCodec | None, ...]:
    """The codec of each value crossing boundary k (stage k -> k + 1, `cut.outputs[k]` order) on sub-mesh rank
    `local`: `boundary[k]`'s kind for the values that carry a gradient (`planner.segments.depends_on_parameters`:
    activations; not masks or inputs passed through, whose -inf entries a codec could not represent) and that
    `core.boundary_codec.compressible` accepts at their local shape; None for the others and outside
    0 <= k < len(boundary). The lowrank basis is seeded by the value's
    name (crc32), so a value passed through several stages is projected onto one subspace; sender and
    receiver compute the same codec from the same plan. A codec is made for the value's dtype in `dtypes` (under
    a mixed-precision recipe, `boundary_dtypes`: e.g. bfloat16; int8 then packs it into fp32 words as any
    float, lowrank projects it in bfloat16) or its traced dtype."""
    if not 0 <= k < min(len(boundary), cut.num_stages - 1) or boundary[k] is None:
        return ()
    from ..planner.segments import depends_on_parameters
    coords, learned = mesh_coords(spec.mesh, local), depends_on_parameters(traced)
    out = []
    for n in cut.outputs[k]:
        meta = traced.node(n).outputs[0]
        dtype = (dtypes or {}).get(n, meta.dtype)
        shape = tuple(local_shape(meta.shape, layouts.get(n, Layout.replicate(spec.mesh.ndim)), spec.mesh, coords))
        ok = n in learned and compressible(shape, dtype, boundary[k], rank)
        out.append(BoundaryCodec(boundary[k], shape, dtype, rank, zlib.crc32(n.encode())) if ok else None)
    return tuple(out)


def _on_wire(examples: tuple, codecs: tuple[BoundaryCodec | None, ...]) -> tuple:
    """The example tensors torch's stage allocates its buffers from, in their wire shape where compressed."""
    return tuple(torch.empty(c.wire_shape, dtype=c.wire_dtype).requires_grad_(e.requires_grad) if c is not None
                 else e for e, c in zip(examples, codecs + (None,) * (len(examples) - len(codecs))))


def _holders(traced: TracedGraph, cut: StageCut) -> dict[str, list[int]]:
    """FQN -> the stages using it, for every parameter used on more than one stage (a tied embedding / lm_head),
    frozen or not: one frozen at build may be unfrozen later, and its copies' gradient sum needs a process group
    made now (`build`); `sum_over_copies` skips copies that are frozen when it runs."""
    out = {}
    for fqn, p in traced.parameters.items():
        stages = sorted(uses_by_stage(traced, fqn, cut))
        if len(stages) > 1 and not p.is_buffer:
            out[fqn] = stages
    return out


def _shared_params(traced: TracedGraph, cut: StageCut, where: list[int], width: int,
                   local: int) -> dict[str, list[int]]:
    return {fqn: sorted({where[k] * width + local for k in stages})
            for fqn, stages in _holders(traced, cut).items()}


def _sub_mesh_groups(spec: ShardingSpec, pp: int, width: int) -> list[list[int]]:
    return ([[r + q * width for r in g] for q in range(pp) for g in all_axis_groups(spec.mesh)]
            + hierarchical_sub_groups(spec, tuple(q * width for q in range(pp))))


def _or_zeros(grad: torch.Tensor | None, param: torch.Tensor) -> torch.Tensor:
    return grad if grad is not None else torch.zeros_like(param)


def sync_shared_grads(run: PipelineRun) -> None:
    """Sum the gradients of parameters held by several stages over all their copies (after backward,
    before the optimizer step); every copy then holds the full gradient and stays equal to the others."""
    sum_over_copies(run.shared, run.stages)


def sum_over_copies(shared: dict[str, list[int]], stages) -> None:
    """For each FQN of `shared` (-> the global ranks holding a copy), in sorted order on every rank: sum the
    gradients of this rank's copies among `stages`, all-reduce the sum over the ranks, give it to each copy."""
    for fqn, ranks in sorted(shared.items()):
        copies = [m.get_parameter(fqn) for m in stages if fqn in m.traced.parameters]
        if not copies or not copies[0].requires_grad:  # frozen (now): its gradient stays None, as on one device
            continue
        # float16 / bfloat16 copies summed in float32, each copy's own float32 running sum over microbatches
        # included (`grad_sync.wide_grad`: BitPipe's twin copies hold parts of one use's sum), rounded once
        wide = sum_dtype(copies[0].dtype)
        total = sum(_or_zeros(wide_grad(c), c).to(wide) for c in copies)
        if len(ranks) > 1:  # a split backward's gradient keeps its op's strides: reduced as a contiguous copy
            all_reduce_in_place(total, group=find_group(ranks))
        for c in copies:
            c.grad = total.to(c.dtype, copy=True)
