"""What a `PipelineModule` keeps of nn.Module's contract beside its training step (DESIGN.md rule 10), where a
pipeline cannot do what `ParallelModule` does (trace again): the checks that refuse, with a typed error naming
what changed, the changes its stages would otherwise ignore silently (modes, settings of the stages' mirrors, the
model root's settings, swapped modules, casts), and the model root's tensor attributes routed to the stages.

Mixed into `runtime.pipeline_module.PipelineModule` (before `ModelAttributes`, whose `__getattr__` it extends)."""
from __future__ import annotations

import torch

from ..errors import ModelAttributeError, PipelineError, UnsupportedOpError
from .cast_check import cast_tensors, refuse as refuse_cast
from .mirror import changed_settings, describe, refuse_foreign_modules, settings
from .tree_reading import TreeReading, read_tree


class PipelineContract:
    """The contract checks of a PipelineModule (module docstring); expects `run`, `traced` and `training`."""

    def _check_modes(self, where: str = "PipelineModule.step", flags: bool = True) -> list[TreeReading]:
        """Raise PipelineError when a stage's submodules changed settings (`runtime.mirror`: a Dropout's p, a
        block's scale) or, with `flags` (training: `step`), train/eval mode since the stages were built: their
        training programs cannot be traced again, and before such changes were silently ignored (by `step`; by the
        evaluation forward too, until round 22: it traces the model in the mirrors' modes, not their settings).
        Also UnsupportedOpError / a cast refusal for modules swapped or tensors cast on the stages.
        Returns each stage's walk of its tree (`runtime.tree_reading.read_tree`, one per stage: every check here
        reads it), for the step to lend to its stages (`tree_reading.held`)."""
        added = [name for name, child in self.__dict__.get("_modules", {}).items()
                 if name != "stages" or list(child) != list(self.run.stages)]
        if added:  # `pm.head = nn.Identity()` on a PipelineModule only adds a child that no stage runs
            raise UnsupportedOpError(
                f"{where}: submodule(s) {', '.join(added)} set on the PipelineModule after it was built "
                "(a module swap or a new module): its stages run the programs traced then, so the change would be "
                "ignored. Remedy: change the model before auto_parallelize")
        readings = []
        for stage in self.run.stages:
            reading = read_tree(stage)
            readings.append(reading)
            refuse_foreign_modules(stage, "a pipeline stage", modules=reading.modules)
            # its stage-to-stage buffers have the traced dtypes: a cast pipeline cannot run (`cast_check`)
            refuse_cast(where, cast_tensors(stage.traced, {**reading.parameters, **reading.buffers}))
            now, changes = stage._modes(reading)
            first_flags, _ = stage._first_modes
            moved = [name for (name, t), (_, t0) in zip(now, first_flags) if t != t0] if flags else []
            traced = self.__dict__.get("traced")
            if moved and traced is not None and self.training != traced.training:
                raise PipelineError(f"PipelineModule.step in {'train' if self.training else 'eval'} mode: a "
                                    "pipeline trains with the programs traced in "
                                    f"{'train' if traced.training else 'eval'} mode. Remedy: "
                                    f"pm.{'train' if traced.training else 'eval'}() before pm.step (evaluate "
                                    "with pm.eval() and pm(*inputs) under torch.no_grad(), then switch back)")
            if moved or changes:
                what = (f"submodules switched train/eval: {', '.join(moved[:3])}" if moved else
                        f"settings changed: {describe(changes)}")
                raise PipelineError(f"{where}: {what} after the pipeline was built; its stages run the "
                                    "programs traced then and cannot trace again. Remedy: make the change on the model "
                                    "before auto_parallelize, or use a plan without 'pp' (ParallelModule traces again)")
        return readings

    def hold_root_settings(self, model: torch.nn.Module) -> None:
        """Hold the model root's plain settings (`runtime.mirror.settings`: a Gumbel temperature, a loss weight; names
        the PipelineModule uses itself excepted) as this module's attributes and snapshot them, as
        `ParallelModule._mirror` does: `pm.temperature` reads the value the stages were traced with, and a value
        set later is refused by `_check_root_settings`. Before (round 21, r21b), `pm.temperature = t` set an
        attribute no stage read: every step and evaluation kept the traced value, silently."""
        root = {k: v for k, v in settings(model).items() if k not in vars(self) and not hasattr(type(self), k)}
        self.__dict__.update(root)
        self.__dict__["_root_settings"] = dict(root)

    def _check_root_settings(self, where: str) -> None:
        """PipelineError naming the root settings changed since build (`hold_root_settings`): the stages run the
        programs traced with the old values (torch's schedules hold their buffers) and cannot trace again."""
        # the root's own settings only: no walk of the stages' trees (round 24: it walked them all each step)
        changes = changed_settings(self, {"": self.__dict__.get("_root_settings", {})}, (("", self),))
        if changes:
            raise PipelineError(f"{where}: the model's setting(s) {describe(changes)} changed after the pipeline was "
                                "built (was " + ", ".join(f"{key.removesuffix(' (deleted)')}="
                                                          f"{self._root_settings.get(key.removesuffix(' (deleted)'))!r}"
                                                          for _, key, _ in changes[:3])
                                + "); its stages run the programs traced with the old values and cannot trace "
                                "again, so the new value would be ignored. Remedy: set it on the model before "
                                "auto_parallelize (one pipeline per value), pass the value as an input tensor of "
                                "forward, or use a plan without 'pp' (a ParallelModule traces again with it)")

    def _root_tensors(self) -> dict[str, list[torch.nn.Module]]:
        """Root tensor attributes of the model that are not parameters or buffers (lifted as constants: `mask` in
        `self.mask = torch.ones(4)`) -> the stage modules of this rank holding them."""
        names = [f for f, info in self.traced.parameters.items() if info.is_constant and "." not in f]
        return {f: [st for st in self.run.stages if f in st.traced.parameters] for f in names}

    def __setattr__(self, name: str, value) -> None:
        """A root tensor attribute of the model (`_root_tensors`) is replaced on every stage holding it (each
        stage program reads it as its own buffer), as `pm.mask = t` replaces it on a ParallelModule. Before, it
        set an attribute of the PipelineModule that no stage read, silently."""
        holders = self._root_tensors().get(name) if isinstance(value, torch.Tensor) and "traced" in self.__dict__ \
            and "run" in self.__dict__ else None
        if holders is None:
            super().__setattr__(name, value)
            return
        for stage in holders:
            setattr(stage, name, value)

    def __getattr__(self, name: str):
        """A root tensor attribute of the model (`_root_tensors`): the first stage's copy; a submodule of the model:
        ModelAttributeError naming where it is (`pm.stages[i].<name>`), else as `ModelAttributes`."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name.startswith("_") or "run" not in self.__dict__ or "traced" not in self.__dict__:
                raise
            holders = self._root_tensors().get(name)
            if holders:
                return getattr(holders[0], name)
            if name in dict(self.run.stages[0].named_children()):
                raise ModelAttributeError(
                    f"PipelineModule.{name}: the model's submodule {name!r} is held by each of this rank's stages "
                    f"(pm.stages[i].{name}, a mirror holding that stage's shards), not by the PipelineModule. A "
                    "setting changed there (a dropout's p, a scale) is refused by pm.step, since the stages cannot "
                    "trace again. Remedy: read it as pm.stages[0]." + name + "; change settings on the model before "
                    "auto_parallelize, or use a plan without 'pp' (a ParallelModule traces again)") from None
            raise

    def _refuse_module_hooks(self, where: str) -> None:
        """PipelineError when forward (pre-)hooks or module backward hooks are registered on the PipelineModule
        itself: `step` runs the stages' programs over microbatches and never calls the PipelineModule's forward
        (no single output exists on every rank), so they would not run, while `ParallelModule.step` calls itself
        and runs them (round 22: they were silently skipped). They do run on the evaluation forward. The toolkit's
        own hooks (defined in `parallelizer.*`, e.g. `stale_model`'s check) are not the user's and are left alone."""
        kinds = [kind for kind, hooks in (("forward pre-hook", self._forward_pre_hooks),
                                          ("forward hook", self._forward_hooks),
                                          ("backward hook", self._backward_hooks),
                                          ("backward pre-hook", self._backward_pre_hooks))
                 if any(not getattr(fn, "__module__", "").startswith("parallelizer.") for fn in hooks.values())]
        if kinds:
            raise PipelineError(f"{where}: {', '.join(kinds)}(s) registered on the PipelineModule would not run: a "
                                "pipeline step runs its stages over microbatches and never calls the module's forward "
                                "(they run on its evaluation forward, pm.eval(); pm(...)). Remedy: remove them before "
                                "pm.step (handle.remove()); read the step's loss, or pass a loss_fn, which sees the "
                                "model's outputs of each microbatch; or register the hook on the model's module before "
                                "auto_parallelize (traced into the program), or use a plan without 'pp'")
