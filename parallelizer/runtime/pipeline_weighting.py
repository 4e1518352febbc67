"""How a pipeline step weighs its microbatches' losses, and the checks that warn or refuse where the weights would not
give one device's loss: the model's own loss scaled by a loss_fn (`_weighs_as_own_loss`), a user's item_count
against the count loss_fn's graph shows (`_check_user_count`, `_loss_fn_count`), a summed loss with item_count
(`_refuse_counted_sum`), an in-batch loss_fn (`_warn_loss_fn_mixing`) and outputs the plan did not price
(`_warn_unpriced_outputs`). Mixed into `runtime.pipeline_module.PipelineModule` (split out of
`runtime/pipeline_module.py` in round 24, over 600 lines; no behaviour changed); expects its `run`, `traced`, `_rank`,
`_own_weighting`, `_fn_count`, `_own_use`, `_trusted_warned`, `_checked_counts` and `_checked_mixing`.
"""
from __future__ import annotations

import math
import warnings

import torch

from ..errors import MicrobatchWarning
from ..tracer.graph import TracedGraph
from ..tracer.microbatch_check import loss_fn_mixing
from .loss_fn_weight import loss_fn_weighting, own_loss_use
from .loss_weight import ChunkCount, doubled_trace, own_loss_weighting, returns_scalar_loss
from .pipeline import step_returns
from .step import LossFn, StepError, count_items


