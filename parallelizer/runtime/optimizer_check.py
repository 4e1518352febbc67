"""Optimizers over local shards: refuse a step whose update of a shard is not the shard of the full update.

`ParallelModule.parameters()` are this rank's local shards, and a pipeline rank holds only its stages'
parameters, so a torch optimizer built on them steps each rank's pieces alone. That is one device's step
exactly when the optimizer updates every element from that element's own parameter, gradient and state
(SGD, Adam, AdamW, RMSprop, ...). Two other kinds silently give other numbers:
- **per-tensor** optimizers read the whole tensor: Adafactor's factored second moments and parameter RMS,
  Muon's Newton-Schulz orthogonalisation, LAMB's trust ratio, a row or column normalisation (Scion's RowNorm /
  ColNorm), or a norm taken of some ranks only (biases, conv weights). On a shard (tp, fsdp) they compute those from
  the shard. Measured, 2 steps of a 2-layer MLP on tp=2 / fsdp dp=2: parameters 3.6e-3 (Adafactor) and
  6.9e-3 (Muon) off one device; exact under ddp, where every rank holds whole tensors.
- **coupled** optimizers read all their tensors together: LBFGS's flat search direction and line search.
  They differ whenever the model's parameters are split over ranks at all (shards or pipeline stages):
  1.7e-3 off under fsdp; exact under ddp.
- **partitioned** optimizers communicate: torch's ZeroRedundancyOptimizer steps a partition of the parameters
  on each rank of its process group and broadcasts every parameter from its owner, overwriting the other ranks'
  different shards (MLP, 2 AdamW steps on tp=2 / fsdp dp=2 with the whole world as the group: parameters
  0.33-0.51 off); exact under ddp, and over a group of replicas that hold the same pieces (ZeRO-1 over 'dp' of
  a dp x tp plan or of a pipeline stage: `pm.process_group("dp")`, `runtime/zero1.py`), where the optimizer
  class it wraps is then classified as any other.

`install()` (called by every ParallelModule and PipelineModule) adds a global step pre-hook to torch.optim
(`register_optimizer_step_pre_hook`). Before each `step()` of an optimizer holding
parameters registered by those modules (`grad_norm.register`), it classifies the optimizer's class, with each
param group's own hyperparameters (a group may override the defaults: an option that switches a layer-wise
adaptation on for one group), by RUNNING it once (`kind_of`, cached; a verified rule, not a list of names; the
one exception is ZeroRedundancyOptimizer, which needs a process group and is recognised by class), and raises
`OptimizerError` on every rank alike (no collective is involved, so no rank waits on another) when the kind
cannot give one device's step for the parameters it holds. A class that cannot be run on the probe tensors
(a constructor needing other arguments) is warned about once, naming it, and stepped.
"""
from __future__ import annotations

import inspect
import warnings
import weakref

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils.weak import WeakIdKeyDictionary

from ..core.layout import Shard
from ..errors import OptimizerError
from . import shard_origin
from .grad_norm import owner_of
from .zero1 import overwritten

ELEMENT, TENSOR, COUPLED, PARTITIONED = "per-element", "per-tensor", "coupled", "partitioned"
_KINDS: dict[tuple[type, str], str | None] = {}  # (optimizer class, repr of its defaults) -> kind (None: unknown)
_WARNED: set[type] = set()
_HANDLE = None
# a parameter of a model handed to auto_parallelize -> (its FQN, weak reference to the parallel module)
_WRAPPED = WeakIdKeyDictionary()
# a local parameter of such a module -> weak reference to the model's parameter of the same FQN
_SOURCE_OF = WeakIdKeyDictionary()
_STAMPED = WeakIdKeyDictionary()  # optimizers whose state_dict records their parameters' pieces (`shard_origin`)
_ZERO1 = WeakIdKeyDictionary()  # a local parameter of a plan priced with ZeRO-1 -> its axis (`expect_zero1`)
# optimizers warned about once, and the partition optimizers inside ZeroRedundancyOptimizers (never warned)
_ZERO1_WARNED: "weakref.WeakSet[torch.optim.Optimizer]" = weakref.WeakSet()


def expect_zero1(params, axis: str) -> None:
    """Record that `params` (local parameters of a plan with `PlanConfig.zero1`) were priced with their optimizer
    state partitioned over mesh axis `axis`: a step of an optimizer holding them that is not torch's
    ZeroRedundancyOptimizer warns once (`_check_zero1`)."""
    for p in params:
        _ZERO1[p] = axis


