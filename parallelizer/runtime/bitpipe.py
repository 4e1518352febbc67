"""BitPipe executed: a small runner over torch.distributed P2P ops that follows `planner.bitpipe`'s action lists.

Why our own runner: torch 2.13's `_PipelineScheduleRuntime` (custom action lists, `_load_actions` / CSV)
keys everything by stage index and gives each stage index ONE rank (`stage_index_to_group_rank`); its
stages talk to the neighbouring stage indices. BitPipe runs every model stage twice (one copy per
direction, on ranks r and p - 1 - r) and sends the up pipeline's activations to the "previous" rank, so the
copies would need 4p stage indices whose neighbours are not index +- 1 at the pipeline's turn, and the two
pipelines would have to share one microbatch counter and loss. None of that is expressible without
patching torch's private runtime, so this module runs the actions itself, with our stage modules
(`runtime.pipeline.StageModule`, one per copy, both copies built from the same model, so with the same
initial weights) and torch's P2P primitives (`dist.isend` / `dist.irecv`, every wait bounded by
`timeout_s`).

One step (`BitPipeRunner.step`, called by `PipelineRun.step` like torch's schedules):
- each rank runs its action list in order (under a plan's mixed-precision recipe every stage copy's program
  runs in its autocast context, `StageModule`, and the receive buffers have the dtypes the stages send,
  `runtime.pipeline.boundary_dtypes`): F(x, j) receives its inputs from copy x - 1 (or takes
  microbatch j of the batch at a copy's stage 0), runs the stage and sends what the next stage needs; the
  last stage computes `MicrobatchLoss` (weight n_j / N, token-weighted over the whole batch); B(x, j)
  receives the gradient of its outputs, runs autograd backward and sends the gradients of its received
  inputs back. A hand-off between two copies on the same rank (the V's tip) is a local copy. Sends are
  non-blocking; every cross-rank receive of the step is posted at its start (`_post_receives`, as torch's
  runtime posts its RECV actions ahead) and waited on (with the timeout) only by the action that consumes it:
  gloo's P2P moves a payload only once the receiver has posted (a rendezvous), so a receive posted when its
  action starts made every early hand-off wait for a handshake (round 25, r25e / r25i: 30 paired rounds under
  load at the bench's quick size, BitPipe's step 350 -> 235 ms, all ranks' CPU 312 -> 229 ms). The posted buffers (up to 2 x m boundary tensors
  per rank) are priced in BitPipe's peak memory (`planner.bitpipe.held_with_posted_receives`). The list order
  comes from one feasible execution, so this cannot deadlock (`planner.bitpipe`); a step that fails with
  receives or sends still posted leaves them to gloo (torch gives no way to cancel one), so the runner refuses
  every later step (DistributedError) rather than let a stale one take or give the next step's message;
- eager gradient synchronisation: right after a copy's last backward of the step, its gradient (of
  parameters used by that model stage only) is exchanged with its twin copy on rank p - 1 - r (isend +
  irecv of one flat buffer, overlapping the rest of the schedule); at the end each copy holds its own
  part + the twin's, the same sum on both ranks (floating-point addition is commutative); float16 / bfloat16
  gradients add up over the copy's microbatches, then with the twin's, in float32 and are rounded once
  (`grad_sync.widen_grads` / `wide_grad`; round 26: each twin rounded its half before). Every
  microbatch's loss is already weighted by n_j / N, so the sum is the batch gradient: no further scaling;
- parameters used by several model stages (GPT-2's tied wte / lm_head: stages 0 and S - 1) are summed
  over the local copies and all-reduced over the ranks holding a copy, after the schedule, as
  `runtime.pipeline.sync_shared_grads` does;
- gradients ADD to what `.grad` held before the step (gradient accumulation over several steps): the
  runner takes the old gradients off, synchronises this step's part only, and adds the old ones back;
- the two pipelines' last stages sit on ranks 0 and p - 1; they exchange their microbatch losses, so both
  report every microbatch's loss, in microbatch order.
"""
from __future__ import annotations

from datetime import timedelta

import functools

import torch
import torch.distributed as dist