class MicrobatchWeighting:
    """The loss-weighting checks of a PipelineModule (module docstring)."""

    def _output_names(self) -> list[str]:
        """The traced graph's output nodes' names, in output order (flattened as the output's structure)."""
        names: list[str] = []
        torch.fx.node.map_arg(self.traced.graph_module.graph.output_node().args, lambda a: names.append(a.name))
        return names

    def _output_metas(self) -> list:
        """The traced metadata (shape, dtype) of each output of `_output_names`, for tracing a loss_fn on them."""
        return [self.traced.node(n).outputs[0] for n in self._output_names()]

    def _weighs_as_own_loss(self, loss_fn: LossFn) -> bool:
        """For `step(loss_fn=..., target=None)`: True when loss_fn's result is the model's own loss scaled by a
        constant (`loss_fn_weight.own_loss_use` "scaled"): it then weighs as that loss (`own_loss_weighting`, set
        on `self._own_weighting`). False when loss_fn does not read the own loss, or the own loss weighs equally
        (a mean over a fixed number of items): equal weights are right. Cached for the last loss_fn.

        Raises:
            StepError: loss_fn reads the own loss otherwise ("mixed"), or cannot be traced, while that loss does
                not weigh equally over microbatches (a count-weighted mean, a sum, or a form `own_loss_weighting`
                refuses): equal weights would give another loss than one device's. The remedy names the ways
                that do.
        """
        if not returns_scalar_loss(self.traced):
            return False
        if self._own_use[0] is not loss_fn:  # the last loss_fn only, as `_fn_count`: a fresh lambda per step
            self._own_use = (loss_fn, own_loss_use(loss_fn, self._output_metas(),  # must not grow a cache
                                                   self.traced.exported.call_spec.out_spec))
        use = self._own_use[1]
        if use == "unread":
            return False
        try:
            if self._own_weighting is None:
                self._own_weighting = own_loss_weighting(self.traced, self._doubled_trace())
            kind, why = self._own_weighting.kind, self._own_weighting.what
        except StepError as exc:
            if use == "scaled":
                raise
            kind, why = None, str(exc)
        if use == "scaled":
            return kind != "equal"
        if kind == "equal":
            return False
        name = getattr(loss_fn, "__name__", repr(loss_fn))
        how = "cannot be traced (make_fx) to see how it uses" if use == "untraced" else "makes more than a constant " \
            "multiple of"
        raise StepError(f"PipelineModule.step: loss_fn {name!r} without target= {how} the model's own loss (its first "
                        f"output), and that loss does not weigh equally over the {self.run.microbatches} microbatches "
                        f"({why}): weighing the microbatches equally would give another loss than one device's. "
                        "Remedy: loss_fn=None (the own loss, weighed by its item counts), a loss_fn that returns "
                        "the own loss times a constant (e.g. lambda out, _: out / accum), or target= with "
                        "item_count= counting what each microbatch's loss averages over")

    def _warn_unpriced_outputs(self) -> None:
        """Once: a `loss_fn` given for a model that returns its own loss first. The plan priced the last stage
        returning that loss alone (`pipeline.step_returns`); a loss_fn may read every output, so the last stage's
        ranks now gather them all whole each microbatch, which the plan's memory does not hold."""
        if self.__dict__.get("_outputs_warned"):
            return
        self.__dict__["_outputs_warned"] = True
        names = self._output_names()
        if len(names) < 2 or step_returns(self.traced) == tuple(names):
            return
        extra = sum(math.prod(t.shape) * t.dtype.itemsize
                    for n in names[1:] for t in self.traced.node(n).outputs[:1])
        warnings.warn(f"PipelineModule.step: loss_fn given for a model whose first output is its own loss, so the last "
                      f"stage's ranks gather its other {len(names) - 1} output(s) whole for loss_fn, {extra:,} bytes "
                      "per microbatch that the plan did not count (it prices the model's own loss alone, what "
                      "loss_fn=None reads). Remedy: pass loss_fn=None to train on the model's own loss, or trace the "
                      "model without its labels so that its plan prices the outputs loss_fn reads", stacklevel=3)

    def _warn_loss_fn_mixing(self, loss_fn: LossFn, fn, target: torch.Tensor, count) -> None:
        """Once per (loss_fn, target dtype and shape), on rank 0: warn `MicrobatchWarning` when loss_fn on random
        outputs of the global batch differs from its microbatch losses weighted as `run.step` weighs them
        (`tracer.microbatch_check.loss_fn_mixing`: an in-batch loss). Runs loss_fn 1 + microbatches more times,
        on those random values (keep Python side effects out of loss_fn, as for its traces)."""
        key = (loss_fn, target.dtype, tuple(target.shape))
        if self._rank != 0 or key in self._checked_mixing:
            return
        self._checked_mixing.add(key)
        m = self.run.microbatches
        batch = self.traced.node(self.traced.input_names[0]).outputs[0].shape[0]
        metas = self._output_metas()
        major = [bool(meta.shape) and meta.shape[0] == batch for meta in metas]
        gen = torch.Generator().manual_seed(0)
        outputs = [(torch.randn((m * meta.shape[0], *meta.shape[1:]) if big else tuple(meta.shape), generator=gen)
                    .to(meta.dtype) if meta.dtype.is_floating_point else
                    torch.zeros((m * meta.shape[0], *meta.shape[1:]) if big else tuple(meta.shape), dtype=meta.dtype))
                   for meta, big in zip(metas, major)]
        total = float(count(target)) if count is not None else None
        found = loss_fn_mixing(fn, outputs, major, target,
                               (lambda t: float(count(t)) / total) if total else (lambda t: 1.0 / m), m)
        if found is not None:
            warnings.warn(MicrobatchWarning(f"PipelineModule.step: {found}", "loss_fn"), stacklevel=3)

    def _doubled_trace(self) -> TracedGraph | None:
        """`loss_weight.doubled_trace` of the skeleton kept when the own loss needs it (`needs_batch_check`),
        or None when not needed."""
        skeleton = self.__dict__.get("_skeleton")
        return None if skeleton is None else doubled_trace(skeleton, self.traced)

    def _warn_trusted_count(self) -> None:
        """Once: the model's own loss weighted by the user's item_count although its graph shows no per-microbatch
        count (`own_loss_weighting` raises). That is right for a mean of per-item terms; a batch-level term (an
        MoE load-balancing loss: a product of means over the tokens) then takes its per-microbatch values, as
        gradient accumulation does, and the step's loss and gradients differ from one device's (Mixtral with
        output_router_logits on pp=2 x dp=2: loss 4.904533 vs 4.904525, gradients 234x the fp32 bound).
        Raises StepError when the graph shows a sum (`_refuse_counted_sum`)."""
        if self._trusted_warned:
            return
        try:
            weighting = self._own_weighting or own_loss_weighting(self.traced, self._doubled_trace())
        except StepError as e:
            self._trusted_warned = True
            what = f" ({e.loss})" if hasattr(e, "loss") else ""
            warnings.warn(f"PipelineModule.step: weighting the model's own loss{what} by your item_count. The "
                          "batch loss equals one device's only if that loss is a mean of per-item terms; a "
                          "batch-level term (e.g. an MoE router's load-balancing aux loss) is computed per microbatch "
                          "(gradient accumulation's value, not one device's). Remedy for an exact match: a mesh "
                          "without 'pp', or a loss without such a term", stacklevel=3)
            return
        _refuse_counted_sum(weighting, "the model's own loss")
        self._trusted_warned = True

    def _check_user_count(self, loss_fn: LossFn, target: torch.Tensor, item_count) -> None:
        """Once per (loss_fn, item_count): warn when the user's item_count weighs the microbatches otherwise than
        the count loss_fn's own graph shows (e.g. counting every label != -100 for a loss over the shifted
        labels y[:, 1:]: GPT-2 on pp=2 x tp=2, loss 2.8e-3 and gradients off with no word). Nothing when the
        graph shows no count (item_count is then the remedy) or loss_fn cannot be traced; StepError when it shows a
        sum (`_refuse_counted_sum`)."""
        key = (loss_fn, item_count)
        if key in self._checked_counts:
            return
        self._checked_counts.add(key)
        try:
            graph_count = self._loss_fn_count(loss_fn, target)
        except StepError:
            return
        if not isinstance(graph_count, ChunkCount):
            return
        self._checked_counts.discard(key)  # refused: checked again on the next call
        _refuse_counted_sum(graph_count.weighting, "your loss_fn's loss")
        self._checked_counts.add(key)
        chunks = target.tensor_split(self.run.microbatches)
        mine = torch.tensor([float(item_count(c)) for c in chunks], dtype=torch.float64)
        graph = torch.tensor([float(graph_count(c)) for c in chunks], dtype=torch.float64)
        if mine.sum() > 0 and graph.sum() > 0 and not torch.allclose(mine / mine.sum(), graph / graph.sum(),
                                                                     rtol=1e-9, atol=1e-12):
            warnings.warn(f"PipelineModule.step: item_count gives microbatch counts {mine.long().tolist()}, but "
                          f"loss_fn's graph averages over {graph.long().tolist()} items "
                          f"({graph_count.weighting.what}), so the batch loss and gradients will not be one device's. "
                          "Remedy: drop item_count= (the count is then read from loss_fn's graph), or count what "
                          "loss_fn averages over (e.g. labels[:, 1:] != -100 for a shifted loss)", stacklevel=3)

    def _loss_fn_count(self, loss_fn: LossFn, target: torch.Tensor):
        """The item count of `loss_fn` read from its graph (`loss_fn_weight.loss_fn_weighting`, on meta tensors of
        one microbatch's outputs; cached for the last loss_fn and target shape), or `count_items` when
        make_fx cannot trace it. Raises StepError when the graph shows no per-microbatch count."""
        chunk = target.shape[0] // self.run.microbatches
        key = (loss_fn, target.dtype, tuple(target.shape))
        if self._fn_count[0] != key:
            metas = self._output_metas()
            weighting = loss_fn_weighting(loss_fn, metas, self.traced.exported.call_spec.out_spec, target[:chunk])
            if weighting is None:  # not silent: count_items is right only for a plain mean over the labels
                warnings.warn(f"PipelineModule.step: could not trace loss_fn {getattr(loss_fn, '__name__', loss_fn)!r} "
                              "(make_fx) to read what its mean averages over, so each microbatch is weighted by "
                              "count_items(target_j) (labels != -100 for integer targets, elements for float ones). "
                              "That gives one device's loss only for an unweighted mean over those items. Remedy: "
                              "pass item_count=lambda target_j: <the items loss_fn averages over>", stacklevel=3)
            self._fn_count = (key, count_items if weighting is None else
                              ChunkCount(weighting, self.run.microbatches, chunk))
        return self._fn_count[1]


def _refuse_counted_sum(weighting, whose: str) -> None:
    """StepError for `item_count=` given with a loss whose graph is a sum (reduction='sum', `.sum()`): a pipeline
    adds the microbatch sums (weight 1 each), while item_count weighs each by its share n_j / N of the items, which
    is never one device's sum (round 16, r16e: a reduction='sum' cross-entropy on pp=2, 4 microbatches with -100
    labels spread unevenly: 34.13 for one device's 86.24, with no word)."""
    if weighting.kind == "sum":
        raise StepError(f"PipelineModule.step: item_count= was given, but {whose} is a sum ({weighting.what}): a "
                        "pipeline adds the microbatches' sums to give one device's, and weighting each by its share of "
                        "the items (what item_count is for: means) would not. Remedy: drop item_count= (and target= "
                        "if only item_count reads it)")