def _check_zero1(optimizer: torch.optim.Optimizer) -> None:
    """Warn (once per optimizer) when an optimizer that keeps all its state on every rank steps parameters whose
    plan priced that state partitioned (ZeRO-1): the ranks then hold N times the planned optimizer memory."""
    if _partitions(optimizer):  # its own optimizer of the partition steps next: that step is ZeRO-1's
        if getattr(optimizer, "optim", None) is not None:
            _ZERO1_WARNED.add(optimizer.optim)
        return
    if optimizer in _ZERO1_WARNED:
        return
    axes = sorted({_ZERO1[p] for g in optimizer.param_groups for p in g["params"] if p in _ZERO1})
    if axes:
        _ZERO1_WARNED.add(optimizer)
        warnings.warn(f"{type(optimizer).__name__} keeps all its state on every rank, but the plan priced the "
                      f"optimizer state partitioned over {axes[0]!r} (ZeRO-1, plan config zero1): each rank holds "
                      "more memory than planned. Remedy: ZeroRedundancyOptimizer(pm.parameters(), optimizer_class="
                      f"{type(optimizer).__name__}, process_group=pm.process_group({axes[0]!r}), ...) "
                      "(parallelizer/runtime/zero1.py), or plan without zero1", stacklevel=4)


def remember_wrapped(model: torch.nn.Module, module: torch.nn.Module) -> None:
    """Record that `module` (a ParallelModule or PipelineModule) was built from `model`: `module` trains its own
    tensors (local shards or stage copies) and never reads `model`'s again, so an optimizer over `model`'s
    parameters, or a backward through `model`, trains nothing that `module` computes with (`_check_wrapped`)."""
    ref = weakref.ref(module)
    own = dict(model.named_parameters())
    for fqn, p in own.items():
        if p.device.type != "meta":
            _WRAPPED[p] = (fqn, ref)
    for name, local in module.named_parameters():
        fqn = name.split(".", 2)[2] if name.startswith("stages.") else name
        if fqn in own and own[fqn].device.type != "meta":
            _SOURCE_OF[local] = weakref.ref(own[fqn])


def install() -> None:
    """Add the step pre-hook to torch.optim once per process (idempotent)."""
    global _HANDLE
    if _HANDLE is None:
        _HANDLE = register_optimizer_step_pre_hook(_check_step)


def kind_of(cls: type, defaults: dict) -> str | None:
    """How optimizer class `cls` with hyperparameters `defaults` updates, found by running it (cached), on one
    float32 probe tensor of each rank a model's parameters have (`PROBE_SHAPES`: a bias, a Linear, a Conv1d, a
    Conv2d and a Conv3d weight), each on its own:
    ELEMENT when, for EVERY dim, 3 steps of the tensor in one optimizer equal those of its two halves along that
    dim each in its own optimizer (a shard of any dim of any rank is then stepped as one device steps it); else
    TENSOR when the two halves along its last dim in one optimizer step as each in its own; else COUPLED; the
    broadest kind over the ranks. Loss 0.5 * sum(c * (w - t)^2) with scales c of 1..100 rising along the
    flattened tensor (so the statistics of a half along any dim differ from the tensor's); closures as LBFGS
    needs (the others call them once). Compared with torch.testing's float32 tolerances (rtol 1.3e-6, atol
    1e-5). A rank the optimizer refuses (Muon takes matrices only) or does not move is left out; None when every
    rank is (`cls(params, **defaults)` raises, or nothing moves: then nothing is known). The probe computes the
    gradients before each step (and passes the closure too), so an optimizer that ignores the closure is
    classified by what it does with them.

    Before round 26 (r26b) one (4, 6) tensor was split along its columns only, so an optimizer whose statistic
    runs over dim 0 (a column normalisation, Scion's ColNorm), or that reads whole tensors only at other ranks
    (a bias update normalised by its norm, a conv weight's), was ELEMENT and stepped fsdp / tp shards silently
    (MLP, 2 steps: parameters 0.2 / 0.05 off one device)."""
    key = (cls, repr(sorted(defaults.items(), key=lambda kv: kv[0])))
    if key not in _KINDS:
        try:
            _KINDS[key] = _probe(cls, defaults)
        except Exception:  # noqa: BLE001 - any failure of a user's optimizer on the probe means "unknown"
            _KINDS[key] = None
    return _KINDS[key]


