"""`ParallelModule`: a rank's sharded program with its local parameter shards, usable like the model.

It keeps nn.Module's contract (DESIGN.md rule 10):
- `parameters()` are the local shards: an optimizer that updates each element on its own (SGD, Adam, AdamW,
  ...) steps on them as on one device; one that reads whole tensors (Adafactor, Muon) or all its tensors
  together (LBFGS) is refused on shards with an OptimizerError (`runtime.optimizer_check`);
- `forward` takes the same inputs as the original model (global tensors: each rank slices what it needs)
  and returns the same structure; an input that requires grad gets one device's gradient;
- `copy.deepcopy(pm)` copies the local shards and shares the trace and programs (`AveragedModel`, EMA);
- `named_parameters()`, `state_dict()` and `named_buffers()` use the model's own names: tied aliases appear
  in `state_dict()` as in the model's, non-persistent buffers (a rotary `inv_freq`) and tensors created in
  forward are not in it; values are this rank's local shards;
- `requires_grad` is honoured: a parameter frozen in the model (or later with `requires_grad_(False)`) gets
  no gradient, no gradient sync and so no optimizer state;
- `train()` / `eval()` select the program: one program per mode, made the first time the mode is used
  (`runtime.modes`: the model is traced again in that mode and the plan's decisions are carried over);
  the programs share the parameter and buffer shards;
- submodules are mirrors of the model's modules (`runtime.mirror`: instances of their classes holding the
  local shards), so code that finds modules by type acts on them; a plain setting changed after build (a
  Dropout's p, or the root model's own: `pm.temperature = t`, held by the ParallelModule) selects a program
  traced with it, as a mode does;
- hooks: forward (pre-)hooks and backward hooks on the ParallelModule itself, tensor hooks on parameters,
  state-dict hooks all work; forward hooks of the model's submodules registered BEFORE tracing are part of
  the traced program; a forward hook registered on a submodule of the ParallelModule cannot run (the program
  is one graph) and raises TraceError at registration saying so;
- `full_model()` yields the model's own modules with full tensors and writes the shards back; `apply(fn)` runs
  `fn` there (initialisers see nn.Linear and whole tensors); `to_empty` keeps the materialised shards;
  `torch.func.functional_call(pm, {fqn: local tensor}, ...)` runs the given tensors; torch.func transforms are
  refused; `torch.nn.init`'s shape-reading / random initialisers on sharded parameters are refused
  (`runtime.init_check`), and so are positional writes into part of a shard or its gradient
  (`runtime.part_writes`) and norms of a shard over a sharded dim (`runtime.piece_norms`);
- `clip_grad_norm_` clips by the global norm over all shards (`runtime.grad_norm`), and so does
  `torch.nn.utils.clip_grad_norm_(pm.parameters(), ...)` (the parameters are registered with their layouts);
- `step(*inputs, target=, loss_fn=)` runs forward, loss and backward and returns the loss (`runtime.step`),
  the same call as a pipeline plan's `PipelineModule.step`.
`full_state_dict()` gathers a state dict that loads into the unparallelised model with strict=True (every
full tensor on every rank: for small models; `parallelizer.checkpoint` saves and exports without that).
"""
from __future__ import annotations

import contextlib
import copy
import warnings

import torch

from ..errors import PlanMismatchError, StateDictError, TraceError, UnsupportedOpError
from ..rewriter.apply import RankProgram, rewrite
from ..rewriter.grad_sync import DEFAULT_BUCKET_BYTES
from ..rewriter.spec import ShardingSpec, mesh_coords
from ..rewriter.state import gather_tensor, init_local_shard, shard_tensor
from ..rewriter.verify import verify
from ..tracer.graph import TracedGraph
from ..tracer.leaves import unflatten_in_order
from ..tracer.node_facts import drawing_ops
from . import shard_origin
from .module_contract import check_equal_across_ranks, check_state_keys, pickling_refused  # noqa: F401 (re-exported)
from .grad_norm import clip_grad_norm_
from .grad_norm import register_module as register_for_clipping
from .init_check import install as check_initialisers, refuse_parametrized_shard
from .members import add_child, add_member, attribute_at, member, owner_of, submodule
from .cast_check import cast_tensors, refuse as refuse_cast
from .model_attrs import ModelAttributes
from .mirror import MODULE_STATE, apply_settings, changed_settings, describe, mirror, refuse_foreign_modules, settings
from .optimizer_check import expect_zero1, install as check_optimizer_steps
from .parameter_state import carry_parameter_state
from .replicas import check_same_generator, check_same_inputs, generator_groups, inputs_unchecked
from .wrappers import install as check_wrappers
from .zero1 import axis_group, runs_zero1
from .modes import ModeProgram, Retracer, _nearest, autocast_exactly, carry_over
from .module_copy import copy_module
from .module_state import ShardedState
from .tree_reading import TreeReading, read_tree
from .precision import autocast
from .step import LossFn, StepError, check_grad_enabled, check_loss_source, compute_loss

