"""`torch.nn.init` on local shards: refuse initialisers whose result on a shard is not the shard of the result.

`ParallelModule.parameters()` are this rank's local shards. An initialiser that reads the tensor's shape
(xavier / kaiming fans, `orthogonal_`, `eye_`, `dirac_`, `sparse_`) or draws random numbers (`uniform_`,
`normal_`, `trunc_normal_`) computes on the shard: other fans and bounds, a shard that is orthogonal on its
own, and, with every rank seeded alike as it must be, the same draws on every shard (fsdp dp=2: the two halves
of each weight equal). Measured on a 2-layer MLP: outputs 4.5 (fsdp) and 9.2 (tp=2) off one device after
`nn.init.orthogonal_` on `pm.parameters()`, silently. `constant_`, `zeros_` and `ones_` fill every element alike
and are exact; on replicated parameters (ddp) every initialiser is exact, except on a parameter a pipeline holds
more than once (a tied embedding / lm_head on two stages, every parameter under BitPipe): each copy draws its own
random values there (GPT-2 on pp=2: wte and its lm_head copy apart, the pipeline's loss 0.022 off the eager loss of
its own full_state_dict(), silently), so the random initialisers are refused on such copies too. torch.Tensor's
in-place random fills (`TENSOR_FILLS`: `p.data.normal_()`, a view's `uniform_()`) of such a parameter's memory are
refused alike (round 26), and so are constant fills (`CONSTANT_WRITES`) of a part of a shard chosen along a
sharded dim (`weight.data[padding_idx].zero_()`); so are index assignment (`w.data[i] = 0`), `copy_` into a
part and the indexed in-place writes (`index_fill_`, `scatter_`, ...) there, into the shard or its gradient
(round 27: `runtime.part_writes`), and norms of a shard over a sharded dim (`runtime.piece_norms`, installed here
too); a value made from the shard's shape and copied in (`p.copy_(torch.randn(p.shape))`) cannot be told from loading
the shard.

The same holds for a parametrization registered on a submodule of `pm` after wrapping
(`torch.nn.utils.parametrize.register_parametrization`, and through it `parametrizations.weight_norm`,
`spectral_norm`, `orthogonal`): the program reads the parametrized weight through the module, so it is computed
from this rank's shard (weight_norm on a row-parallel weight of tp=2: per-row norms of half rows, outputs 4.3e-3 off
one device after 3 SGD steps, silently); on replicated parameters (ddp) it is exact. It is refused on sharded
parameters and on parameters of a pipeline module (its stage programs hold their parameters).

`install()` (called by every ParallelModule) replaces those functions in `torch.nn.init` (and the `TENSOR_FILLS`
methods of torch.Tensor) once, by wrappers that
raise `UnsupportedOpError` for a parameter registered by a ParallelModule (`grad_norm.owner_of`) whose stored
layout shards it over a mesh axis of size > 1, naming the parameter, its layout and the remedy
(`pm.apply(fn)` / `with pm.full_model() as model:`, which run on the full tensors), and call torch's own function
otherwise. Module methods that call them through the module (`nn.Linear.reset_parameters` calls
`init.kaiming_uniform_`) are covered; a name imported from torch.nn.init before the first ParallelModule was
built is torch's own function, as for `clip_grad_norm_` (`runtime.grad_norm`).
"""
from __future__ import annotations

import functools

import torch

from ..core.layout import Shard
from ..errors import UnsupportedOpError
from .grad_norm import owner_of, owner_of_memory
from .part_writes import in_local_writes, install as _install_part_writes, partial_along_sharded, refuse_part
from .piece_norms import install as _install_norm_check

SHAPE_OR_RANDOM = ("uniform_", "normal_", "trunc_normal_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_",
                   "kaiming_normal_", "orthogonal_", "sparse_", "eye_", "dirac_")
"""The torch.nn.init functions whose result on a shard is not the shard of their result on the full tensor."""
RANDOM = tuple(n for n in SHAPE_OR_RANDOM if n not in ("eye_", "dirac_"))
"""Those that draw random numbers: on each copy of a parameter a pipeline holds twice they draw other values."""