from ..errors import PipelineError
from ..planner.action_schedule import ActionSchedule
from ..planner.bitpipe import bitpipe_actions
from ..planner.schedules import buffer_copies_reason
from ..core.redistribute import sum_dtype
from ..rewriter.collectives import carried_view
from ..rewriter.grad_sync import narrow_grads, wide_grad, widen_grads
from ..rewriter.spec import ShardingSpec
from ..tracer.graph import TracedGraph
from .grad_reach import output_reach
from .launch import DistributedError, create_groups
from .microbatch_loss import MicrobatchLoss
from .pipeline import (PipelineRun, StageCut, StageModule, _examples, _give_back, _holders,
                       _sub_mesh_groups, boundary_dtypes, returning_all, sent_dtypes, stage_graph, stage_pp_rank, stage_spec,
                       sum_over_copies)

_F, _B = "F", "B"
_VALUES_PER_MESSAGE = 64  # most values one stage hands to the next (tags are per value)


class BitPipeRunner:
    """Runs this rank's BitPipe action list (module docstring); duck-types torch's schedule `step`.

    Args:
        schedule: `planner.bitpipe.bitpipe_actions(pp, m)`.
        modules: action stage index x -> this rank's StageModule of model stage x % S (the copies it holds).
        examples: model stage k -> examples of the values it receives (`cut.inputs[k]`): empty tensors of the
            LOCAL shapes and dtypes; one with requires_grad carries a gradient back.
        pp_rank, width, local: this rank's pipeline index, the intra-stage mesh size and sub-mesh rank (the
            peers of a transfer have the same `local`: global rank = pp index * width + local).
        loss: the `MicrobatchLoss` the last stages call.
        shared: parameter FQN -> sorted global ranks holding a copy, for parameters of several model stages.
        timeout_s: the longest wait for one receive, in seconds.
    """

    def __init__(self, schedule: ActionSchedule, modules: dict, examples: dict, *, pp_rank: int, width: int,
                 local: int, loss, shared: dict[str, list[int]], timeout_s: float = 300.0) -> None:
        self.schedule, self.modules, self.examples = schedule, modules, examples
        self.pp_rank, self.width, self.local = pp_rank, width, local
        self.loss, self.shared, self.timeout = loss, shared, timedelta(seconds=timeout_s)
        self.actions = schedule.actions[pp_rank]
        S = schedule.num_stages
        self._last_backward = {}
        for i, a in enumerate(self.actions):
            if a.computation_type.value == _B:
                self._last_backward[a.stage_index] = i
        widest = max(len(ex) for ex in examples.values())
        if widest > _VALUES_PER_MESSAGE:  # each value of a hand-off gets its own tag (`_tag`)
            raise PipelineError(f"bitpipe: a stage boundary carries {widest} values, more than the runner's "
                                f"{_VALUES_PER_MESSAGE}. Remedy: cut the stages elsewhere, or another schedule")
        self._peer_last = [r for x, r in sorted(schedule.stage_to_rank.items())
                           if x % S == S - 1 and r != pp_rank]
        self._exchange_buffers: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        """Copy x -> (send, receive) flat buffers of its gradient exchange, kept from one step to the next (as
        DDP keeps its bucket tensors): fresh 13 MB buffers were page-faulted in on every step, 33,915 minor faults
        and ~50 ms of CPU per step over 4 ranks at the bench's full size (round 20, r20e)."""
        self._failed: str | None = None  # what a step that raised left posted (`step`): later steps refused
        self._stale: list = []  # its posted (buffer, Work, what): gloo may still write into the buffers, kept alive

    def _global(self, pp_rank: int) -> int:
        return pp_rank * self.width + self.local

    def _tag(self, kind: int, x: int, j: int, i: int) -> int:
        """A distinct tag per message of one step: kind (0 activation to stage x, 1 gradient to stage x, 2
        gradient exchange, 3 losses), stage copy x, microbatch j, value i."""
        n, m = self.schedule.num_stages * self.schedule.copies, self.schedule.num_microbatches
        return ((kind * n + x) * m + j) * _VALUES_PER_MESSAGE + i

    def step(self, *inputs, target=None, return_outputs: bool = False) -> None:
        """Run one step over all microbatches: inputs / target global (microbatches x traced batch in dim 0)
        on the ranks holding a copy's first / last stage; gradients are added to `.grad` (module docstring).
        `return_outputs`: torch's schedules' argument; nothing is returned or kept here either way.

        Raises:
            DistributedError: a receive did not complete within the timeout (names the stage copy, microbatch and
                peer), or an earlier step raised (its posted receives and sends could match this step's).
        """
        if self._failed is not None:
            raise DistributedError(
                f"bitpipe: an earlier step raised on pipeline rank {self.pp_rank} with {self._failed}; gloo cannot "
                "cancel a posted receive or send, and a stale one would take or give this step's messages (same "
                "tags). Remedy: destroy the process group and build the pipeline again (auto_parallelize)")
        posted = self._post_receives()
        try:
            self._run(posted, inputs, target)
        except BaseException:
            pending = [what for got in posted.values() for _, work, what in got if not work.is_completed()]
            self._failed = (f"{len(pending)} receives still posted ({'; '.join(pending[:3])}"
                            f"{' ...' if len(pending) > 3 else ''}) and its sends not waited on")
            self._stale = list(posted.values())
            raise

    def _run(self, posted: dict, inputs, target) -> None:
        """`step`'s body, the receives of the step already `posted` (`_post_receives`)."""
        m, S = self.schedule.num_microbatches, self.schedule.num_stages
        micro_in = [t.tensor_split(m) for t in inputs]
        micro_target = target.tensor_split(m) if isinstance(target, torch.Tensor) else [target] * m
        narrow_grads(self._params())  # a failed step's float32 running sums, as its partial .grad was
        earlier = _take_grads(self.modules.values())
        saved: dict[tuple[int, int], tuple] = {}  # (x, j) -> (inputs, outputs or loss)
        local_box: dict[tuple[str, int, int], list] = {}  # (kind, x, j) -> tensors handed over on this rank
        sends, exchanges, losses = [], [], {}
        for i, a in enumerate(self.actions):
            x, j, kind = a.stage_index, a.microbatch_index, a.computation_type.value
            k = x % S
            if kind == _F:
                received = ([t[j] for t in micro_in] if k == 0 else
                            self._receive(posted, local_box, _F, x, j, self.examples[k]))
                out = self.modules[x](*received)
                if k == S - 1:
                    weighted = self.loss(out, micro_target[j])
                    losses[j] = self.loss.recorded[-1]
                    saved[(x, j)] = (received, weighted)
                else:
                    saved[(x, j)] = (received, out)
                    self._send(sends, local_box, _F, x + 1, j, list(out))
            else:
                received, out = saved.pop((x, j))
                if k == S - 1:
                    out.backward()
                else:
                    grads = self._receive(posted, local_box, _B, x, j, _grad_examples(self.examples[k + 1]))
                    pairs = [(o, g) for o, g in zip(_grad_carrying(out, self.examples[k + 1]), grads)
                             if o.requires_grad]
                    if pairs:
                        torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
                if k > 0:
                    grads = [t.grad if t.grad is not None else torch.zeros_like(t)
                             for t, ex in zip(received, self.examples[k]) if ex.requires_grad]
                    self._send(sends, local_box, _B, x - 1, j, grads)
                widen_grads(self.modules[x].reading().parameters.values())  # float16 / bfloat16: summed in float32
                if self._last_backward.get(x) == i:
                    exchanges.append(self._start_exchange(x))
        for exchange in exchanges:
            self._finish_exchange(*exchange)
        sum_over_copies(self.shared, [self.modules[x] for x in sorted(self.modules)])  # tied parameters
        narrow_grads(self._params())  # the rest: rounded once
        self._share_losses(losses, sends)
        for work, what in sends:
            _wait(work, self.timeout, what)
        _give_back(earlier)

    def _send(self, sends: list, local_box: dict, kind: str, to_x: int, j: int, tensors: list) -> None:
        """Send `tensors` (activations for F, input gradients for B) to stage copy `to_x`, microbatch j."""
        to_rank = self.schedule.stage_to_rank[to_x]
        if to_rank == self.pp_rank:
            local_box[(kind, to_x, j)] = [t.detach().clone() for t in tensors]
            return
        for i, t in enumerate(tensors):
            t = t.detach().contiguous()
            what = f"{'activation' if kind == _F else 'gradient'} {i} of microbatch {j} to stage copy {to_x}"
            sends.append((dist.isend(carried_view(t), self._global(to_rank), tag=self._tag(kind == _B, to_x, j, i)),
                          what))

    def _post_receives(self) -> dict[tuple[str, int, int], list]:
        """Post every cross-rank receive of this rank's step (module docstring): (kind, x, j) -> [(buffer, Work,
        what)] per value, buffers of the receiving stage's local shapes and dtypes (`examples`), for F(x, j) from
        copy x - 1 and for B(x, j) from copy x + 1, in action order. Same-rank hand-offs post nothing."""
        S, posted = self.schedule.num_stages, {}
        for a in self.actions:
            x, j, kind = a.stage_index, a.microbatch_index, a.computation_type.value
            k = x % S
            if kind == _F and k > 0:
                from_x, examples = x - 1, self.examples[k]
            elif kind == _B and k < S - 1:
                from_x, examples = x + 1, _grad_examples(self.examples[k + 1])
            else:
                continue
            from_rank = self.schedule.stage_to_rank[from_x]
            if from_rank == self.pp_rank:
                continue
            got = []
            for i, ex in enumerate(examples):
                buf = torch.empty(ex.shape, dtype=ex.dtype)
                what = (f"{'activation' if kind == _F else 'gradient'} {i} of microbatch {j} for stage copy {x} "
                        f"from pipeline rank {from_rank}")
                got.append((buf, dist.irecv(carried_view(buf), self._global(from_rank),
                                            tag=self._tag(kind == _B, x, j, i)), what))
            posted[(kind, x, j)] = got
        return posted

    def _receive(self, posted: dict, local_box: dict, kind: str, x: int, j: int, examples) -> list[torch.Tensor]:
        """The tensors stage copy x gets for microbatch j (activations for F, output gradients for B): a local
        hand-off, or its posted receives (`_post_receives`) waited on now, each within the timeout."""
        if (kind, x, j) in local_box:
            got = local_box.pop((kind, x, j))
        else:
            got = []
            for buf, work, what in posted[(kind, x, j)]:
                _wait(work, self.timeout, what)
                got.append(buf)
            del posted[(kind, x, j)]  # after every wait: one that timed out stays listed (`step`)
        if kind == _F:
            got = [t.requires_grad_(ex.requires_grad) for t, ex in zip(got, examples)]
        return got

    def _params(self) -> list[torch.nn.Parameter]:
        """Every parameter of this rank's stage copies, from the step's walks of their trees (`tree_reading`)."""
        return [p for module in self.modules.values() for p in module.reading().parameters.values()]

    def _private_params(self, x: int) -> list[torch.nn.Parameter]:
        module = self.modules[x]
        return [p for fqn, p in sorted(module.reading().parameters.items())  # the step's walk (`tree_reading`)
                if p.requires_grad and fqn not in self.shared]

    def _start_exchange(self, x: int):
        """Send copy x's gradient to its twin and post the receive of the twin's (eager synchronisation)."""
        params = self._private_params(x)
        S = self.schedule.num_stages
        twin = (x + S) % (S * self.schedule.copies)
        peer = self._global(self.schedule.stage_to_rank[twin])
        if not params:
            return None, None, None, params
        mine, theirs = self._exchange_buffer(x, params)
        grads = [wide_grad(p) for p in params]  # the step's sum, float32 for float16 / bfloat16 (`widen_grads`)
        torch.cat([(g if g is not None else torch.zeros_like(p)).to(mine.dtype).reshape(-1)
                   for g, p in zip(grads, params)], out=mine)
        tag = self._tag(2, x % S, 0, 0)
        return (dist.isend(mine, peer, tag=tag), dist.irecv(theirs, peer, tag=tag), (mine, theirs), params)

    def _finish_exchange(self, send, recv, buffers, params) -> None:
        if send is None:
            return
        what = f"gradient exchange of {len(params)} parameters with the twin stage copy"
        _wait(recv, self.timeout, what)
        _wait(send, self.timeout, what)
        mine, theirs = buffers
        offset = 0
        for p in params:  # fresh gradients (the buffers are reused next step); the twin adds theirs + mine: equal
            n = p.numel()
            p.grad = (mine[offset:offset + n].view_as(p) + theirs[offset:offset + n].view_as(p)).to(p.dtype)
            offset += n

    def _exchange_buffer(self, x: int, params: list[torch.nn.Parameter]) -> tuple[torch.Tensor, torch.Tensor]:
        """Copy x's kept (send, receive) buffers, made anew only when its parameters' size or dtype changed
        (a parameter frozen or unfrozen between steps). The previous step's exchange has completed (both waits
        in `_finish_exchange`) before the next one writes into them."""
        numel = sum(p.numel() for p in params)  # summed in the dtype the sum runs in (float32 for float16 / bfloat16)
        dtype = sum_dtype(functools.reduce(torch.promote_types, (p.dtype for p in params)))
        kept = self._exchange_buffers.get(x)
        if kept is None or kept[0].numel() != numel or kept[0].dtype != dtype:
            kept = self._exchange_buffers[x] = (torch.empty(numel, dtype=dtype), torch.empty(numel, dtype=dtype))
        return kept

    def _share_losses(self, losses: dict, sends: list) -> None:
        """Give every rank holding a last stage all m microbatch losses: `loss.recorded` in microbatch order."""
        if not losses and not self._holds_last():
            return
        m = self.schedule.num_microbatches
        values = torch.zeros(m, dtype=torch.float64)
        weights = torch.zeros(m, dtype=torch.float64)
        for j, (loss, weight) in losses.items():
            values[j], weights[j] = loss.to(torch.float64), float(weight)
        for peer in self._peer_last:
            for i, t in enumerate((values, weights)):
                sends.append((dist.isend(t.clone(), self._global(peer), tag=self._tag(3, 0, 0, i)), "losses"))
        for peer in self._peer_last:
            for i, t in enumerate((torch.empty_like(values), torch.empty_like(weights))):
                _wait(dist.irecv(t, self._global(peer), tag=self._tag(3, 0, 0, i)), self.timeout,
                      f"microbatch losses from pipeline rank {peer}")
                (values if i == 0 else weights).add_(t)
        dtype = next(iter(losses.values()))[0].dtype if losses else torch.float32
        like = next(iter(losses.values()))[1] if losses else 0.0  # received weights typed as this rank's own: the
        # batch loss (`microbatch_loss.batch_loss`) then has one dtype on every rank (a float64 weight made it float64)
        self.loss.recorded[:] = [losses[j] if j in losses else
                                 (values[j].to(dtype), weights[j].to(like.dtype) if isinstance(like, torch.Tensor)
                                  else weights[j].item()) for j in range(m)]

    def _holds_last(self) -> bool:
        S = self.schedule.num_stages
        return any(x % S == S - 1 for x in self.modules)


