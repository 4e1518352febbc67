"""What users attach to a model's parameters before wrapping, carried to a ParallelModule's own parameters
(trial r13a: the program never uses the model's tensors, so their hooks and attributes were dropped, silently)."""
from __future__ import annotations

import torch

from ..errors import UnsupportedOpError


def carry_parameter_state(pm: torch.nn.Module, model: torch.nn.Module) -> None:
    """Give `pm`'s parameters (a `ParallelModule`'s, this rank's) what the user attached to the model's
    parameters before wrapping, which stayed on the model's own tensors (never used by the program), silently,
    before (trial r13a):
    - Python attributes (mamba_ssm's `A_log._no_weight_decay = True`, S4's `_optim` lr / weight-decay
      settings, Megatron's `sequence_parallel`), which optimizer set-up code reads from `pm.parameters()`
      to build its param groups: without them every parameter was decayed;
    - gradient hooks (`register_hook`, `register_post_accumulate_grad_hook`: e.g. a mask that freezes
      embedding rows, a gradient scale), in their order: every plan (and one device) trained without them
      (the rows the mask froze moved, a weight scaled by 0.5 got its whole gradient). A replicated
      parameter's hook sees the summed gradient, as on one device (`grad_sync`: hooked parameters are
      reduced before autograd hands them on).

    Raises UnsupportedOpError, on every rank alike (nothing registered then), for a hook on a parameter the
    plan shards (the hook would see this rank's piece: a mask or an index in it would apply to other rows or
    raise), and for any hooked parameter of a model built as pipeline stages (backward runs once per
    microbatch there, so a hook that is not linear, e.g. a clamp, would see microbatch gradients; the whole
    model is checked, as each rank builds only its own stages)."""
    def hooks_of(param):
        return (list((param._backward_hooks or {}).values()),
                list((getattr(param, "_post_accumulate_grad_hooks", None) or {}).values()))

    if not pm._retraces:
        refused = [fqn for fqn, p in model.named_parameters() if any(hooks_of(p))]
        where = "a pipeline stage runs backward once per microbatch, so a hook would see microbatch gradients"
    else:  # by this module's names (the plan's; a tied parameter may be named otherwise in the model)
        refused = [f"{fqn} (stored {pm.spec.params[fqn]})" for fqn, _ in pm.named_parameters()
                   if fqn in pm.spec.params and not pm.spec.params[fqn].is_replicated
                   and any(hooks_of(_original(model, fqn)))]
        where = ("the plan shards it, so a hook would see this rank's piece (a mask or an index in it would apply "
                 "to other rows or raise)")
    if refused:
        raise UnsupportedOpError(
            f"gradient hooks (register_hook / register_post_accumulate_grad_hook) on the model's parameter(s) "
            f"{', '.join(refused)}: {where}. Nothing was wrapped. Remedy: a plan that keeps the parameter whole "
            "(axis_roles={'dp': 'ddp'} without a 'tp' axis or a pipeline), or remove the hook before wrapping "
            "and register one written for this rank's piece on pm's parameter (pm.get_parameter(name))")
    for fqn, local in pm.named_parameters(remove_duplicate=True):
        original = _original(model, fqn)
        for key, value in original.__dict__.items():
            local.__dict__.setdefault(key, value)
        hooks, post = hooks_of(original)
        for hook in hooks:
            local.register_hook(hook)
        for hook in post:
            local.register_post_accumulate_grad_hook(hook)


def _original(model: torch.nn.Module, fqn: str) -> torch.Tensor:
    """The model's parameter `fqn`, or an empty tensor (no hooks, no attributes) when the model has none by that
    name."""
    try:
        return model.get_parameter(fqn)
    except AttributeError:
        return torch.empty(0)