def install() -> None:
    """Wrap the SHAPE_OR_RANDOM functions of torch.nn.init and parametrize.register_parametrization (once per
    process)."""
    for name in SHAPE_OR_RANDOM:
        original = getattr(torch.nn.init, name, None)
        if original is None or getattr(original, "_parallelizer_checked", False):
            continue
        setattr(torch.nn.init, name, _checked(name, original))
    _install_vector_check()
    _install_quantization_check()
    _install_fill_check()
    _install_part_writes()
    _install_norm_check()
    register = torch.nn.utils.parametrize.register_parametrization
    if not getattr(register, "_parallelizer_checked", False):
        torch.nn.utils.parametrize.register_parametrization = _checked_parametrization(register)


def _sharded_axes(owner) -> list[str]:
    """The mesh axes (size > 1) over which a registered parameter's stored layout shards it."""
    return [axis for axis, size, p in zip(owner.mesh.axis_names, owner.mesh.shape, owner.layout)
            if isinstance(p, Shard) and size > 1]


def _checked_parametrization(original):
    @functools.wraps(original)
    def register_parametrization(module, tensor_name, parametrization, *args, **kwargs):
        tensor = getattr(module, tensor_name, None)
        owner = owner_of(tensor) if isinstance(tensor, torch.Tensor) else None
        if owner is not None and (_sharded_axes(owner) or owner.pipeline is not None):
            where = (f"a local shard (stored sharded over mesh axis {', '.join(_sharded_axes(owner))})"
                     if _sharded_axes(owner) else "a parameter of a pipeline module's stage")
            raise UnsupportedOpError(
                f"torch.nn.utils.parametrize.register_parametrization({type(parametrization).__name__}) on "
                f"{owner.fqn!r} after wrapping, {where}: the parametrization would compute on that piece (a norm, "
                "an orthogonalisation or any function of the whole tensor differs from one device's). Remedy: "
                "register it on the model before auto_parallelize (the parametrized weight is then traced into the "
                "program and sharded with it)")
        return original(module, tensor_name, parametrization, *args, **kwargs)

    register_parametrization._parallelizer_checked = True
    return register_parametrization


def _checked(name: str, original):
    @functools.wraps(original)
    def init(tensor, *args, **kwargs):
        owner = owner_of(tensor) if isinstance(tensor, torch.Tensor) else None
        if owner is not None:
            refuse_on_pieces(f"torch.nn.init.{name}", owner, name in RANDOM,
                             "`with pm.full_model() as model: torch.nn.init." + name + "(model.<name>)`")
        return original(tensor, *args, **kwargs)

    init._parallelizer_checked = True
    return init


def refuse_on_pieces(call: str, owner, draws: bool, full_call: str) -> None:
    """Raise UnsupportedOpError when `call` (an initialiser: `draws` when it draws random numbers) on the local
    parameter of `owner` (`grad_norm.Owner`) would not give that piece of one device's result: the parameter is
    stored sharded, or it draws on one of the copies a pipeline holds of a parameter. `full_call`: the call on
    the full model, for the remedy."""
    axes = _sharded_axes(owner)
    if axes:
        raise UnsupportedOpError(
            f"{call} on {owner.fqn!r}, a local shard (stored sharded over mesh axis "
            f"{', '.join(axes)}): its shape is not the parameter's, so fans, orthogonality and random draws "
            "(the same on every rank seeded alike) would differ from one device's. Remedy: initialise the "
            "model before auto_parallelize (or load values with pm.load_full_state_dict), or run the "
            f"initialiser on full tensors: pm.apply(init_fn), or {full_call}")
    pm = owner.pipeline() if owner.pipeline is not None else None
    if draws and pm is not None and owner.fqn in getattr(pm, "copied", ()):
        raise UnsupportedOpError(
            f"{call} on {owner.fqn!r}, one of the copies a pipeline holds of it (a parameter "
            "tied across stages, or a stage that BitPipe keeps twice): each copy would draw its own random "
            "values (on its rank, in its rank's order), so the copies, one parameter of the model, would "
            "differ for the rest of training. Remedy: initialise the model before auto_parallelize, or "
            "load values with pm.load_full_state_dict(state_dict) (one full tensor for every copy)")


