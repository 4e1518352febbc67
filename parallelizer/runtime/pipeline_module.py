"""`PipelineModule`: what `auto_parallelize` returns for a pipeline plan on one rank, with the training-step
API of every plan (`runtime.step`).

    pm = parallelizer.auto_parallelize(model, (ids,), mesh={"pp": 2, "dp": 2})   # under torchrun
    opt = torch.optim.AdamW(pm.parameters())
    loss = pm.step(ids, target=labels, loss_fn=loss_fn)   # forward + backward over all microbatches
    opt.step(); opt.zero_grad()

Which rank holds what (mesh (pp, dp, tp), pp outermost): global rank r is pp rank p = r // (dp * tp) and holds
stages p, p + pp, ... (one stage for 1F1B/GPipe, `virtual_stages` for interleaved schedules; p and 2 pp - 1 - p
for zbv / dualpipev; for bitpipe also the mirrored copies of stages pp - 1 - p and pp + p, `runtime.bitpipe`) of
`Plan.pipeline.stages`; each stage is a `runtime.pipeline.StageModule` holding this rank's shards of the
parameters its blocks use (`ParallelModule` on the stage's (dp, tp) sub-mesh). A parameter used by several
stages (a tied embedding / lm_head) has a copy on each; their gradients are summed in `step`, so the copies
stay equal under any optimizer that treats equal parameters with equal gradients alike.

nn.Module contract, as far as a pipeline allows:
- `parameters()` / `named_parameters()` / `named_buffers()`: the local shards of this rank's stages, named by
  the model's FQNs (a copy held twice on this rank is yielded twice under its name); a torch optimizer steps
  them as usual, and param groups chosen by name group alike on every plan.
- `state_dict()` / `load_state_dict()`: local shards named `stages.<i>.<model FQN>` (i-th stage of this rank;
  a per-rank checkpoint: reload it on
  the same plan and world size). `full_state_dict()` / `load_full_state_dict()`: the model's own keys and
  full tensors (gathered over sub-meshes, broadcast over the pipeline), as `ParallelModule`'s.
  `parallelizer.checkpoint.save` / `load` write and read the same sharded DCP checkpoint as for a
  `ParallelModule` (model and optimizer state), so a checkpoint moves between pipeline and other plans.
- `clip_grad_norm_(max_norm, norm_type)`: clips by the norm of the whole model's gradient, each parameter
  counted once over stages, copies and shards (call it on every rank after `step`).
- `train()` / `eval()` set the flags of every module of this rank's stages, as on the model. `step` trains in
  the mode the model was traced in (`pm.train()` before it, after an evaluation); in eval mode `pm(*inputs)`
  is an evaluation forward (`runtime.pipeline_eval`: the stages traced again in eval mode, forward only, no
  gradient or optimizer state touched) returning the model's outputs on EVERY rank; in train mode `forward`
  raises PipelineError (a pipeline trains through `step`).
- the model root's plain settings (`pm.temperature`, read in forward) are held by the PipelineModule as by a
  ParallelModule; one changed after build is refused by `step` and the evaluation forward (PipelineError naming
  it: the stages cannot trace again for training), where a ParallelModule traces again. A root tensor attribute
  that is not a buffer (`pm.mask = t`) is replaced on every stage holding it, as a ParallelModule replaces it.
- hooks: forward (pre-)hooks and module backward hooks on the PipelineModule run on the evaluation forward; `step`
  refuses them (PipelineError: it never calls the module's forward, so they would not run); tensor hooks on
  parameters and state-dict hooks work as on any module (`runtime.pipeline_contract`).
"""
from __future__ import annotations

import functools

import torch
import torch.distributed as dist
from torch.nn.modules.module import _IncompatibleKeys

