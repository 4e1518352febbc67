"""One walk of a parallel module's tree for the nn.Module-contract checks, made once per step (round 24, issue 14).

What the contract checks read (DESIGN.md rule 10): the submodules (a swapped or added one is refused,
`mirror.refuse_foreign_modules`), their train/eval flags and plain settings (`ParallelModule._modes`), the
parameters' `requires_grad` (the frozen set that keys a program, `ParallelModule._frozen`) and the tensors' dtypes
(`cast_check`). None of these changes announces itself (a flag, `requires_grad_` and a setting are plain
attribute writes), so reading them means walking the tree. Until round 24 every check walked it on its own:
per step and stage `_check_modes` walked it 5 times (`named_modules` for the foreign-module check, twice in
`_modes`, `named_parameters` and `named_buffers` for the casts), `_check_root_settings` walked the whole
PipelineModule to read the root's own settings, and every forward action of a stage walked it again for its
frozen set (`StageModule._returning`), as did the step's gradient bookkeeping (`_take_grads` twice under BitPipe, its
twin exchange per copy). A BitPipe rank holds 4 stage copies, each mirroring the whole model's module tree, so at the
schedules bench's quick size (GPT width 64, 8 blocks) it made about 52 walks per step, which the cost model did not
price (r23d: BitPipe measured 29-34% over its price at that size).

Now a `TreeReading` is made once per stage and step (`read_tree`: one `named_modules()` walk; parameters and
buffers read from the modules it found, in `named_parameters()` / `named_buffers()` order), every check of that step
reads it, and `held` lends it to the stage for the duration of the step, so that forward actions and the gradient
bookkeeping use its frozen set and parameter list instead of walking again. Outside a step (a stage called on
its own) a stage reads its tree afresh on each call, as before. Between steps nothing is cached: the next step
reads again, so a parameter frozen or unfrozen, a `train()` / `eval()`, a changed setting or a swapped module
between two steps is seen by the next step (tests/distributed/test_step.py, the between-steps case).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TreeReading:
    """What one walk of a module tree read (`read_tree`), at the time of the walk.

    Attributes:
        modules: `root.named_modules()` (name, module), duplicates removed, root first.
        parameters: FQN -> parameter, as `root.named_parameters()` gives them (duplicates removed).
        buffers: FQN -> buffer, as `root.named_buffers()` gives them.
        frozen: the FQNs of the parameters whose `requires_grad` was False when read.
    """

    modules: tuple[tuple[str, torch.nn.Module], ...]
    parameters: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]
    frozen: frozenset[str]

    @property
    def flags(self) -> tuple[tuple[str, bool], ...]:
        """(name, training) of every module, as read now (the flags are not part of the snapshot)."""
        return tuple((name, module.training) for name, module in self.modules)


def read_tree(root: torch.nn.Module) -> TreeReading:
    """One `named_modules()` walk of `root` and its parameters and buffers read off the modules found, in the
    order and with the duplicate removal of `named_parameters()` / `named_buffers()` (torch's `_named_members`:
    each module's `_parameters` / `_buffers` entries that are not None and not seen before)."""
    modules = tuple(root.named_modules())
    parameters = _members(modules, "_parameters")
    return TreeReading(modules, parameters, _members(modules, "_buffers"),
                       frozenset(f for f, p in parameters.items() if not p.requires_grad))


def _members(modules: tuple[tuple[str, torch.nn.Module], ...], store: str) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, module in modules:
        for key, tensor in getattr(module, store).items():
            if tensor is None or id(tensor) in seen:
                continue
            seen.add(id(tensor))
            out[f"{name}.{key}" if name else key] = tensor
    return out


@contextlib.contextmanager
def held(stages, readings):
    """Lend each stage its step's reading (`StageModule.reading` returns it) until the block ends."""
    for stage, reading in zip(stages, readings, strict=True):
        stage.__dict__["_held_reading"] = reading
    try:
        yield
    finally:
        for stage in stages:
            stage.__dict__.pop("_held_reading", None)