def _probe(cls: type, defaults: dict) -> str:
    """The broader of the kinds on the quadratic probe and on a linear loss, which has no minimum: an optimizer
    that converges on the quadratic within its 3 steps (LBFGS with its defaults, 20 iterations per step)
    reaches the same minimum whatever it couples, so only a loss it cannot converge on shows how it updates
    (before, LBFGS() was classified per-element and stepped fsdp / tp shards: the ranks' local stopping tests
    disagreed and the run hung; LBFGS(max_iter=50, history_size=5) was per-tensor, allowed on pipeline stages)."""
    defaults = _constructor_arguments(cls, defaults)
    order = (ELEMENT, TENSOR, COUPLED)
    kind = _classify(cls, defaults, linear=False)
    if kind != COUPLED:
        kind = max(kind, _classify(cls, defaults, linear=True), key=order.index)
    return kind


# one probe tensor per rank a model's parameters have: a bias, a Linear, a Conv1d, a Conv2d and a Conv3d weight (every
# dim of at least 2 elements, so it splits in two halves)
PROBE_SHAPES = ((6,), (4, 6), (4, 2, 6), (2, 4, 2, 2), (2, 2, 2, 2, 3))


def _classify(cls: type, defaults: dict, linear: bool) -> str:
    """The broadest kind (`kind_of`) over the probe ranks the optimizer takes and moves; ValueError when none."""
    order = (ELEMENT, TENSOR, COUPLED)
    g = torch.Generator().manual_seed(0)
    kinds = []
    for shape in PROBE_SHAPES:
        probe = (torch.randn(shape, generator=g), torch.randn(shape, generator=g),
                 torch.logspace(0, 2, torch.Size(shape).numel()).view(shape))
        try:
            kinds.append(_classify_rank(cls, defaults, linear, *probe))
        except Exception:  # noqa: BLE001 - a rank this optimizer refuses or leaves unmoved says nothing of the others
            continue
    if not kinds:
        raise ValueError("no probe tensor moved: its update is unknown")  # kind_of: None (warned, stepped)
    return max(kinds, key=order.index)


def _classify_rank(cls: type, defaults: dict, linear: bool, w: torch.Tensor, t: torch.Tensor,
                   scale: torch.Tensor) -> str:
    """The kind on one probe tensor `w` (target `t`, scales `scale`): ELEMENT, TENSOR or COUPLED (`kind_of`)."""
    def term(p, tt, c):  # the loss of one tensor: 0.5 c (w - t)^2, or c w (linear: a constant gradient c)
        return (c * p).sum() if linear else (0.5 * c * (p - tt) ** 2).sum()

    def run(groups):  # groups: [[(w, t, c), ...] per optimizer] -> the final tensors, in order
        params = [[torch.nn.Parameter(x.clone()) for x, _, _ in group] for group in groups]
        opts = [cls(ps, **defaults) for ps in params]
        for _ in range(3):
            for opt, ps, group in zip(opts, params, groups):
                def closure(opt=opt, ps=ps, group=group):
                    opt.zero_grad()
                    loss = sum(term(p, tt, c) for p, (_, tt, c) in zip(ps, group))
                    loss.backward()
                    return loss
                # the gradients first, as a training loop's backward does: an optimizer whose step ignores
                # the closure (most hand-written ones: `def step(self, closure=None)` reading p.grad) then
                # updates too (before, it saw no gradient, moved nothing and passed as per-element)
                with torch.enable_grad():
                    closure()
                opt.step(closure)
        return [p.detach() for ps in params for p in ps]

    def halves(d):  # the (w, t, c) of each half of the probe along dim d
        return [tuple(x.chunk(2, dim=d)[i] for x in (w, t, scale)) for i in range(2)]

    whole = run([[(w, t, scale)]])[0]
    if torch.equal(whole, w):
        raise ValueError("the probe did not move: its update is unknown")
    if all(_close(whole, torch.cat(run([[h] for h in halves(d)]), dim=d)) for d in range(w.ndim)):
        return ELEMENT
    left, right = halves(w.ndim - 1)
    if all(_close(a, b) for a, b in zip(run([[left, right]]), run([[left], [right]]))):
        return TENSOR
    return COUPLED


def _constructor_arguments(cls: type, defaults: dict) -> dict:
    """The entries of `defaults` that `cls.__init__` takes (AdamW's defaults hold `decoupled_weight_decay`,
    which its constructor does not take; every one when it takes **kwargs)."""
    parameters = inspect.signature(cls.__init__).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return dict(defaults)
    return {k: v for k, v in defaults.items() if k in parameters}


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(torch.isfinite(a).all()) and torch.allclose(a, b, rtol=1.3e-6, atol=1e-5)