from ..errors import PipelineError, StateDictError
from ..planner import Plan
from ..planner.boundary import build_options
from ..rewriter.collectives import all_reduce_max, find_group
from ..rewriter.spec import spec_from_plan
from ..tracer.graph import TracedGraph
from ..tracer.leaves import unflatten_in_order
from ..tracer.node_facts import drawing_ops
from .grad_norm import clip_grad_norm_, global_norm
from .in_place import broadcast_in_place
from .model_attrs import ModelAttributes
from .pipeline_contract import PipelineContract
from .pipeline_weighting import MicrobatchWeighting
from .stale_model import tag_snapshot
from .grad_norm import register_module as register_for_clipping
from .optimizer_check import install as check_optimizer_steps
from .replicas import check_same_generator, check_same_inputs, generator_groups, inputs_unchecked
from .wrappers import install as check_wrappers
from .module_contract import check_state_keys, pickling_refused
from .microbatches import global_tensor_inputs
from .pipeline import PipelineRun, build, plan_cut, stage_pp_rank
from .zero1 import axis_group
from .loss_weight import OwnLossWeighting, needs_batch_check, own_loss_weighting
from .loss_weight import batch_target as batch_target_of
from .modes import Retracer
from .step import LossFn, StepError, check_grad_enabled, check_loss_source, compute_loss, count_items