def _grad_examples(examples) -> list[torch.Tensor]:
    return [ex for ex in examples if ex.requires_grad]


def _grad_carrying(outputs, receiver_examples) -> list[torch.Tensor]:
    """The outputs whose gradient the next stage sends back (its received inputs with requires_grad)."""
    return [o for o, ex in zip(outputs, receiver_examples) if ex.requires_grad]


def _wait(work, timeout: timedelta, what: str) -> None:
    try:
        work.wait(timeout)
    except RuntimeError as e:
        raise DistributedError(f"bitpipe: {what} did not complete within {timeout.total_seconds():.0f} s ({e}). "
                               "Remedy: check that every rank runs the same plan and step; raise timeout_s for "
                               "slow stages") from e


def _take_grads(modules) -> list[tuple[torch.Tensor, torch.Tensor]]:
    taken = []
    for module in modules:
        for p in module.reading().parameters.values():  # the step's walk (`tree_reading.held`)
            if p.grad is not None:
                taken.append((p, p.grad))
                p.grad = None
    return taken


def stage_holders(schedule: str, stage: int, num_stages: int, pp: int) -> tuple[int, ...]:
    """The pipeline ranks holding a copy of `stage`: one (`runtime.pipeline.stage_pp_rank`), or for bitpipe
    its down copy's rank q and the up copy's rank pp - 1 - q (`planner.bitpipe.bitpipe_placement`)."""
    q = stage_pp_rank(schedule, stage, num_stages, pp)
    return (q, pp - 1 - q) if schedule == "bitpipe" else (q,)