def _check_step(optimizer: torch.optim.Optimizer, args, kwargs) -> None:
    """The step pre-hook (module docstring): each param group holding registered parameters is classified
    with its own hyperparameters (a group may override the defaults). Raises OptimizerError; StateDictError for
    a loaded state of other pieces than this rank holds (`runtime.shard_origin`), before anything is stepped."""
    _check_wrapped(optimizer)
    _check_zero1(optimizer)
    if optimizer not in _STAMPED and any(owner_of(p) is not None for g in optimizer.param_groups for p in g["params"]):
        # from the first step on (no state exists before it), its state_dict records each parameter's piece
        _STAMPED[optimizer] = optimizer.register_state_dict_post_hook(
            lambda opt, sd: shard_origin.stamp_optimizer(opt, sd, owner_of))
    shard_origin.check_optimizer(optimizer, owner_of)
    if _partitions(optimizer) and getattr(optimizer, "optim", None) is not None:
        # ZeroRedundancyOptimizer.load_state_dict copies its groups' loaded records into its partition optimizer's
        # groups (`_sync_param_groups`), whose parameters are a subset: checked above on the whole groups
        for group in optimizer.optim.param_groups:
            group.pop(shard_origin.KEY, None)
    for group in optimizer.param_groups:
        # a frozen parameter is never stepped (no gradient): it neither refuses nor is named (before, a frozen
        # tp-sharded embedding was the parameter a user's LARS was refused for)
        owned = [o for p in group["params"] if p.requires_grad and (o := owner_of(p)) is not None]
        sharded = [o for o in owned if _is_sharded(o.layout, o.mesh)]
        staged = [o for o in owned if o.pipeline is not None]
        if sharded or staged:
            _check_group(optimizer, group, sharded, staged)


def refuse_wrapped_originals(params, call: str, optimizer: str) -> None:
    """Raise OptimizerError when `params` include parameters of a model given to auto_parallelize
    (`remember_wrapped`) and none of those has a gradient: `call` (an optimizer's step, torch's
    `clip_grad_norm_`) would act on tensors the parallel module never computes with (its backward fills its own
    parameters' gradients). `optimizer`: the name recorded in the error."""
    wrapped = [p for p in params if p in _WRAPPED and owner_of(p) is None]
    if wrapped and all(p.grad is None for p in wrapped):
        fqn, ref = _WRAPPED[wrapped[0]]
        kind = type(ref()).__name__ if ref() is not None else "parallel module"
        raise OptimizerError(
            f"{call} over the parameters of the model given to auto_parallelize (e.g. {fqn!r}), none of which has "
            f"a gradient: the {kind} trains its own tensors (this rank's shards), never the model's, so this call "
            "would change nothing it computes with. Remedy: pass pm.parameters() (`torch.optim.AdamW(pm."
            "parameters())` built after wrapping, `torch.nn.utils.clip_grad_norm_(pm.parameters(), ...)` or "
            "`pm.clip_grad_norm_(...)`), and read the trained weights with pm.full_state_dict() or "
            "parallelizer.checkpoint, not model.state_dict()",
            optimizer, "wrapped model", fqn)


def _check_wrapped(optimizer: torch.optim.Optimizer) -> None:
    """Refuse a step that would train nothing the parallel module computes with (`remember_wrapped`): an
    optimizer over the ORIGINAL model's parameters (built from `model.parameters()` after wrapping: none of
    them has a gradient, since `pm`'s backward fills `pm`'s own), or over `pm`'s parameters when none has a
    gradient while the model's have (the backward ran through `model(...)`, not `pm(...)`). Before, both
    stepped nothing and `pm` never trained, silently (ConvAE on dp=2: the loss stayed at its first value).
    An optimizer stepping a model that was trained eagerly after wrapping (its own gradients) is left alone."""
    held = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
    refuse_wrapped_originals(held, f"{type(optimizer).__name__}.step()", type(optimizer).__name__)
    local = [p for p in held if owner_of(p) is not None]
    if local and all(p.grad is None for p in local):
        sources = [s for p in local if p in _SOURCE_OF and (s := _SOURCE_OF[p]()) is not None]
        if any(s.grad is not None for s in sources):
            fqn = owner_of(local[0]).fqn
            raise OptimizerError(
                f"{type(optimizer).__name__}.step() over a parallel module's parameters (e.g. {fqn!r}), none of "
                "which has a gradient, while the model given to auto_parallelize has gradients: the backward ran "
                "through the original model (`model(...)`), which the parallel module does not read. Remedy: "
                "run the forward through the module auto_parallelize returned (`pm(...)` or `pm.step(...)`)",
                type(optimizer).__name__, "wrapped model", fqn)