class PipelineModule(MicrobatchWeighting, PipelineContract, ModelAttributes, torch.nn.Module):
    """This rank's stages of a pipeline plan (module docstring), trained with `step`.

    Attributes:
        run: the `runtime.pipeline.PipelineRun` (stages, torch schedule, shared-parameter groups).
        stages: the stage modules (a ModuleList: `parameters()` are theirs).
        plan: the `Plan` (set by `auto_parallelize`); traced: the graph of ONE microbatch.
        first / last: whether this rank runs the first / the last stage.
        copied: FQNs of the parameters the pipeline holds more than once (a tied embedding / lm_head on two
            stages; every parameter under BitPipe): `runtime.init_check` refuses random initialisers on them.
    """

    def __init__(self, run: PipelineRun, traced: TracedGraph, plan: Plan, rank: int) -> None:
        super().__init__()
        self.run, self.traced, self.plan = run, traced, plan
        self.stages = torch.nn.ModuleList(run.stages)
        pipe = plan.pipeline
        width = plan.mesh.world_size
        local = rank % width
        self._pp_ranks = [q * width + local for q in range(pipe.pp)]
        # the rank of the last stage with this rank's (dp, tp) coordinates: its loss is sent to the pp group
        self._loss_rank = stage_pp_rank(pipe.schedule, len(pipe.stages) - 1, len(pipe.stages), pipe.pp) * width + local
        self._own_weighting: OwnLossWeighting | None = None  # `runtime.loss_weight`, read on the first own-loss step
        self._fn_count: tuple = (None, None)  # (loss_fn, target dtype, shape) -> its item count (`_loss_fn_count`)
        self._own_use: tuple = (None, None)  # (loss_fn, how it uses the model's own loss: `_weighs_as_own_loss`)
        self._trusted_warned = False  # `_warn_trusted_count` ran
        self._checked_counts: set = set()  # (loss_fn, item_count) pairs `_check_user_count` looked at
        self._checked_mixing: set = set()  # (loss_fn, target dtype, shape) `_warn_loss_fn_mixing` looked at
        self._rank = rank
        self.copied: frozenset[str] = frozenset()  # FQNs held more than once in the pipeline (build_pipeline_module)
        for stage in run.stages:  # torch.nn.utils.clip_grad_norm_(pm.parameters()) clips over all stages
            register_for_clipping(stage, pipeline=self)
        check_optimizer_steps()
        check_wrappers()

    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        """(model FQN, this rank's shard) of every parameter of this rank's stages, in stage order: the names a
        `ParallelModule` and the model itself give, so that a loop choosing optimizer param groups by name
        (`n.startswith("norm.")`, torchtitan / nanoGPT style) groups alike on every plan. A parameter this rank
        holds on several of its stages (a tied embedding / lm_head on a V schedule; BitPipe's two copies) is
        yielded once per copy under the same name: the copies are distinct tensors kept equal (`step` sums their
        gradients). Before (round 19, trial g) the names were `stages.<i>.<FQN>`: such a loop put every tensor
        in its default group on pipelines only (loss 3.5e-3, parameters 9e-3 off one device). `state_dict()`
        keeps `stages.<i>.<FQN>` (a per-rank checkpoint of this plan)."""
        return self._stage_members("named_parameters", prefix, recurse, remove_duplicate)

    def named_buffers(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        """(model FQN, this rank's shard) of every buffer of this rank's stages, named as `named_parameters`."""
        return self._stage_members("named_buffers", prefix, recurse, remove_duplicate)

    def _stage_members(self, kind: str, prefix: str, recurse: bool, remove_duplicate: bool):
        """(model FQN, tensor) of each stage's `kind` ("named_parameters" / "named_buffers"), in stage order."""
        seen: set[int] = set()
        for stage in self.stages:
            for name, t in getattr(stage, kind)("", recurse, remove_duplicate):
                if not (remove_duplicate and id(t) in seen):
                    seen.add(id(t))
                    yield (f"{prefix}.{name}" if prefix else name), t

    @property
    def first(self) -> bool:
        return self.run.first

    @property
    def last(self) -> bool:
        return self.run.last

    def train(self, mode: bool = True) -> "PipelineModule":
        """`nn.Module.train`: sets the flag of every module of this rank's stages (their mirrors of the model's
        modules). In eval mode `pm(*inputs)` evaluates (`runtime.pipeline_eval`); `step` needs the mode the model
        was traced in. Before (round 21, trial g), `pm.eval()` raised, and neither remedy it named served a
        training run that evaluates every N steps."""
        return super().train(mode)

    def __deepcopy__(self, memo: dict):
        """Refused (PipelineError): a copy would need its own schedules and stage-to-stage channels, which
        deepcopy cannot make (before: torch's "Cannot access data pointer" RuntimeError from the kept trace)."""
        raise PipelineError("copy.deepcopy(PipelineModule) (e.g. torch.optim.swa_utils.AveragedModel or an EMA "
                            "teacher): a pipeline's copy would need its own schedules and channels between stages. "
                            "Remedy: keep the average of the local parameters yourself (ema = [p.detach().clone() "
                            "for p in pm.parameters()], then ema_p.lerp_(p, 1 - decay) after each step), or a plan "
                            "without 'pp', whose ParallelModule can be deep-copied")

    def __reduce_ex__(self, protocol):
        """Refused (UnsupportedOpError): `torch.save(pm, path)` / pickle (`module.pickling_refused`)."""
        raise pickling_refused(type(self).__name__)

    def apply(self, fn):
        """Refused (PipelineError): the stages hold this rank's pieces of the model (each stage's modules mirror
        the whole model's, `runtime.mirror`, but only its own parameters are there, as shards), so `fn` would see
        neither every parameter nor whole tensors; a ParallelModule runs `fn` on the full model
        (`ParallelModule.apply`)."""
        raise PipelineError("PipelineModule.apply(fn): the stages hold this rank's pieces of the model, so fn (an "
                            "initialiser) would see neither all parameters nor whole tensors. Remedy: apply fn to the "
                            "model before auto_parallelize, or load values with pm.load_full_state_dict(state_dict)")

    def forward(self, *args, **kwargs):
        """In eval mode (`pm.eval()`): the evaluation forward of the global call through the stages, forward only,
        returning the model's output structure (full tensors, detached) on every rank (`runtime.pipeline_eval`;
        collective: call on every rank with the same inputs). In train mode: PipelineError (train with `step`).

        Raises:
            PipelineError: train mode; a root setting changed after build (`_check_root_settings`); a batch that
                is not a multiple of the traced microbatch size.
        """
        if self.training:
            raise PipelineError("PipelineModule: in train mode a pipeline plan runs forward and backward together "
                                f"over its {self.run.microbatches} microbatches. Remedy: loss = pm.step(*inputs, "
                                "target=..., loss_fn=...) to train; to evaluate, pm.eval() then pm(*inputs) (under "
                                "torch.no_grad()), then pm.train() to train on")
        self._check_modes("PipelineModule evaluation", flags=False)
        self._check_root_settings("PipelineModule evaluation")
        from .pipeline_eval import evaluate  # imports this module's dtype codes
        return evaluate(self, args, kwargs)

    def step(self, *inputs, target: torch.Tensor | None = None, loss_fn: LossFn | None = None,
             item_count=count_items, **kwargs) -> torch.Tensor:
        """Forward and backward of the global batch over the plan's microbatches (`runtime.step`).

        Collective: call on every rank with the same global inputs and target. The first stage's ranks feed
        the inputs, the last stage's compute the loss of each microbatch (`loss_fn` on the model's output
        structure), weighted by its share n_j / N of the batch's items, so the result is the single-device loss
        of the whole batch: with `loss_fn`, n_j = `item_count(target_j)` (default: read from loss_fn's ATen
        graph, e.g. a shifted cross-entropy counts its shifted non-ignored labels, `loss_fn_weight.loss_fn_weighting`;
        `count_items` when make_fx cannot trace loss_fn); with loss_fn=None (the model's own loss, e.g. transformers given labels=) n_j is
        read from the model's loss op and the microbatch's own inputs (`runtime.loss_weight`), unless
        `item_count` and `target` are both given. Gradients are ADDED to `.grad` (tied copies summed over
        stages); step the optimizer afterwards.

        Args:
            inputs / kwargs: the model's inputs, global: dim 0 of every tensor = microbatches x traced batch.
            target: a tensor with the same dim 0 (split like the inputs), or None (loss_fn then gets None; with
                a loss_fn microbatches then weigh equally, right for a mean over fixed-shape outputs, unless
                loss_fn reads the model's own loss: `_weighs_as_own_loss`).
            loss_fn: `loss_fn(output, target_j) -> scalar` (a mean); None: the model's first output is its loss.
            item_count: `item_count(target) -> n` (int or 0-d tensor), the items a mean loss over `target` counts;
                needs `target`.
        Returns:
            The loss of the whole batch (0-d float32, detached) on EVERY rank: sent from the last stage to the
            ranks of its pipeline (a broadcast over the pp group).
        Raises:
            PipelineError: a batch that does not split into the plan's microbatches (before any communication);
                an input or target that requires grad (the schedules send no gradient back to it).
            StepError: loss_fn=None and the model's first output is not a scalar loss, or a loss op whose
                per-microbatch item count the graph does not show (`own_loss_weighting`; remedy: target= and
                item_count=); item_count without target; a target that is not a tensor; a loss that is not 0-d.
            TypeError / ValueError / PlanMismatchError: inputs of another structure or shape than traced.
        """
        check_grad_enabled("PipelineModule.step")
        check_loss_source(self.traced, loss_fn, "PipelineModule.step", kwargs,
                          ("target",) * (target is not None) + ("item_count",) * (item_count is not count_items))
        readings = self._check_modes()  # one walk per stage, lent to the stages for the step (`tree_reading`)
        self._check_root_settings("PipelineModule.step")
        self._refuse_module_hooks("PipelineModule.step")
        if target is not None and not isinstance(target, torch.Tensor):
            raise StepError(f"PipelineModule.step: target must be a tensor (split into microbatches along dim 0) or "
                            f"None, got {type(target).__name__}. Remedy: pass one tensor, or put the other values "
                            "into the model's inputs")
        if target is None and item_count is not count_items:
            raise StepError("PipelineModule.step: item_count= was given without target=, so there is nothing to count "
                            "per microbatch. Remedy: pass target=<the tensor item_count counts, e.g. labels> too, or "
                            "drop item_count (with loss_fn=None the weights come from the model's own loss op)")
        flat = global_tensor_inputs(self.traced, inputs, kwargs, self.run.microbatches)
        if inputs_unchecked(self, count=True):
            check_same_inputs([*zip(self.traced.input_names, flat), ("target", target)], "PipelineModule.step")
            draws, width = drawing_ops(self.traced.graph_module), self.plan.mesh.world_size
            groups = generator_groups(spec_from_plan(self.plan), draws)  # within a stage: ranks q * width + g
            check_same_generator(draws, [[q * width + r for r in g] for q in range(len(self._pp_ranks)) for g in groups],
                                 "PipelineModule.step", flat[0].device if flat else None)
        _refuse_input_gradients(self.traced, flat, target)
        out_spec = self.traced.exported.call_spec.out_spec
        fn = functools.partial(_structured_loss, loss_fn, out_spec, target is None or loss_fn is None)
        if loss_fn is None and item_count is count_items:  # the model's own loss: weights from its loss op
            if self._own_weighting is None:  # same graphs on every rank: raises alike
                self._own_weighting = own_loss_weighting(self.traced, self._doubled_trace())
            batch_target, count = batch_target_of(self._own_weighting, flat, self.run.microbatches)
        elif target is None and self._weighs_as_own_loss(loss_fn):  # loss_fn scales the model's own loss
            batch_target, count = batch_target_of(self._own_weighting, flat, self.run.microbatches)
        elif target is None:  # loss_fn on the outputs alone (a mean over fixed-shape outputs): equal weights
            batch_target, count = torch.zeros(flat[0].shape[0]), None  # torch's schedules split a tensor
        elif loss_fn is not None and item_count is count_items:  # the default count, checked against loss_fn
            batch_target, count = target, self._loss_fn_count(loss_fn, target)
        else:
            if loss_fn is None:
                self._warn_trusted_count()
            else:
                self._check_user_count(loss_fn, target, item_count)
            batch_target, count = target, item_count
        if loss_fn is not None:
            self._warn_loss_fn_mixing(loss_fn, fn, batch_target, count)
        for stage in self.run.stages:  # a loss_fn reads the model's outputs; the own loss alone needs no other
            stage.returns_all = loss_fn is not None
        if loss_fn is not None:
            self._warn_unpriced_outputs()
        loss = self.run.step(*flat, target=batch_target, loss_fn=fn, item_count=count, readings=readings)
        value = (loss.detach().to(torch.float64) if loss is not None else torch.zeros((), dtype=torch.float64))
        if len(self._pp_ranks) > 1:
            broadcast_in_place(value, self._loss_rank, group=find_group(self._pp_ranks))
        return value.to(torch.float32)

    def process_group(self, axis: str):
        """The torch ProcessGroup of this rank's ranks along axis `axis` of the intra-stage (dp, tp) mesh: the
        ranks holding the same stages, e.g. for ZeRO-1 over a stage's data-parallel replicas
        (`ZeroRedundancyOptimizer(pm.parameters(), optimizer_class=torch.optim.AdamW,
        process_group=pm.process_group("dp"))`, `runtime/zero1.py`). Every stage a rank holds has the same
        intra-stage coordinates, so one group serves them all. Raises ValueError for "pp" or an axis of a
        single device."""
        stage = self.run.stages[0]
        return axis_group(stage.groups, stage.spec.mesh, axis, "PipelineModule.process_group")

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Gather every tensor of the model's `state_dict()` to its full value on EVERY rank (collective: call on
        all ranks), as `ParallelModule.full_state_dict` does on one mesh.

        Keys are exactly those of the original model's `state_dict()` (tied aliases included, non-persistent
        buffers and lifted constants left out), so `model.load_state_dict(sd, strict=True)` works on the
        unparallelised model. Each stage gathers its tensors over its (dp, tp) sub-mesh; a tensor is then
        broadcast over the pp group from the lowest pp rank holding it (copies on other stages, and BitPipe's
        twins, are equal after `step`). For models whose full state fits one device.
        """
        fulls: dict[str, torch.Tensor] = {}
        for stage in self.run.stages:  # every rank of a stage's sub-mesh runs the same stages in the same order
            for fqn, full in stage.full_state_dict().items():
                fulls.setdefault(fqn, full)
        params = self.traced.parameters
        names = sorted(f for f, info in params.items() if info.persistent)
        holder = self._lowest_holders(names, lambda f: f in fulls)
        if orphans := [f for f in names if f not in holder]:
            raise StateDictError(f"PipelineModule.full_state_dict: no stage holds {orphans[:5]} (the traced forward "
                                 "never reads them, so no stage program keeps them). Remedy: take them from the "
                                 "model itself, or remove unused parameters", missing=orphans, unexpected=[])
        dtypes = self._holder_dtypes(names, holder, fulls)
        out = {}
        for fqn in names:
            info = params[fqn]
            mine = holder[fqn] == dist.get_rank()
            full = fulls[fqn].clone() if mine else torch.empty(info.shape, dtype=dtypes[fqn])
            if len(self._pp_ranks) > 1:
                broadcast_in_place(full, holder[fqn], group=find_group(self._pp_ranks))  # any strides
            for name in (fqn, *info.aliases):
                out[name] = full
        return tag_snapshot(self, out)

    def load_full_state_dict(self, state_dict: dict[str, torch.Tensor], strict: bool = True):
        """Copy this rank's shard of each full tensor in `state_dict` (the model's `state_dict()` keys) into every
        stage it holds (each copy of a tied or BitPipe-twinned tensor). No communication.

        Returns (missing_keys, unexpected_keys) against the whole model, like `nn.Module.load_state_dict`.
        Raises:
            StateDictError: with strict=True, keys missing or unexpected; a tensor of another shape than the
                model's (`ParallelModule.load_full_state_dict`'s checks, per stage).
        """
        expected, missing, unexpected = check_state_keys(self.traced, state_dict, strict,
                                                         "PipelineModule.load_full_state_dict")
        for stage in self.run.stages:
            stage.load_full_state_dict({k: v for k, v in state_dict.items() if k in expected}, strict=False)
        return _IncompatibleKeys(missing, unexpected)

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False,
                        foreach: bool | None = None) -> torch.Tensor:
        """`torch.nn.utils.clip_grad_norm_` over the GLOBAL gradient of the whole model (collective: call on
        every rank after `step`), as `ParallelModule.clip_grad_norm_` does on one mesh (`runtime.grad_norm`).

        Every parameter counts once: a parameter that several stages hold (a tied embedding / lm_head) or that
        BitPipe keeps twice (its two pipeline directions) has equal gradients on every copy after `step`, so
        only the copy on the lowest pp rank holding it is counted (an all-reduce over the pp group finds it);
        within a stage, shards count over the (dp, tp) axes that shard them. The per-rank totals are summed over
        the pp group, and every copy and shard on every rank is scaled by the same min(1, max_norm / (total +
        1e-6)). Returns the total norm (a scalar tensor in the promotion of all stages' gradient dtypes, the same bitwise on every rank).

        Raises:
            ValueError: norm_type is not > 0 or inf. RuntimeError: a non-finite total with error_if_nonfinite.
        """
        held, counted, across = self._norm_pieces(lambda p: p.requires_grad)
        first = self.run.stages[0]
        return clip_grad_norm_([c for copies in held.values() for c in copies], first.spec.mesh, first.groups,
                               max_norm, norm_type, error_if_nonfinite=error_if_nonfinite, foreach=foreach,
                               counted=counted, across=across)

    def total_norm(self, norm_type: float = 2.0, *, of: str = "grad", error_if_nonfinite: bool = False) -> torch.Tensor:
        """The p-norm of the whole model's gradients (`of="grad"`) or parameters (`of="value"`) over all stages,
        each parameter counted once as in `clip_grad_norm_`; what `torch.nn.utils.get_total_norm` gives for
        `[p.grad for p in pm.parameters() if p.grad is not None]` or `pm.parameters()` (collective: call on
        every rank). A scalar tensor, the same bitwise on every rank.

        Raises:
            ValueError: `of` is neither "grad" nor "value"; norm_type is not > 0 or inf. RuntimeError: a
                non-finite total with error_if_nonfinite."""
        if of not in ("grad", "value"):
            raise ValueError(f"PipelineModule.total_norm: of must be 'grad' or 'value', got {of!r}")
        _, counted, across = self._norm_pieces((lambda p: p.requires_grad) if of == "grad" else (lambda p: True))
        pieces = [(p.grad if of == "grad" else p, layout) for p, layout in counted]
        first = self.run.stages[0]
        return global_norm([(t, layout) for t, layout in pieces if t is not None], first.spec.mesh, first.groups,
                           norm_type, error_if_nonfinite=error_if_nonfinite, across=across)

    def _norm_pieces(self, counts) -> tuple[dict, list, list]:
        """(FQN -> every (local parameter, layout) this rank's stages hold, the pairs this rank counts in a
        global norm: one copy of each parameter `counts` is true for, on the lowest pp rank holding it, the
        pp groups to sum over)."""
        held: dict[str, list[tuple[torch.Tensor, object]]] = {}
        for stage in self.run.stages:
            for fqn, p in stage.named_parameters():
                held.setdefault(fqn, []).append((p, stage.spec.params[fqn]))
        names = sorted(f for f, info in self.traced.parameters.items() if not info.is_buffer)
        holder = self._lowest_holders(names, lambda f: any(counts(p) for p, _ in held.get(f, ())))
        counted = [held[fqn][0] for fqn in names if holder.get(fqn) == dist.get_rank()]
        return held, counted, [self._pp_ranks] if len(self._pp_ranks) > 1 else []

    def _holder_dtypes(self, names: list[str], holder: dict[str, int], fulls: dict) -> dict[str, torch.dtype]:
        """name -> the dtype of the holder's tensor (`_lowest_holders`), which the other pp ranks receive into: the
        parameters' dtype now, not the traced one (trial r14c: after `pm.to(torch.bfloat16)` the other ranks
        received bf16 bytes into float32 buffers, and full_state_dict returned values 1e17 off, silently). An
        all-reduce (max) over the pp group of each name's dtype code, set by its holder only."""
        if len(self._pp_ranks) == 1:
            return {f: fulls[f].dtype for f in names}
        mine = torch.tensor([_code(fulls[f].dtype) if holder[f] == dist.get_rank() else 0 for f in names],
                            dtype=torch.float64)
        dtypes = {f: _DTYPES[int(c) - 1] if int(c) <= len(_DTYPES) else None
                  for f, c in zip(names, all_reduce_max(mine, self._pp_ranks).tolist())}
        if odd := [f for f, d in dtypes.items() if d is None]:  # the same verdict on every rank
            raise StateDictError(f"PipelineModule.full_state_dict: {odd[0]!r} is held in a dtype outside {_DTYPES} "
                                 "on its stage. Remedy: cast the parallel module to one of those dtypes",
                                 missing=[], unexpected=[])
        return dtypes

    def _lowest_holders(self, names: list[str], holds) -> dict[str, int]:
        """name -> the global rank of the lowest pp rank (with this rank's (dp, tp) coordinates) for which
        `holds(name)` is true, for the names (the same list on every rank) some pp rank holds: an all-reduce of
        -pp rank over the pp group (max = -min)."""
        me, nobody = self._pp_ranks.index(dist.get_rank()), len(self._pp_ranks)
        mine = torch.tensor([-me if holds(f) else -nobody for f in names], dtype=torch.float64)
        lowest = all_reduce_max(mine, self._pp_ranks) if nobody > 1 else mine
        return {f: self._pp_ranks[int(-low)] for f, low in zip(names, lowest.tolist()) if -low < nobody}