MAX_PROGRAMS = 8
"""Programs kept for modes / settings other than the first (each change of a setting traces the model again)."""
_NO_SYNC_WARNED: list[bool] = []  # `ParallelModule.no_sync` warned in this process


class ParallelModule(ShardedState, ModelAttributes, torch.nn.Module):
    """The sharded model of one rank.

    Attributes:
        program: the `RankProgram` of the current mode (its `graph_module.code` shows every collective with
            its ranks); `programs` holds every program made so far, by (modes, frozen parameters).
        traced, spec: the traced graph and sharding decisions the first program was made from.
    Parameters and buffers are registered under their original FQNs (canonical names for tied ones, aliases
    as further names of the same tensor). A `model` on the `meta` device gets each parameter's local shard
    initialised on this rank alone (`rewriter.state.init_local_shard`, seed `init_seed`): the full tensor
    never exists anywhere.
    Gradients of replicated parameters (DDP) are all-reduced in buckets of `grad_bucket_bytes` (default
    25 MiB, as DistributedDataParallel) asynchronously during backward and are complete in `.grad` when
    `backward()` returns; `grad_bucket_bytes=0` all-reduces each one synchronously instead
    (`rewriter.grad_sync`).
    With a mixed-precision recipe (`spec.autocast`, from the plan) the forward runs under it
    (`runtime.precision`: torch.autocast to bf16; parameters and gradients stay fp32).
    Raises PlanMismatchError for a buffer left on `meta` (its values cannot be invented).
    """

    _retraces = True  # whether another train/eval mode may be traced (a pipeline stage: no)
    _no_retrace = ""

    def __init__(self, traced: TracedGraph, spec: ShardingSpec, rank: int, model: torch.nn.Module,
                 init_seed: int = 0, grad_bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> None:
        super().__init__()
        self.traced, self.spec, self.rank = traced, spec, rank
        self.grad_bucket_bytes = grad_bucket_bytes
        self.coords = mesh_coords(spec.mesh, rank)
        self.__dict__["_settings"] = self._mirror(model)
        full = {**dict(model.named_parameters()), **dict(model.named_buffers()), **traced.constant_values()}
        for fqn, info in traced.parameters.items():
            self._register(fqn, self._local(fqn, full[fqn].detach(), init_seed), info.is_buffer,
                           info.persistent, info.requires_grad)
        carry_parameter_state(self, model)
        # the containers start in the modes the model was traced in (the model's own, unless it changed since)
        modules = dict(model.named_modules()) if model.training == traced.training else {}
        for name, module in self.named_modules():
            module.training = modules[name].training if name in modules else traced.training
        # not a submodule (kept out of state_dict and modules()): the skeleton that other modes are traced on
        self.__dict__["_retracer"] = Retracer.of(model) if self._retraces else Retracer(None, None, self._no_retrace)
        self.programs: dict[tuple, ModeProgram] = {}
        self._first_modes = self._modes()
        self._active = self._program_for(self._first_modes, self._frozen(), None, None)
        self.groups = self.program.groups
        register_for_clipping(self)
        check_optimizer_steps()
        if runs_zero1(spec):  # priced with the optimizer state partitioned: say so if the optimizer is not
            expect_zero1(self.parameters(), spec.zero1)  # (`optimizer_check`)
        check_wrappers()
        check_initialisers()
        shard_origin.install_dcp_guard()
        shard_origin.install_plain_load_guard()

    def __deepcopy__(self, memo: dict) -> "ParallelModule":
        """A ParallelModule with its own copies of this rank's parameter and buffer shards (ties kept) and of
        nn.Module's state (hooks, modes), sharing what is read-only: the trace, the plan, the rank programs and
        the process groups. What `torch.optim.swa_utils.AveragedModel(pm)` and EMA / teacher copies do; the copy
        runs the same collectives, so make and call it on every rank alike. Its parameters are registered like
        the original's (global-norm clipping, the optimizer check). Before, deepcopy reached the FakeTensors of
        the kept trace and raised torch's "Cannot access data pointer" RuntimeError."""
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        for key, value in self.__dict__.items():
            new.__dict__[key] = copy.deepcopy(value, memo) if key in MODULE_STATE else value
        register_for_clipping(new)
        return new

    def __reduce_ex__(self, protocol):
        """Refused (UnsupportedOpError, `pickling_refused`): `torch.save(pm, path)` / `pickle.dumps(pm)`. Before,
        pickle's "Can't pickle <class 'torch.nn.modules.linear.Linear'>: it's not the same object" (the mirrors)."""
        raise pickling_refused(type(self).__name__)

    # -- state ---------------------------------------------------------------------------------------
    def _mirror(self, model: torch.nn.Module) -> dict[str, dict[str, object]]:
        """Add a mirror of every submodule of `model` (`runtime.mirror`; a module at two paths is one mirror
        at both, as in the model); returns each one's settings snapshot by name."""
        made: dict[int, torch.nn.Module] = {}
        # the root's own settings (a Gumbel temperature, a loss weight) live on the ParallelModule itself, so that
        # `pm.temperature = t` selects a program traced with it as a submodule's change does; before, it set an
        # attribute nothing read and every step kept the traced value (round 21, r21b). Names the ParallelModule
        # uses itself stay its own (and are not tracked).
        root = {k: v for k, v in settings(model).items() if k not in _OWN_NAMES and not hasattr(type(self), k)}
        self.__dict__.update(root)
        snapshots = {"": dict(root)}
        for name, module in model.named_modules(remove_duplicate=False):
            if not name:
                continue
            parent, _, leaf = name.rpartition(".")
            if id(module) not in made:
                made[id(module)] = mirror(module)
                snapshots[name] = settings(made[id(module)])
            add_child(submodule(self, parent), leaf, made[id(module)])
        return snapshots

    def _register(self, fqn: str, local: torch.Tensor, is_buffer: bool, persistent: bool,
                  requires_grad: bool) -> None:
        """Register `local` under `fqn` and every tied alias of it, with the model's flags."""
        info = self.traced.parameters.get(fqn)
        tensor = local if is_buffer else torch.nn.Parameter(local, requires_grad=requires_grad)
        self.__dict__.setdefault("_local_shapes", {})[fqn] = tuple(local.shape)
        for name in (fqn, *(info.aliases if info is not None else ())):
            add_member(owner_of(self, name), name.rpartition(".")[2], tensor, is_buffer, persistent)

    def _local(self, fqn: str, full: torch.Tensor, seed: int) -> torch.Tensor:
        """This rank's shard: cut from a real tensor, or initialised in place for a parameter on `meta`."""
        layout = self.spec.params[fqn]
        if full.device.type != "meta":
            return shard_tensor(full, layout, self.spec.mesh, self.coords)
        if self.traced.parameters[fqn].is_constant:
            raise PlanMismatchError(
                f"{fqn!r} {tuple(full.shape)}, a tensor created inside forward, was traced on the meta device, so "
                "its values are unknown; build the model on CPU to run it (a plan made on meta still applies: "
                "auto_parallelize(model, inputs, plan=plan))")
        if self.traced.parameters[fqn].is_buffer:
            raise PlanMismatchError(
                f"buffer {fqn!r} {tuple(full.shape)} is on the meta device, so its values are unknown; build the "
                "modules that own buffers on CPU (buffers are small), or load them with load_full_state_dict")
        return init_local_shard(fqn, tuple(full.shape), full.dtype, layout, self.spec.mesh, self.coords, seed=seed)

    def _state(self, program: RankProgram | None = None) -> list[torch.Tensor]:
        """The local tensors of `program`'s leading placeholders (default: the current program's), read as
        attributes, so that tensors swapped in by `torch.func.functional_call(pm, {fqn: tensor}, ...)` (MAML's
        fast weights, a hypernetwork) are the ones the program runs on.

        Raises:
            PlanMismatchError: a swapped-in tensor whose shape is not this rank's local shard's (e.g. a full
                tensor from the unparallelised model), naming it, both shapes and the remedy.
        """
        program = program or self.program
        out = []
        for fqn in program.state_fqns:
            owner, _, name = fqn.rpartition(".")
            try:
                tensor = member(submodule(self, owner), name)
            except AttributeError as exc:
                raise UnsupportedOpError(
                    f"{fqn!r}, which the sharded program reads, is gone from the ParallelModule (a submodule or "
                    f"tensor deleted after wrapping: {exc}). The program runs the model as it was traced. Remedy: "
                    "change the model before auto_parallelize (delete the module, then trace and plan it)") from exc
            local = self._local_shapes.get(fqn)
            if local is not None and isinstance(tensor, torch.Tensor) and tuple(tensor.shape) != local:
                full = tuple(self.traced.parameters[fqn].shape) if fqn in self.traced.parameters else None
                hint = (" (the full tensor's shape: this rank holds a shard of it)"
                        if full is not None and tuple(tensor.shape) == full else "")
                raise PlanMismatchError(
                    f"{fqn!r} was given as a tensor of shape {tuple(tensor.shape)}{hint}, but this rank's program "
                    f"takes its local shard of shape {local}. Remedy: pass tensors shaped like "
                    "pm.named_parameters()'s values (e.g. computed from them), as torch.func.functional_call(pm, "
                    "{name: p - lr * g for (name, p), g in zip(pm.named_parameters(), grads)}, inputs)")
            out.append(tensor)
        return out

    def _registered(self, fqn: str) -> torch.Tensor:
        """The registered local parameter or buffer `fqn`."""
        return member(submodule(self, fqn.rpartition(".")[0]), fqn.rpartition(".")[2])

    # -- programs ------------------------------------------------------------------------------------
    @property
    def program(self) -> RankProgram:
        """The program of the mode last run (at first: the mode the model was traced in)."""
        return self._active.program

    def _modes(self, reading: TreeReading | None = None) -> tuple[tuple[tuple[str, bool], ...], tuple]:
        """(each submodule's (name, training), the settings changed since the mirrors were made
        (`runtime.mirror.changed_settings`)): what selects a program. `reading`: this call's walk of the tree
        (`runtime.tree_reading`), else one made here."""
        reading = reading or read_tree(self)
        return reading.flags, changed_settings(self, self.__dict__.get("_settings", {}), reading.modules)

    def _frozen(self) -> frozenset[str]:
        """The FQNs of the parameters that do not require grad now (a program is made per frozen set)."""
        return read_tree(self).frozen

    def _program_for(self, modes, frozen, args, kwargs) -> ModeProgram:
        """The program for (modes, frozen), made on first use: the first modes reuse the given traced graph
        and spec; other modes are traced again on the call's inputs (`runtime.modes`)."""
        key = (modes, frozen)
        if key in self.programs:
            return self.programs[key]
        same_mode = next((p for (m, _), p in self.programs.items() if m == modes), None)
        if same_mode is not None:
            traced, spec, replicated = same_mode.traced, same_mode.spec, same_mode.replicated
        elif modes == getattr(self, "_first_modes", modes):
            traced, spec, replicated = self.traced, self.spec, ()
        else:
            with autocast_exactly(self.traced.autocast):  # as the planned graph was traced (`modes.autocast_exactly`)
                traced = self._retrace(modes, args, kwargs)
            spec, replicated = carry_over(self.spec, self.traced, traced)
            self._register_new_constants(traced)
            if replicated:
                more = " ..." if len(replicated) > 5 else ""
                warnings.warn(f"ParallelModule: in mode {_describe(modes)}, {len(replicated)} op(s) the plan does not "
                              f"have run replicated: {', '.join(replicated[:5])}{more}", stacklevel=3)
        program = rewrite(traced, spec, self.rank, grad_bucket_bytes=self.grad_bucket_bytes, frozen=frozen)
        verify(program, traced, spec)
        self.programs[key] = ModeProgram(traced, spec, program, replicated)
        for old in [k for k in self.programs if k[0] != self._first_modes and k != key][:-MAX_PROGRAMS]:
            del self.programs[old]  # settings changed often (a dropout schedule): keep the latest few
        return self.programs[key]

    def _retrace(self, modes, args, kwargs) -> TracedGraph:
        """The model traced again in `modes` (`runtime.modes.Retracer`); a TraceError with settings changed
        after build names them."""
        flags, changes = modes
        try:
            return self._retracer.trace(dict(flags), args, kwargs, changes,
                                        allow_frozen_host_random=self.traced.allow_frozen_host_random)
        except TraceError as exc:
            if not changes:
                raise
            # the update_bn recipe only where a change is momentum=None (round 15, r15f: it was given for any change)
            momentum_none = any(key == "momentum" and value is None for _, key, value in changes)
            raise TraceError(
                f"the model with settings changed after the ParallelModule was built ({describe(changes)})",
                exc.location, "set such settings on the model before parallelising it, or set them back"
                + (". torch.optim.swa_utils.update_bn sets BatchNorm momentum=None, whose cumulative average "
                   "reads a buffer's value in Python: instead reset_running_stats() on the BatchNorm modules "
                   "and run the loader in train mode with momentum = 1 / k before the k-th batch"
                   if momentum_none else f" (the error traced with them: {exc.construct})"),
                str(exc)) from exc

    def _register_new_constants(self, traced: TracedGraph) -> None:
        values = traced.constant_values()
        for fqn, info in traced.parameters.items():
            if info.is_constant and fqn not in self.traced.parameters:
                self._register(fqn, values[fqn].detach().clone(), True, False, False)

    def forward(self, *args, **kwargs):
        """Run the program of the current mode on global inputs; returns the model's output structure."""
        if torch._C._are_functorch_transforms_active():
            raise UnsupportedOpError(
                "ParallelModule under a torch.func transform (grad, vmap, jacrev, jvp, ...): its collectives are "
                "autograd.Functions that functorch cannot transform, and its program is made for the traced batch "
                "(vmap's per-sample calls are batches of 1). Remedy: take gradients with torch.autograd.grad or "
                "backward() (torch.func.functional_call(pm, params, inputs) works without a transform around it); "
                "for per-sample gradients, compute them on the unparallelised model")
        reading = read_tree(self)  # one walk for every check of this call (`runtime.tree_reading`)
        refuse_foreign_modules(self, parametrized=lambda name, module: refuse_parametrized_shard(
            name, module, self.spec.params, self.spec.mesh), modules=reading.modules)
        self._active = self._program_for(self._modes(reading), reading.frozen, args, kwargs)
        traced = self._active.traced
        try:
            tensors = traced.tensor_inputs(args, kwargs)  # constants (bool, float, str...) checked, then dropped
        except PlanMismatchError as exc:
            # a mode traced again (eval, changed settings) was traced at its FIRST call's shapes, not the plan's:
            # "traced (and planned) with (3, ...)" misled a user whose plan was made for batch 8 (trial r9c); said
            # only where that mode's shapes differ from the plan's (r15f: it was said of equal shapes too)
            planned = {n: tuple(self.traced.node(n).outputs[0].shape) for n in self.traced.input_names
                       if self.traced.node(n).outputs}
            mode_shapes = {n: tuple(traced.node(n).outputs[0].shape) for n in traced.input_names
                           if n in traced.nodes and traced.node(n).outputs}
            if traced is self.traced or type(exc) is not PlanMismatchError or mode_shapes == planned:
                raise
            raise PlanMismatchError(
                f"{exc} (in mode {_describe(self._modes())} the program was traced at the shapes of that mode's first "
                f"call, not at the plan's {planned}; each mode keeps the shapes of its first call: use one batch shape "
                "per mode)") from None
        if inputs_unchecked(self, count=True):
            check_same_inputs(list(zip(traced.input_names, tensors)), "ParallelModule call")
            draws = drawing_ops(traced.graph_module)
            check_same_generator(draws, generator_groups(self._active.spec, draws), "ParallelModule call",
                                 tensors[0].device if tensors else None)
        try:
            state = self._state()
            with self._autocast(state):
                out = self.program.graph_module(*state, *tensors)
        except RuntimeError as exc:  # a program traced in other dtypes than pm was cast to: typed (`cast_check`)
            refuse_cast("ParallelModule forward", cast_tensors(self.traced, {**reading.parameters,
                                                                             **reading.buffers}), exc)
            raise
        spec = traced.exported.call_spec
        # with the traced call's key order (a ModelOutput's positions, `to_tuple()`): `tracer.leaves`
        return unflatten_in_order(list(out), spec.out_spec) if spec.out_spec is not None else out

    def _autocast(self, state: list[torch.Tensor] | None = None):
        """The mixed-precision context of the plan (`runtime.precision.autocast`; a no-op without one), on the
        device type of the parameters (`state`: the call's `_state()`, read here when not given)."""
        state = self._state() if state is None else state
        return autocast(self.spec.autocast, state[0].device.type if state else "cpu")

    def step(self, *inputs, target=None, loss_fn: LossFn | None = None, item_count=None, **kwargs) -> torch.Tensor:
        """One training step's forward, loss and backward of the global batch (`runtime.step`: the same call
        as `PipelineModule.step`, so one user loop runs every plan).

        Args:
            inputs / kwargs: the model's inputs (global tensors, the same on every rank; traced shapes).
            target: passed to `loss_fn` (global, e.g. labels (B, T)); may be None.
            loss_fn: `loss_fn(output, target) -> scalar` with `output` in the model's output structure; None:
                the model's first output is its loss.
            item_count: accepted as `PipelineModule.step` takes it (`item_count(target) -> n`), so one loop runs
                every plan; the whole batch is one forward here, one loss over all its items, so no microbatch
                weight is needed and it is not called.
        Returns:
            The batch loss (0-d, detached), the same on every rank; the gradients are ADDED to `.grad`.
        Raises:
            StepError: no loss_fn and no scalar first output, a loss that is not 0-d, or item_count without target
                (as on a pipeline plan).
        """
        check_grad_enabled("ParallelModule.step")
        check_loss_source(self._active.traced, loss_fn, "ParallelModule.step", kwargs,
                          ("target",) * (target is not None) + ("item_count",) * (item_count is not None))
        if target is None and item_count is not None:  # what PipelineModule.step refuses: the same loop fails alike
            raise StepError("ParallelModule.step: item_count= was given without target=, so there is nothing to count "
                            "(a pipeline plan refuses it too). Remedy: pass target=<the tensor item_count counts, e.g. "
                            "labels> too, or drop item_count")
        if inputs_unchecked(self, count=False):
            check_same_inputs([("target", target)], "ParallelModule.step")
        loss = compute_loss(self(*inputs, **kwargs), target, loss_fn)
        loss.backward()
        return loss.detach()

    # -- gradients -----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def no_sync(self):
        """DistributedDataParallel's `no_sync()`, for training loops written for DDP: gradient accumulation over
        several backward passes gives the same `.grad` as DDP's (the sum over the passes, every rank alike).
        The gradients are still synchronised in each backward here (one sync per pass, not one per step: more
        communication, the same values), which a warning says once per process. Deferring it would need the
        backward after the block to fold in what was accumulated, which this module does not see."""
        if not _NO_SYNC_WARNED:
            _NO_SYNC_WARNED.append(True)
            warnings.warn("ParallelModule.no_sync(): gradients are still synchronised in every backward (the same "
                          "accumulated values as DDP's no_sync, more communication); pm.step on a pipeline plan "
                          "syncs once per step", stacklevel=3)
        yield

    def process_group(self, axis: str):
        """The torch ProcessGroup of this rank's ranks along mesh axis `axis`, e.g. for ZeRO-1 over the
        data-parallel replicas: `ZeroRedundancyOptimizer(pm.parameters(), optimizer_class=torch.optim.AdamW,
        process_group=pm.process_group("dp"), lr=...)` steps 1/dp of the parameters per rank and broadcasts
        them (`runtime/zero1.py`; a group spanning ranks with other pieces is refused at `step()`).
        Raises ValueError for an axis the mesh lacks or one of a single device."""
        return axis_group(self.groups, self.spec.mesh, axis, "ParallelModule.process_group")

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False,
                        foreach: bool | None = None) -> torch.Tensor:
        """`torch.nn.utils.clip_grad_norm_` over the GLOBAL gradient (collective: call on every rank).

        The norm is that of the full, unsharded gradient, as on one device: each parameter's local gradient
        contributes over the mesh axes that shard its stored layout (sums of |g|^p all-reduced over those
        axes; the max for the inf-norm), replicated copies are counted once. Every rank gets the same total
        norm and scales its local gradients by the same `min(1, max_norm / (total + 1e-6))`.
        Returns the total norm (a scalar tensor in the promotion of the gradients' dtypes, as torch's). See `runtime.grad_norm`.
        """
        layouts = {f: self.spec.params[f] for f in self.traced.parameters}
        return clip_grad_norm_([(p, layouts[f]) for f, p in self.named_parameters()], self.spec.mesh, self.groups,
                               max_norm, norm_type, error_if_nonfinite=error_if_nonfinite, foreach=foreach)

    # -- the whole model -----------------------------------------------------------------------------
    @contextlib.contextmanager
    def full_model(self, writeback: bool = True):
        """The model as one device holds it, for code that reads module types or whole tensors (collective:
        enter and leave on every rank alike).

        Yields a copy of the model's modules, of their own classes (nn.Linear, the model's blocks...), holding
        the FULL parameters and buffers gathered from every rank. On leaving (writeback=True), every rank
        writes its shard of each tensor back into `pm`, mirrors `requires_grad_` and train/eval changes, and
        the copy is dropped. What needs it: re-initialisation (`m.apply(init)`, `nn.init.orthogonal_`,
        `reset_parameters()`: a shard's shape is not the tensor's, so fans, orthogonality and random draws on
        `pm.parameters()` differ from one device's), projections that read a whole tensor (`p.div_(p.norm())`,
        `torch.renorm`) and freezing by module type. `pm.apply(fn)` runs `fn` this way. FSDP's
        `summon_full_params(writeback=True)` is the same idea. Every full tensor exists on every rank: for
        models that fit one device (a model too large for that is initialised from `meta` by its shards,
        `init_seed`).

        Modes and plain settings (a dropout's `p`) changed on the copy are set on `pm`'s submodules (`runtime.
        mirror`), so the next forward runs a program traced with them, as for a change made on `pm` directly.

        Raises (on leaving, before anything is written back):
            UnsupportedOpError (on entering): no skeleton of the model (a pipeline stage, a model that could not
                be deep-copied).
            StateDictError: a tensor was replaced by one of another shape.
            PlanMismatchError: the ranks computed different values (random draws from generators seeded
                differently): seed every rank alike before calling it.
        """
        skeleton = self._retracer.skeleton
        if skeleton is None:
            raise UnsupportedOpError(
                f"ParallelModule.full_model / apply needs the model's skeleton, which this module has not: "
                f"{self._retracer.error or self._no_retrace}. Remedy: initialise or change the model before "
                "auto_parallelize, or write values with load_full_state_dict(full_state_dict)")
        stateful = {f: info for f, info in self.traced.parameters.items() if not info.is_constant}
        locals_ = {f: self._registered(f) for f in stateful}
        memo: dict[int, torch.Tensor] = {}
        for fqn, info in stateful.items():
            full = gather_tensor(locals_[fqn], self.spec.params[fqn], self.spec.mesh, self.groups, tuple(info.shape),
                                 self.coords).clone()
            tensor = full if info.is_buffer else torch.nn.Parameter(full, locals_[fqn].requires_grad)
            memo.setdefault(id(attribute_at(skeleton, fqn)), tensor)
        model = copy_module(skeleton, memo)
        tree = {name: id(module) for name, module in model.named_modules()}
        flags, changes = self._modes()
        apply_settings(model, changes)  # the copy as the mirrors are now: modes and settings changed since build
        flags = dict(flags)
        for name, module in model.named_modules():
            module.training = flags[_nearest(name, flags)]
        yield model
        if not writeback:
            return
        now = {name: id(module) for name, module in model.named_modules()}
        if now != tree:  # a module swapped, added or removed inside (prepare_qat, a new head): writing back the
            changed = sorted(n for n in now.keys() | tree.keys() if now.get(n) != tree.get(n))  # tensors drops it
            raise UnsupportedOpError(
                f"full_model / apply changed the module tree ({', '.join(changed[:4])}"
                f"{' ...' if len(changed) > 4 else ''}: a module swapped, added, removed or parametrized); only "
                "tensor values and settings are written back, so the change would be lost. Nothing was written "
                "back. Remedy: change the model's structure before auto_parallelize")
        values = {}
        for fqn, info in stateful.items():
            value = attribute_at(model, fqn)
            if tuple(value.shape) != tuple(info.shape):
                raise StateDictError(
                    f"full_model / apply replaced {fqn!r} {tuple(info.shape)} by a tensor of shape "
                    f"{tuple(value.shape)}; nothing was written back. Remedy: write the tensor in place, keeping "
                    "its shape (a new shape needs a new trace and plan)", missing=[], unexpected=[])
            values[fqn] = value
        check_equal_across_ranks(values, self.spec.mesh.world_size)
        with torch.no_grad():
            for fqn, value in values.items():
                local = locals_[fqn]
                local.copy_(shard_tensor(value.detach().to(local.dtype), self.spec.params[fqn], self.spec.mesh,
                                         self.coords))
                if isinstance(local, torch.nn.Parameter):
                    local.requires_grad_(value.requires_grad)
        own = dict(self.named_modules())
        for name, module in model.named_modules():  # modes and settings changed inside: the mirrors take them
            if name in own:  # (a changed setting selects a program traced with it at the next forward)
                own[name].training = module.training
                for key, value in settings(module).items():
                    tracked = name or key in self.__dict__["_settings"].get("", {})  # the root: its settings only
                    if tracked and own[name].__dict__.get(key, value) is not value:
                        setattr(own[name], key, value)

    def apply(self, fn):
        """`nn.Module.apply` on the model as one device holds it: `fn` sees the model's own module classes with
        full tensors (`full_model`), and each rank keeps its shards of the result, so `pm.apply(init_weights)`
        initialises as `model.apply(init_weights)` does on one device (the same numbers from the same seed on
        every rank). Collective. Before, `fn` saw the ParallelModule's state-holding containers (no
        nn.Linear among them): an `isinstance(m, nn.Linear)` initialiser did nothing, silently."""
        with self.full_model() as model:
            model.apply(fn)
        return self

    def to_empty(self, *, device, recurse: bool = True):
        """`nn.Module.to_empty` (FSDP2 / torchtitan's meta-device recipe: build on meta, parallelise,
        `to_empty`, initialise). A ParallelModule's shards are already materialised (a model on `meta` is
        initialised shard by shard, `init_seed`), so they keep their values and move to `device`; initialise
        them afterwards with `pm.apply(fn)` or `full_model()`. Before, this replaced them with uninitialised
        memory, which an initialiser that never ran (see `apply`) left in place: NaN outputs."""
        return self.to(device)


_OWN_NAMES = frozenset({"traced", "spec", "rank", "grad_bucket_bytes", "coords", "programs", "groups"})
"""Plain instance attributes of a ParallelModule: a root setting of the model with one of these names is not
carried onto it (`ParallelModule._mirror`)."""


def _describe(modes) -> str:
    flags, changes = modes
    root = dict(flags)[""]
    odd = [name for name, training in flags if name and training != root]
    return ("train" if root else "eval") + (f" (submodules in the other mode: {', '.join(odd[:3])})" if odd else "") \
        + (f" (settings changed: {describe(changes)})" if changes else "")