def _check_group(optimizer: torch.optim.Optimizer, group: dict, sharded: list, staged: list) -> None:
    cls = type(optimizer)
    first = (sharded or staged)[0]
    where = (f"parameter {first.fqn!r} is stored as {first.layout} on mesh {first.mesh}" if sharded else
             f"parameter {first.fqn!r} is held by one pipeline stage (each rank steps its stages' parameters alone)")
    if _partitions(optimizer):
        ranks = torch.distributed.get_process_group_ranks(optimizer.process_group)
        bad = overwritten(ranks, torch.distributed.get_rank(), sharded + staged)
        if bad is not None:
            where = (f"parameter {bad.fqn!r} is stored as {bad.layout} on mesh {bad.mesh}, so the group's ranks hold "
                     "different pieces of it (a ZeroRedundancyOptimizer group may only span mesh axes over which "
                     "every parameter is replicated; over an 'fsdp' axis the optimizer state is already sharded "
                     "with the parameters: use a plain optimizer there)" if bad.pipeline is None
                     else f"parameter {bad.fqn!r} is held by other ranks' pipeline stages than some of the group's")
            raise OptimizerError(
                f"{cls.__name__}.step() on this rank's pieces of a parallelized model: it steps a partition of the "
                f"parameters on each rank of its process group (ranks {ranks}) and broadcasts each updated "
                "parameter from its owner to all of them, overwriting their different shards or stages; "
                f"{where}. Remedy: ZeRO-1 over the data-parallel replicas only: "
                "ZeroRedundancyOptimizer(pm.parameters(), optimizer_class=..., process_group=pm.process_group('dp')) "
                "(`runtime/zero1.py`), or ZeRO-style sharding planned by the toolkit (axis_roles={'dp': 'fsdp'}) "
                "with a plain torch.optim optimizer", cls.__name__, PARTITIONED, bad.fqn)
        # over replicas each rank steps whole local pieces with the optimizer class it wraps: classify that one
        cls = optimizer._optim_constructor
    # a scheduler's changing lr never changes the kind (and lr = 0 in a warm-up would hide every kind)
    options = {**optimizer.defaults, **{k: group[k] for k in optimizer.defaults if k in group and k != "lr"}}
    kind = kind_of(cls, options)
    if kind is None:
        if cls not in _WARNED:
            _WARNED.add(cls)
            warnings.warn(f"{cls.__name__} could not be run on the toolkit's probe tensors (or moved none of "
                          "them), so whether it updates "
                          "each element on its own is unknown. On sharded parameters (tp, fsdp) an optimizer that "
                          "reads whole tensors (factored moments, norms, orthogonalisation) or all its tensors "
                          "together gives other numbers than one device; elementwise ones (SGD, Adam, AdamW) are "
                          "exact", stacklevel=4)
        return
    if kind == ELEMENT or (kind == TENSOR and not sharded):
        return
    reads = ("each tensor as a whole (e.g. factored moments, norms, orthogonalisation)" if kind == TENSOR else
             "all its tensors together (e.g. one flat search direction and line search)")
    overridden = sorted(k for k in options if repr(options[k]) != repr(optimizer.defaults.get(k)))
    raise OptimizerError(
        f"{cls.__name__}.step() on this rank's pieces of a parallelized model: it updates {reads}, so on them it "
        f"computes other numbers than on one device; {where}"
        + (f" (in a param group that overrides {', '.join(overridden)})" if overridden else "")
        + ". Remedy: an elementwise optimizer (torch.optim.AdamW, Adam, SGD, RMSprop, ...), or a plan that keeps "
        "whole tensors on every rank for the parameters it steps: data parallel without sharding "
        "(axis_roles={'dp': 'ddp'})" + (", without pipeline stages" if kind == COUPLED else
                                          " (pipeline stages are fine)"),
        cls.__name__, kind, first.fqn)


def _partitions(optimizer: torch.optim.Optimizer) -> bool:
    """Whether `optimizer` is torch's ZeroRedundancyOptimizer (ZeRO-1: each rank steps a partition of the
    parameters and broadcasts them; torch.distributed.optim docs), which no probe on one process can run."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    return isinstance(optimizer, ZeroRedundancyOptimizer)


def _is_sharded(layout, mesh) -> bool:
    return any(isinstance(p, Shard) and size > 1
               for p, size in zip(layout.placements, mesh.shape))