_DTYPES = tuple(sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=str))
"""Every dtype torch defines (the same torch on every rank), by code (`PipelineModule._holder_dtypes`): a
buffer of any of them moves (int16 / uint16 / float8 buffers included, `tests/distributed/test_gloo_dtypes.py`)."""


def _code(dtype: torch.dtype) -> int:
    """1 + the index of `dtype` in `_DTYPES`; len(_DTYPES) + 1 for another dtype."""
    return _DTYPES.index(dtype) + 1 if dtype in _DTYPES else len(_DTYPES) + 1


def _structured_loss(loss_fn: LossFn | None, out_spec, no_target: bool, output: tuple, target) -> torch.Tensor:
    """The user's loss on the last stage's output tuple, restored to the model's output structure; with
    loss_fn=None the model's own loss, the first value (all the last stage returns then: `pipeline.step_returns`)."""
    if loss_fn is None:
        return compute_loss(output, None, None)
    structured = unflatten_in_order(list(output), out_spec) if out_spec is not None else output  # `tracer.leaves`
    return compute_loss(structured, None if no_target else target, loss_fn)


def build_pipeline_module(traced: TracedGraph, plan: Plan, model: torch.nn.Module, rank: int) -> PipelineModule:
    """This rank's `PipelineModule` of a pipeline `plan` (`plan.pipeline` set) for `traced`, the model traced on
    ONE microbatch. Collective (creates process groups): call on every rank.

    Raises PipelineError when the plan has no pipeline section; ValueError from `runtime.pipeline.build`."""
    if plan.pipeline is None:
        raise PipelineError("build_pipeline_module: the plan has no pipeline stages (no 'pp' axis). Remedy: "
                            "apply it with ParallelModule / auto_parallelize")
    pipe = plan.pipeline
    cut = plan_cut(traced, pipe.stages)
    run = build(traced, spec_from_plan(plan), cut, model, pp=pipe.pp,
                schedule=pipe.schedule, microbatches=pipe.microbatches,
                loss_fn=functools.partial(_structured_loss, None, traced.exported.call_spec.out_spec, True),
                **build_options(pipe.compression))
    module = PipelineModule(run, traced, plan, rank)
    module.hold_root_settings(model)
    module.__dict__["_retracer"] = Retracer.of(model)  # the evaluation forward traces it (`runtime.pipeline_eval`)
    # parameters held more than once in the pipeline (a tied embedding / lm_head on two stages; every parameter
    # under BitPipe, which keeps two copies of each stage): `runtime.init_check` refuses random initialisers on them
    module.copied = frozenset(
        traced.parameters if pipe.schedule == "bitpipe" else
        (fqn for fqn, info in traced.parameters.items()
         if len({cut.stage_of[u] for u in info.uses if u in cut.stage_of}) > 1))
    if needs_batch_check(traced.graph_module.graph):  # a storage-free copy to trace the own loss at 2x the batch
        module.__dict__["_skeleton"] = module._retracer
    return module


def _refuse_input_gradients(traced: TracedGraph, flat: list[torch.Tensor], target) -> None:
    """PipelineError when an input (or the target) requires grad: torch.distributed.pipelining's schedules
    detach the first stage's inputs and the last stage's target, so a trainable module in front of the
    pipeline (or a teacher producing the target) would silently get no gradient."""
    names = [n for n, t in zip(traced.input_names, flat) if t.requires_grad]
    if isinstance(target, torch.Tensor) and target.requires_grad:
        names.append("target")
    if names:
        raise PipelineError(f"PipelineModule.step: {', '.join(names)} require(s) grad, but a pipeline's schedule "
                            "sends no gradient back to its inputs or target, so what produced them would not be "
                            "trained (its .grad stays None). Remedy: make that module part of the model you "
                            "parallelize, detach the tensor if no gradient is wanted, or plan without 'pp' (a "
                            "ParallelModule returns input gradients)")