TENSOR_FILLS = ("normal_", "uniform_", "bernoulli_", "exponential_", "cauchy_", "log_normal_", "geometric_", "random_")
"""torch.Tensor's in-place random fills (HF's `_init_weights`: `module.weight.data.normal_(0, std)`): on a local
shard they draw the shard's numbers from the rank's generator, the same on every rank seeded alike, not the shard
of one device's draw (round 26, r26b: MLP on fsdp dp=2 / tp=2, `p.data.normal_(0, 0.02)` over pm.parameters():
0.072-0.080 off one device, `uniform_(-0.1, 0.1)` 0.20, silently; torch.nn.init was refused already)."""


CONSTANT_WRITES = ("zero_", "fill_")
"""torch.Tensor's in-place constant fills. Of a whole shard they are exact; of PART of one (HF's
`weight.data[padding_idx].zero_()`, fairseq's `nn.init.constant_(weight[padding_idx], 0)`, Embedding's own
`_fill_padding_idx_with_zero`) they pick elements by LOCAL indices, which along a sharded dim are other elements
than one device's (round 26, r26b: row 1 of a (12, 8) weight stored S(0) on fsdp dp=2 / tp=2: 0.274 off one device,
silently). Refused when the part does not keep every sharded dim whole (`part_writes.partial_along_sharded`;
the other positional writes, index assignment among them, are `runtime.part_writes`')."""


def _checked_fill(name: str, original):
    @functools.wraps(original)
    def fill(self, *args, **kwargs):
        # a constant fill is positional only through a view (`p.data[i]`, `w[i]`): `p.grad.zero_()` and other whole
        # tensors skip the scan of the registered parameters (an optimizer's zero_grad(set_to_none=False) calls it
        # once per parameter)
        held = owner_of_memory(self) if name in TENSOR_FILLS else \
            owner_of_memory(self, grads=True) if self._base is not None and not in_local_writes() else None
        if held is not None:
            param, owner = held
            if name in TENSOR_FILLS:
                refuse_on_pieces(f"Tensor.{name}", owner, True,
                                 f"`with pm.full_model() as model: model.<name>.data.{name}(...)`")
            elif partial_along_sharded(self, param, owner):
                raise refuse_part(f"Tensor.{name}", owner, f"model.<name>.data[...].{name}(...)", param)
        return original(self, *args, **kwargs)

    fill._parallelizer_checked = True
    return fill


def _install_fill_check() -> None:
    """Wrap the TENSOR_FILLS and CONSTANT_WRITES methods of torch.Tensor (once): a fill of (a view of, or `.data`
    of) a registered parameter's memory is checked (random fills as the torch.nn.init functions are, constant
    fills of a part, of the parameter or of its gradient, by `part_writes.partial_along_sharded`; not inside
    `part_writes.local_writes()`); every other tensor is filled by torch's own method after one look-up
    (`grad_norm.owner_of_memory`; none before the first ParallelModule)."""
    for name in TENSOR_FILLS + CONSTANT_WRITES:
        original = getattr(torch.Tensor, name)
        if not getattr(original, "_parallelizer_checked", False):
            setattr(torch.Tensor, name, _checked_fill(name, original))


def _checked_vector_to_parameters(original):
    @functools.wraps(original)
    def vector_to_parameters(vec, parameters):
        parameters = list(parameters)
        sharded = [(owner, p) for p in parameters if (owner := owner_of(p)) is not None and _sharded_axes(owner)]
        held = sum(p.numel() for p in parameters)
        if sharded and isinstance(vec, torch.Tensor) and vec.numel() != held:
            owner = sharded[0][0]
            raise UnsupportedOpError(
                f"torch.nn.utils.vector_to_parameters of a vector of {vec.numel()} elements into parameters of a "
                f"ParallelModule that hold {held} on this rank ({owner.fqn!r} is a local shard, stored sharded over "
                f"mesh axis {', '.join(_sharded_axes(owner))}): torch fills them in order without checking the "
                "length, so a vector of the whole model's parameters would put other elements in every shard "
                "(0.1 off one device, silently, before). Remedy: a vector of pm's own parameters "
                "(parameters_to_vector(pm.parameters())) round-trips; for the whole model's values use "
                "pm.load_full_state_dict(state_dict) or `with pm.full_model() as model: "
                "vector_to_parameters(vec, model.parameters())`")
        return original(vec, parameters)

    vector_to_parameters._parallelizer_checked = True
    return vector_to_parameters