def build_bitpipe(traced: TracedGraph, spec: ShardingSpec, cut: StageCut, model: torch.nn.Module, *, pp: int,
                  microbatches: int, loss_fn, timeout_s: float = 300.0) -> PipelineRun:
    """This rank's `PipelineRun` of a BitPipe plan: its 4 stage copies (`planner.bitpipe.bitpipe_placement`),
    each a StageModule of the model stage's program on the intra-stage plan, and a `BitPipeRunner` as the
    schedule. Collective (creates process groups): call on every rank. Arguments as `runtime.pipeline.build`.

    Raises:
        PipelineError: `cut.num_stages` != 2 pp, pp odd, microbatches not a multiple of pp, or a buffer updated
            in forward (`planner.schedules.buffer_copies_reason`: two copies would diverge), with the remedy.
    """
    if (why := buffer_copies_reason("bitpipe", traced.mutated_state())) is not None:
        raise PipelineError(f"bitpipe: {why}")  # never train on with diverging copies (a plan from elsewhere)
    if cut.num_stages != 2 * pp:
        raise PipelineError(f"bitpipe on pp={pp} runs 2 * pp = {2 * pp} model stages (2 chunks per rank and "
                            f"pipeline direction); the plan has {cut.num_stages}. Remedy: a plan with 2 stages per "
                            "pp rank (virtual_stages=2)")
    try:
        schedule = bitpipe_actions(pp, microbatches)
    except ValueError as e:
        raise PipelineError(f"bitpipe: {e}") from None
    dtypes = boundary_dtypes(traced, cut, spec.autocast)  # under a recipe: what the stages send (before any group)
    S, width = cut.num_stages, spec.mesh.world_size
    p, local = divmod(dist.get_rank(), width)
    holders = {fqn: sorted({schedule.stage_to_rank[c * S + k] for c in range(schedule.copies) for k in stages})
               for fqn, stages in _holders(traced, cut).items()}
    shared_by_local = [{fqn: [q * width + i for q in ranks] for fqn, ranks in holders.items()}
                       for i in range(width)]
    pp_groups = [[q * width + i for q in range(pp)] for i in range(width)]  # PipelineModule's loss broadcast
    create_groups(pp_groups + [g for sh in shared_by_local for g in sh.values() if len(g) > 1]
                  + _sub_mesh_groups(spec, pp, width))
    examples, modules = {}, {}
    for k in range(S):
        k_spec = stage_spec(spec, traced, cut, k, p * width)
        examples[k] = _examples(traced, cut.inputs[k], k_spec.inputs, spec, local, dtypes)
        for c in range(schedule.copies):
            if schedule.stage_to_rank[c * S + k] == p:
                modules[c * S + k] = StageModule(stage_graph(traced, cut, k), k_spec, local, model)
                returning_all(modules[c * S + k], traced, spec, cut, k, p * width)
                modules[c * S + k].sent_dtypes = sent_dtypes(cut, k, dtypes, spec.autocast)
    loss = MicrobatchLoss(loss_fn, microbatches)
    runner = BitPipeRunner(schedule, modules, examples, pp_rank=p, width=width, local=local, loss=loss,
                           shared=shared_by_local[local], timeout_s=timeout_s)
    ends = {schedule.stage_to_rank[c * S + k] for c in range(schedule.copies) for k in (0, S - 1)}
    batch = traced.node(traced.input_names[0]).outputs[0].shape[0]
    return PipelineRun([modules[x] for x in sorted(modules)], runner, {}, microbatches, batch, p in ends,
                       p in ends, loss, reach=output_reach(traced))