def refuse_parametrized_shard(prefix: str, module: torch.nn.Module, params: dict, mesh) -> None:
    """Raise UnsupportedOpError when `module` (the parametrized submodule `prefix` of a ParallelModule) is
    parametrized (torch.nn.utils.parametrize) on a parameter whose layout in `params` (FQN -> Layout) shards it
    over an axis of `mesh` of size > 1: the guard at forward (`mirror.refuse_foreign_modules` calls it) for a
    `register_parametrization` imported before the first ParallelModule existed (the wrapper of `install`
    never saw it; module docstring)."""
    for name in module.parametrizations:
        fqn = f"{prefix}.{name}" if prefix else name
        layout = params.get(fqn)
        axes = [axis for axis, size, p in zip(mesh.axis_names, mesh.shape, layout or ())
                if isinstance(p, Shard) and size > 1]
        if axes:
            raise UnsupportedOpError(
                f"a parametrization registered on {fqn!r} after wrapping, a local shard (stored sharded over mesh "
                f"axis {', '.join(axes)}): it computes on that piece (a norm, an orthogonalisation or any function "
                "of the whole tensor differs from one device's). Remedy: remove it "
                "(torch.nn.utils.parametrize.remove_parametrizations) and register it on the model before "
                "auto_parallelize")


def _install_vector_check() -> None:
    """Wrap torch.nn.utils.vector_to_parameters (once). Also done when this module is imported (with
    `import parallelizer`), so that a script's `from torch.nn.utils import vector_to_parameters` written after
    `import parallelizer` binds the checked function; one bound before is not checked."""
    import torch.nn.utils.convert_parameters as convert
    if not getattr(convert.vector_to_parameters, "_parallelizer_checked", False):
        checked = _checked_vector_to_parameters(convert.vector_to_parameters)
        convert.vector_to_parameters = torch.nn.utils.vector_to_parameters = checked


_install_vector_check()


def _install_quantization_check() -> None:
    """Wrap torch.ao.quantization.quantize.propagate_qconfig_ (once), which prepare, prepare_qat, quantize and
    quantize_dynamic all call through that module's global (however the user imported them): on a module tree
    holding ParallelModule mirrors it raises UnsupportedOpError. torch matches module classes exactly, so on a
    ParallelModule nothing was swapped: quantize_dynamic(pm) returned a float copy (1.5e-2 off the quantised model
    on one device, silently, on ddp, fsdp and tp=2)."""
    import sys

    import torch.ao.quantization  # noqa: F401 - loads the quantize module
    quantize = sys.modules["torch.ao.quantization.quantize"]
    original = quantize.propagate_qconfig_
    if getattr(original, "_parallelizer_checked", False):
        return

    @functools.wraps(original)
    def propagate_qconfig_(module, *args, **kwargs):
        from .mirror import _StateOnly
        mirrored = next((name for name, m in module.named_modules() if isinstance(m, _StateOnly)), None)
        if mirrored is not None:
            raise UnsupportedOpError(
                f"torch.ao.quantization (prepare / prepare_qat / quantize_dynamic: propagate_qconfig_) on a module "
                f"holding a ParallelModule's submodules ({mirrored!r}): torch swaps modules by exact class and pm's "
                "submodules are mirrors of the model's, so nothing would be quantised or fake-quantised and the "
                "program would run the float model. Remedy: prepare_qat / quantize_dynamic the model before "
                "auto_parallelize (the fake quantisation is then traced), or quantise the single-device model "
                "from pm.full_state_dict()")
        return original(module, *args, **kwargs)

    propagate_qconfig_._parallelizer_checked = True
    quantize.propagate_qconfig_ = propagate_qconfig_


_install_quantization_check()
