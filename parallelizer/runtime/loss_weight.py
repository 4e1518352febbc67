"""How much each microbatch's loss weighs when the model computes its own loss (`step` with `loss_fn=None`).

A pipeline computes the loss of each microbatch j separately and must combine them into the loss one device
computes over the whole batch. For a mean over n_j items (tokens that are not ignore_index, entries of a
mask) that is sum_j loss_j * n_j / N with N = sum_j n_j; a plain mean of the microbatch means is a different
number whenever the n_j differ (labels -100 unevenly spread). The user's `item_count` cannot see inside the
model, so the weight is read from the traced graph of one microbatch: `own_loss_weighting` looks at the op
that makes the model's first output and returns how a microbatch's n_j follows from its OWN inputs:

- cross_entropy / nll_loss with reduction='mean' on class indices: n_j = (target != ignore_index).sum(), with
  the target recomputed from the inputs by the graph's own ops (e.g. transformers' shifted, padded labels);
- `a / b` with `b` made from the inputs alone (a mean over a mask: `(x * mask).sum() / mask.sum()`,
  `/ count_nonzero(mask)`): n_j = b, where a and b are both plain sums (or count_nonzero) over all elements; a
  ratio of means (`(x * mask).mean() / mask.float().mean()`) counts the denominator's sum, when the second trace
  on twice the microbatch shows the two means' element counts in a fixed ratio (a count clamped or offset after
  the sum, `mask.sum().clamp(min=1)`, does not add up over microbatches and raises);
- a sum of such terms that count the same targets (cross-entropy with ignore_index plus a z-loss masked by
  `labels != ignore_index`): weighted by that count, compared structurally (`_items_key`);
- a mean over a whole tensor, or a mean-reduced loss whose denominator is the element count (mse, l1,
  binary cross-entropy, cross-entropy on probabilities) or the sample count (multi-margin, triplet-margin,
  cosine-embedding): every microbatch counts alike, equal weights;
- a sum (reduction='sum', `.sum()`): the batch loss is the sum of the microbatch sums, weight 1 each.

Anything else raises `StepError` naming the op, with the remedy (pass `target=` and `item_count=`, or a
`loss_fn=`), instead of returning another number than one device would. Source of the rule: torch's
`nn.CrossEntropyLoss` docs (reduction='mean' divides by the count of non-ignored targets).
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass

import torch
import torch.fx
from torch.utils import _pytree as pytree

from ..planner.rules.losses import ELEMENTWISE_LOSSES, PER_SAMPLE_LOSSES
from ..tracer.device_free import views_as_reshapes
from ..tracer.graph import TracedGraph
from .step import StepError

aten = torch.ops.aten
_CLASS_LOSSES = {aten.cross_entropy_loss.default, aten.nll_loss.default, aten.nll_loss2d.default,
                 aten.nll_loss_nd.default, aten.nll_loss_forward.default, aten.nll_loss2d_forward.default}
# every elementwise loss with a sharding rule (mse, l1, ..., kl_div, hinge embedding, margin ranking, Poisson NLL):
# "mean" averages over every element of the broadcast inputs, so equal microbatches weigh equally. Read from the
# rules' own list: a hand-kept copy here knew 7 of the 11, and a model returning kl_div / poisson_nll_loss /
# hinge_embedding_loss / margin_ranking_loss as its own loss was refused on every pipeline (round 9 (d)). The
# per-sample losses (multi-margin, multilabel-margin, cosine-embedding, triplet-margin; round 10) average over
# the samples, so equal microbatches weigh equally too.
_ELEMENT_LOSSES = {p.default for p in (*ELEMENTWISE_LOSSES, *PER_SAMPLE_LOSSES)}
_PASS = {aten.to.dtype, aten.to.dtype_layout, aten._to_copy.default, aten.alias.default, aten.clone.default,
         aten.view.default, aten.reshape.default, aten.squeeze.default, aten._unsafe_view.default}
# ops that keep each element once, only rearranged: the targets a count reads through them are the same targets
_SAME_ITEMS = _PASS | {aten.flatten.using_ints, aten.unflatten.int, aten.unsqueeze.default, aten.squeeze.dim,
                       aten.squeeze.dims, aten.permute.default, aten.transpose.int, aten.t.default}
_MEAN, _SUM = 1, 2  # torch's Reduction enum (at::Reduction::Mean / Sum)
_MEANS = {aten.mean.default, aten.mean.dim}
_PLAIN_REDUCTIONS = _MEANS | {aten.sum.default, aten.sum.dim_IntList}
_COUNT_NONZERO = {aten.count_nonzero.default, aten.count_nonzero.dim_IntList}
_FULL_REDUCTIONS = _PLAIN_REDUCTIONS | _COUNT_NONZERO  # over all elements (0-d): `_full_reduction`


@dataclass(frozen=True)
class OwnLossWeighting:
    """How microbatch j's own loss weighs in the batch loss.

    kind: "count" (weight n_j / N, n_j = `program(*microbatch inputs)`), "equal" (1 / m) or "sum" (1).
    program: for "count", a GraphModule from the traced tensor inputs of ONE microbatch (traced order) to a
        0-d count; None otherwise. what: the loss op in words (for messages).
    """

    kind: str
    program: torch.fx.GraphModule | None
    what: str
    counted: tuple | None = None  # for "count": (`_items_key` of the targets, value) when it counts targets != value

    def counts(self, flat: list[torch.Tensor], microbatches: int) -> torch.Tensor:
        """n_j of each microbatch, shape (microbatches,), from the GLOBAL inputs `flat` (traced order, dim 0 =
        microbatches x the traced batch): int64 for counted targets, else the count's dtype; "equal" gives ones,
        "sum" gives ones too (combined by `MicrobatchLoss` as weight n_j / N resp. 1 each, see `batch_target`)."""
        if self.program is None:
            return torch.ones(microbatches, dtype=torch.int64)
        split = [t.tensor_split(microbatches) for t in flat]
        return torch.stack([self.program(*(s[j] for s in split)).detach() for j in range(microbatches)])


def returns_scalar_loss(traced: TracedGraph) -> bool:
    """Whether the model's first output is a 0-d tensor (its own loss, which pipelines weigh by
    `own_loss_weighting`; other outputs get the rehearsal's fallback loss, equal weights)."""
    first = pytree.tree_leaves(traced.graph_module.graph.output_node().args[0])[0]
    meta = traced.node(first.name).outputs[0] if isinstance(first, torch.fx.Node) else None
    return meta is not None and tuple(meta.shape) == ()


def own_loss_weighting(traced: TracedGraph, doubled: TracedGraph | None = None) -> OwnLossWeighting:
    """The weighting of the model's own loss (its first output), read from `traced` (one microbatch's graph)
    and, when given, `doubled` (the same model traced on twice that microbatch: `check_batch_scaling`, which
    finds the terms that are sums divided by the microbatch size).

    Raises StepError (naming the op and the remedy) when the loss is not one of the forms of the module
    docstring, e.g. cross-entropy with class weights or a target made from parameters."""
    graph = traced.graph_module.graph
    per_item = frozenset() if doubled is None else check_batch_scaling(graph, doubled.graph_module.graph, "own")
    return graph_weighting(graph, tuple(traced.input_names), per_item=per_item)


def graph_weighting(graph: torch.fx.Graph, inputs: tuple[str, ...], source: str = "own",
                    per_item: frozenset[int] = frozenset()) -> OwnLossWeighting:
    """The weighting of the first output of `graph` (an ATen graph: a traced model, or `make_fx` of a loss_fn),
    whose count may be computed from the placeholders named `inputs` (the program takes them in that order).
    source: "own" (the model's own loss) or "loss_fn" (a user's loss_fn), for the message. per_item: the
    indices (`_terms` order) of the terms `check_batch_scaling` found divided by the microbatch size.
    Raises StepError as `own_loss_weighting`.

    A sum of loss terms (`mse + 0.1 * kl`: a VAE; `l1 + adversarial BCE`: an SRGAN generator) weighs as its
    terms when they all weigh alike: every term "equal" (means over fixed numbers of items, weight 1/m each:
    the sum of the terms' batch means) or every term "sum"; terms weighted otherwise (a cross-entropy counting
    its tokens plus an auxiliary mean) raise, as before."""
    terms = _terms(graph)
    kinds = [_per_item(_term_weighting(graph, b, inputs, source), source) if i in per_item
             else _term_weighting(graph, b, inputs, source) for i, (_, b) in enumerate(terms)]
    if len(terms) == 1:
        return kinds[0]
    whats = [f"node {b.name} ({b.target})" for _, b in terms]
    what = _top_what(graph)
    if all(k.kind == kinds[0].kind for k in kinds) and kinds[0].kind in ("equal", "sum"):
        return OwnLossWeighting(kinds[0].kind, None, f"{what}, a sum of {len(terms)} loss terms ({', '.join(whats)})")
    if all(k.kind == "count" and k.counted is not None and k.counted == kinds[0].counted for k in kinds):
        # means over the same targets (a label-smoothed cross-entropy as make_fx decomposes it: the nll mean plus
        # the smoothing term's sum over the targets != ignore_index, divided by their count): weighted by it
        return OwnLossWeighting("count", kinds[0].program, f"{what}, a sum of {len(terms)} means over the same "
                                f"targets ({', '.join(whats)})", kinds[0].counted)
    if all(k.kind == "count" for k in kinds):
        _unknown(what, f"a sum of {len(terms)} means over different items (" + ", ".join(
            f"{w}: {_counted_words(k.counted)}" for w, k in zip(whats, kinds)) + "): microbatch j's loss is "
            "A_j / n_j + B_j / k_j, and one weight w_j per microbatch gives the batch's A / n + B / k only when n_j "
            "/ k_j is the same for every microbatch, which the graph does not show (the items may be spread "
            "differently); terms count the same items when their denominators are the same reduction of the same "
            "value (compared structurally)", source)
    _unknown(what, f"a sum of {len(terms)} loss terms weighted differently ("
             + ", ".join(f"{w}: {k.kind}" for w, k in zip(whats, kinds))
             + "): only terms that all weigh equally (means over fixed numbers of items) or all add up (sums) "
             "combine", source)


def _term_weighting(graph: torch.fx.Graph, node: torch.fx.Node, inputs: tuple[str, ...],
                    source: str) -> OwnLossWeighting:
    """The weighting of one loss term whose loss op is `node` (`graph_weighting`)."""
    what = f"node {node.name} ({node.target})"
    target = node.target
    if target in _CLASS_LOSSES:
        args = _normalized(node)
        reduction = args.get("reduction", _MEAN)
        labels = args["target"]
        if reduction == _SUM:
            return OwnLossWeighting("sum", None, what)
        if reduction == _MEAN and labels.meta["val"].dtype.is_floating_point:
            return OwnLossWeighting("equal", None, what)  # probabilities: mean over the rows, equal counts
        if reduction == _MEAN and args.get("weight") is None:
            ignored = args.get("ignore_index", -100)
            program = _program(graph, inputs, labels, lambda g, v: g.call_function(
                aten.sum.default, (g.call_function(aten.ne.Scalar, (v, ignored)),)))
            if program is not None:
                return OwnLossWeighting("count", program, what, (_items_key(_unviewed(labels)), ignored))
        if args.get("weight") is not None:
            _unknown(what, "a cross-entropy with class weights (its mean divides by the sum of the targets' "
                     "weights, not by their count; e.g. item_count=lambda y: weight[y[y != -100]].sum())", source)
        _unknown(what, "a cross-entropy whose target is not made from the inputs alone", source)
    if target in _ELEMENT_LOSSES:
        reduction = _normalized(node).get("reduction", _MEAN)
        if reduction in (_MEAN, _SUM):
            return OwnLossWeighting("equal" if reduction == _MEAN else "sum", None, what)
    if target in (aten.mean.default, aten.mean.dim) and _reduces_all(node):
        return OwnLossWeighting("equal", None, what)
    if target in (aten.sum.default, aten.sum.dim_IntList) and _reduces_all(node):
        return OwnLossWeighting("sum", None, what)
    if target == aten.div.Tensor and isinstance(node.args[1], torch.fx.Node):
        den = _full_reduction(node.args[1])
        count = den.args[0] if den is not None and den.target in _MEANS else node.args[1]
        program = _program(graph, inputs, count, (lambda g, v: g.call_function(aten.sum.default, (v,)))
                           if count is not node.args[1] else (lambda g, v: v))
        if program is not None and not node.args[1].meta["val"].shape:
            if _reduction_size(node.args[0]) is None or den is None:
                _unknown(what, f"a quotient whose numerator ({node.args[0].name}) or denominator "
                         f"({node.args[1].name}) is not a plain sum, count_nonzero or mean over all items (or a loss "
                         "with reduction='sum' as the numerator; e.g. a "
                         "clamped or offset count such as `mask.sum().clamp(min=1)`): it does not add up over "
                         "microbatches")
            return OwnLossWeighting("count", program, what + ", denominator " + node.args[1].name,
                                    _counted_targets(node.args[1]))
    _unknown(what, "an op whose per-microbatch item count the graph does not show", source)


def _unviewed(node):
    """`node` through casts, views and rearrangements that keep every element once (`_SAME_ITEMS`)."""
    while isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in _SAME_ITEMS:
        node = node.args[0]
    return node


def _counted_targets(count: torch.fx.Node) -> tuple | None:
    """What `count` (a denominator) counts, as `OwnLossWeighting.counted`: (key of the target node, value) when it
    is the number of targets != value: `sum(v != c)`, `sum(~(v == c))`, `count_nonzero(v != c)`, `count_nonzero(v)`
    (c = 0) or a mean of such a mask (whose count program sums it); ("sum of", key of x) for another sum or mean of
    x (`mask.sum()`); through casts, views and scaling by a number; None when `count` is no full reduction. The key
    (`_items_key`) is structural, so two terms that count the same targets computed twice (a shift recomputed per
    term) or viewed otherwise (cross_entropy's `labels.flatten()` beside a mask `labels != -100`: round 22's false
    refusal "(count, count)") have equal keys."""
    node = _full_reduction(count)
    if node is None:
        return None
    inner = _unviewed(node.args[0])
    if isinstance(inner, torch.fx.Node) and inner.target in (aten.bitwise_not.default, aten.logical_not.default):
        inner = _unviewed(inner.args[0])
        if not (isinstance(inner, torch.fx.Node) and inner.target == aten.eq.Scalar):
            return None
    elif not (isinstance(inner, torch.fx.Node) and inner.target == aten.ne.Scalar):
        return (_items_key(inner), 0) if node.target in _COUNT_NONZERO else ("sum of", _items_key(inner))
    return (_items_key(_unviewed(inner.args[0])), inner.args[1])


def _counted_words(counted: tuple | None) -> str:
    """`OwnLossWeighting.counted` in words (for messages)."""
    if counted is None:
        return "counts another value"
    if counted[0] == "sum of":
        return f"counts the sum of {counted[1][1] if counted[1][0] != 'call_function' else counted[1][1] + '(...)'}"
    key, value = counted
    return f"counts the entries != {value} of {key[1]}" + ("(...)" if key[0] == "call_function" else "")


def _items_key(node) -> tuple:
    """A structural key of `node`: equal for two nodes that compute the same value by the same ops from the same
    placeholders (names) and constants; used to tell whether two loss terms count the same targets."""
    if not isinstance(node, torch.fx.Node):
        return ("const", repr(node))
    if node.op in ("placeholder", "get_attr"):
        return (node.op, str(node.target))
    args = torch.fx.node.map_aggregate(node.args, lambda a: _items_key(a) if isinstance(a, torch.fx.Node) else a)
    kwargs = torch.fx.node.map_aggregate(dict(node.kwargs), lambda a: _items_key(a) if isinstance(a, torch.fx.Node)
                                         else a)
    return (node.op, str(node.target), repr(args), repr(sorted(kwargs.items())))


def _per_item(weighting: OwnLossWeighting, source: str) -> OwnLossWeighting:
    """A term divided by a number proportional to the microbatch size b (`sum / y.shape[0]`, `/ y.numel()`,
    `kl_div(reduction="batchmean")`). A sum S_j over the items of microbatch j divided by b is a mean over
    per-item sums; with m equal microbatches (a pipeline's: `check_batch`) one device's S / (m b) is
    sum_j (S_j / b) / m, so such a term weighs equally. Any other term so divided (a mean or a count-weighted
    loss divided again by b) has no weighting that gives one device's value: StepError."""
    if weighting.kind != "sum":
        _unknown(weighting.what, "a loss that is not a sum, divided by a number proportional to the microbatch size "
                 "(e.g. `loss.mean() / y.shape[0]`): its microbatch values do not add up to one device's (write the "
                 "mean as reduction='mean' / .mean(), or divide by a fixed number)", source)
    return OwnLossWeighting("equal", None, weighting.what + ", a sum divided by the microbatch size")


def _top_what(graph: torch.fx.Graph) -> str:
    """The loss op `_scale_chain` reaches from `graph`'s first output, in words (for messages)."""
    top = _scale_chain(graph)[1]
    return f"node {top.name} ({top.target})"


def _unknown(what: str, why: str, source: str = "own"):
    """Raise the StepError of a loss whose per-microbatch count is unknown; its `loss` attribute is `what`.
    source: "own" (the model's own loss, loss_fn=None) or "loss_fn" (a user's loss_fn given without item_count)."""
    whose = ("pm.step(loss_fn=None) on a pipeline plan: the model's own loss is" if source == "own" else
             "pm.step(loss_fn=..., target=...) without item_count= on a pipeline plan: your loss_fn's loss is")
    error = StepError(f"{whose} {what}, {why}, so the "
                      "microbatch losses cannot be weighted to give the single-device loss of the batch (a plain "
                      "mean of microbatch means differs when microbatches count different numbers of items). "
                      "Remedy: pass target=<a tensor split like the inputs> and item_count=lambda target_j: <the "
                      "items the loss averages over in that microbatch>, or loss_fn= computing a mean loss from the "
                      "outputs and target=. Either gives one device's loss of the batch only when the loss is a "
                      "mean of per-item terms: a batch-level term (an MoE router's load-balancing loss, a product "
                      "of means over the batch's tokens; in-batch negatives) is computed per microbatch, which is "
                      "what gradient accumulation over the microbatches computes, not one device's value")
    error.loss = what
    raise error


def _by_constant(node: torch.fx.Node) -> bool:
    """A product / quotient by a Python number or by a tensor held by the loss function (a scale that is the same
    for every microbatch, e.g. `torch.amp.GradScaler.scale(loss)`'s scale): does not change the weighting."""
    return (node.target in (aten.mul.Tensor, aten.div.Tensor, aten.mul.Scalar, aten.div.Scalar)
            and isinstance(node.args[0], torch.fx.Node)
            and (isinstance(node.args[1], (int, float)) or _held_tensor(node.args[1]) is not None))


def _held_tensor(node) -> str | None:
    """The name of the tensor constant (a `get_attr` of make_fx's graph: a tensor the traced function holds,
    not computed from its inputs) that `node` is, through casts and views; None for anything else."""
    while isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in _PASS:
        node = node.args[0]
    return node.target if isinstance(node, torch.fx.Node) and node.op == "get_attr" else None


def _factor(node: torch.fx.Node):
    """What scales the loss at `node` (a `_by_constant` node), comparable between two traces of one function."""
    held = _held_tensor(node.args[1])
    return (node.target.__name__, node.args[1] if held is None else f"tensor {held}")


def _full_reduction(node) -> torch.fx.Node | None:
    """The reduction over all elements that `node` is through casts, views and scaling by a Python number, or None:
    a sum or count_nonzero (= sum(x != 0)), which adds up over microbatches, or a mean, a sum divided by its
    input's element count. The "count" weighting of `a / b` needs one of them as both a and b: a quotient of sums
    S_j / C_j weighs by C_j; of means (`(tok * m).mean() / m.float().mean()` = (S_j / A_j) / (C_j / B_j)) by C_j
    too, when B_j / A_j, the ratio of their element counts, does not change with the batch (`check_batch_scaling`
    confirms it on twice the microbatch: `_quotient_sizes`). A count clamped or offset after the sum
    (`mask.sum().clamp(min=1)`) is none: for a microbatch without items it is 1, not 0, so sum_j b_j is not the
    batch's denominator."""
    node = _unscaled(node)
    if (isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in _FULL_REDUCTIONS
            and isinstance(node.args[0], torch.fx.Node) and _reduces_all(node)):
        return node
    return None


def _quotient_sizes(node: torch.fx.Node) -> tuple[int, int] | None:
    """(A, B) of a quotient `node` of two full reductions: the element counts the numerator's and the denominator's
    means divide by (`_reduction_size`: 1 for a sum, count_nonzero or a loss summed), or None for another node."""
    if not (node.op == "call_function" and node.target == aten.div.Tensor and isinstance(node.args[1], torch.fx.Node)):
        return None
    sizes = tuple(_reduction_size(a) for a in node.args)
    return None if None in sizes else sizes


def _reduction_size(node) -> int | None:
    """The element count that `node`, a full reduction (`_full_reduction`), divides its sum by: its input's numel for
    a mean, 1 for a sum or count_nonzero, and 1 for a loss op with reduction='sum' (through casts, views, scaling
    and `out[0]`: `F.cross_entropy(..., reduction="sum") / (labels != -100).sum()`, transformers' form with
    num_items_in_batch); None for anything else."""
    full = _full_reduction(node)
    if full is not None:
        return full.args[0].meta["val"].numel() if full.target in _MEANS else 1
    node = _unscaled(node)
    if isinstance(node, torch.fx.Node) and node.op == "call_function" and _first_of_loss(node):
        node = node.args[0]
    summed = (isinstance(node, torch.fx.Node) and node.op == "call_function"
              and node.target in _CLASS_LOSSES | _ELEMENT_LOSSES and _normalized(node).get("reduction", _MEAN) == _SUM)
    return 1 if summed else None


def _unscaled(node):
    """`node` through casts, views and scaling by a Python number."""
    while isinstance(node, torch.fx.Node) and node.op == "call_function" and (node.target in _PASS or _by_constant(node)):
        node = node.args[0]
    return node


def _normalized(node: torch.fx.Node) -> dict:
    """The op's arguments by schema name (positional and keyword alike)."""
    names = [a.name for a in node.target._schema.arguments]
    return dict(zip(names, node.args)) | dict(node.kwargs)


def _reduces_all(node: torch.fx.Node) -> bool:
    return not node.meta["val"].shape


def _first_of_loss(node: torch.fx.Node) -> bool:
    """`out[0]` of a loss op that returns (loss, total_weight) (nll_loss_forward, as make_fx records it)."""
    return (node.target is operator.getitem and node.args[1] == 0 and isinstance(node.args[0], torch.fx.Node)
            and node.args[0].target in _CLASS_LOSSES)


def _program(source: torch.fx.Graph, inputs: tuple[str, ...], value: torch.fx.Node,
             finish) -> torch.fx.GraphModule | None:
    """A GraphModule: the placeholders `inputs` -> finish(graph, `value` recomputed by its ancestor ops), or
    None when an ancestor is another placeholder (a parameter, buffer, constant or model output: the count
    would not follow from the inputs alone)."""
    needed, stack = set(), [value]
    while stack:
        n = stack.pop()
        if n.name in needed:
            continue
        if n.op not in ("placeholder", "call_function") or (n.op == "placeholder" and n.name not in inputs):
            return None
        needed.add(n.name)
        stack.extend(a for a in n.all_input_nodes)
    graph, env = torch.fx.Graph(), {}
    for name in inputs:
        env[name] = graph.placeholder(name)
    for n in source.nodes:
        if n.op == "call_function" and n.name in needed:
            env[n.name] = graph.node_copy(n, lambda a: env[a.name])
    graph.output(finish(graph, env[value.name]))
    program = torch.fx.GraphModule(torch.nn.Module(), graph)
    if views_as_reshapes(program):  # make_fx of a loss_fn records `flatten` of its contiguous fake target as a
        program.recompile()  # view, which raised on an expanded target (on the ranks that count: the others hung)
    return program


def batch_target(weighting: OwnLossWeighting, flat: list[torch.Tensor], microbatches: int) -> tuple[torch.Tensor, object]:
    """(target, item_count) for `PipelineRun.step` that make `MicrobatchLoss` weigh microbatch j by n_j / N ("count",
    "equal") or by 1 ("sum"): target has dim 0 = the global batch, microbatch j's chunk holds n_j in its first
    entry and zeros elsewhere, so item_count(chunk) = chunk.sum() = n_j and item_count(whole) = N exactly."""
    counts = weighting.counts(flat, microbatches)
    size = flat[0].shape[0] // microbatches
    target = torch.zeros(flat[0].shape[0], dtype=counts.dtype)
    target[::size] = counts
    if weighting.kind == "sum":
        return target, _one
    return target, _chunk_sum


def _chunk_sum(t: torch.Tensor) -> torch.Tensor:
    return t.sum()


def _one(t: torch.Tensor) -> torch.Tensor:
    """For a sum loss: `MicrobatchLoss` divides item_count(chunk) by item_count(batch), so both are 1."""
    return torch.ones((), dtype=torch.int64)


def model_loss_weighting(model: torch.nn.Module, traced: TracedGraph) -> OwnLossWeighting:
    """`own_loss_weighting` of `traced` (one microbatch of `model`) with the second trace on twice the microbatch
    when the loss needs it (`needs_batch_check`, `doubled_trace` of a skeleton of `model`), as `pm.step` weighs it.
    Raises StepError as those do."""
    from .modes import Retracer
    graph = traced.graph_module.graph
    return own_loss_weighting(traced, doubled_trace(Retracer.of(model), traced) if needs_batch_check(graph) else None)


def doubled_trace(retracer, traced: TracedGraph) -> TracedGraph:
    """The model of `retracer` (`runtime.modes.Retracer`: a storage-free skeleton) traced again on twice the
    microbatch of `traced` (inputs of zeros, constants as traced), in its traced mode: what `check_batch_scaling`
    compares a loss with, e.g. to tell `sum / ids.shape[0]` (a per-item mean) from `sum / 4`.
    Raises StepError (`unconfirmed`) when the model could not be copied into a skeleton or does not trace at that
    batch (before, the one-trace weighting was kept: `sum / ids.shape[0]` was weighted as a sum, m times one
    device's loss)."""
    if retracer.skeleton is None:
        unconfirmed(traced.graph_module.graph, retracer.error, "own")
    leaves = []
    for name in traced.call_inputs or traced.input_names:
        if name in traced.constant_inputs:
            leaves.append(traced.constant_inputs[name])
            continue
        meta = traced.node(name).outputs[0]
        shape = tuple(meta.shape)
        leaves.append(torch.zeros((2 * shape[0], *shape[1:]) if shape else (), dtype=meta.dtype))
    args, kwargs = pytree.tree_unflatten(leaves, traced.exported.call_spec.in_spec)
    try:
        return retracer.trace({"": traced.training}, args, kwargs,
                              allow_frozen_host_random=traced.allow_frozen_host_random)
    except Exception as exc:  # noqa: BLE001 - a model that cannot trace at another batch
        unconfirmed(traced.graph_module.graph, f"{type(exc).__name__}: {exc}", "own")


def unconfirmed(graph: torch.fx.Graph, why: str, source: str):
    """Raise the StepError of the loss of `graph` (one microbatch) whose form needs a second trace on twice the
    microbatch (`needs_batch_check`: a scale number could be a per-microbatch normalizer, a plain reduction could
    reduce over the batch dim first) when that trace failed (`why`): one trace cannot tell `sum / 4` from
    `sum / y.shape[0]` at a microbatch of 4."""
    _unknown(_top_what(graph), "a loss with a scale or plain reduction that only a second trace on twice the "
             f"microbatch can confirm adds up over microbatches, and that trace failed ({why[:300]})", source)


def needs_batch_check(graph: torch.fx.Graph) -> bool:
    """Whether the loss of `graph` has a form whose weighting a second trace on twice the batch must confirm
    (`check_batch_scaling`): a constant factor on the way from the output to a loss term, or a plain sum / mean
    as a term's reduction, or a quotient with a mean (`_quotient_sizes`). A single loss op that counts its own
    items (cross-entropy, mse, ...) unscaled, or a quotient of sums, needs none."""
    terms = _terms(graph)
    return len(terms) > 1 or any(bool(numbers) or (base.op == "call_function" and base.target in _PLAIN_REDUCTIONS)
                                 or _quotient_sizes(base) not in (None, (1, 1)) for numbers, base in terms)


def check_batch_scaling(graph: torch.fx.Graph, doubled: torch.fx.Graph, source: str) -> frozenset[int]:
    """The indices (`_terms` order) of the loss terms of `graph` (one microbatch) that `doubled` (the same loss
    traced on twice the batch) shows divided by a number proportional to the microbatch size (`/ y.shape[0]`,
    `/ y.numel()`, `* (1 / len(y))`, `kl_div(reduction="batchmean")`: exactly one scale number that doubles as
    a divisor or halves as a factor; `graph_weighting(per_item=...)` weighs those terms equally when they are
    sums, see `_per_item`).

    Raises StepError (`source` "own" or "loss_fn", for the message) when the microbatch values cannot add up to
    one device's: a scale that changes otherwise with the batch size (`/ y.shape[0] ** 2`; two such numbers),
    or the final reduction's terms do not double with the batch (`x.mean(0).sum()`: a reduction over the batch
    dim first)."""
    terms, terms2 = _terms(graph), _terms(doubled)
    what = _top_what(graph)
    if len(terms) != len(terms2):
        _unknown(what, f"a loss of {len(terms)} terms on this microbatch and {len(terms2)} on twice its batch", source)
    return frozenset(i for i, ((one, base), (two, base2)) in enumerate(zip(terms, terms2))  # every term alike
                     if _check_term_scaling(one, base, two, base2, what, source))


def _check_term_scaling(one, base, two, base2, what: str, source: str) -> bool:
    """`check_batch_scaling` of one loss term: its scale numbers and loss op on one microbatch and on twice it.
    True when the term is divided by a number proportional to the microbatch size, False when its scale is
    fixed; raises StepError otherwise."""
    sizes, sizes2 = _quotient_sizes(base), _quotient_sizes(base2)
    if sizes is not None and sizes2 is not None and sizes[0] * sizes2[1] != sizes2[0] * sizes[1]:
        _unknown(what, f"a quotient of reductions whose means divide by {sizes[0]} and {sizes[1]} elements on this "
                 f"microbatch but by {sizes2[0]} and {sizes2[1]} on twice its batch (e.g. `(x * m).sum() / "
                 "m.float().mean()`: a sum over a mean): the quotient scales with the batch size, so its microbatch "
                 "values weighted by their counts do not give one device's (write both as sums, `(x * m).sum() / "
                 "m.sum()`, or both as means over the same items)", source)
    items, items2 = _reduced_numel(base), _reduced_numel(base2)
    if items is not None and items2 is not None and items2 != 2 * items:
        _unknown(what, f"a reduction over {items} elements on this microbatch and {items2} on twice its batch: its "
                 "terms do not grow with the batch (e.g. `x.mean(0).sum()`, `x.sum(0).mean()`: a mean or sum over the "
                 "batch dim before the final reduction; or a term over parameters alone, e.g. an L2 penalty "
                 "`w.pow(2).sum()`), so the microbatch values do not add up to one device's (pp=2 x tp=2, 8 "
                 "microbatches: `.mean(0).sum()` gave a loss 270 off; write such a loss as a reduction over per-item "
                 "terms, e.g. `.sum(-1).mean()`)", source)
    if one == two:
        return False
    changed = [(a, b) for a, b in zip(one, two) if a != b]
    if len(one) == len(two) and len(changed) == 1 and _proportional_to_batch(*changed[0]):
        return True
    _unknown(what, f"scaled by numbers that change with the microbatch size other than in proportion to it ({one} "
             f"on this microbatch, {two} on twice its batch: e.g. `/ y.shape[0] ** 2`, or two per-microbatch "
             "normalizers), whose microbatch values do not add up to one device's (write the mean as "
             "reduction='mean' / .mean(), or divide by a fixed number)", source)


def _proportional_to_batch(one: tuple, two: tuple) -> bool:
    """Whether a scale number (`_factor`: (op name, number)) on one microbatch and on twice it is a division by a
    number proportional to the batch: a divisor that doubles, or a factor that halves."""
    (op, a), (op2, b) = one, two
    if op != op2 or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v for v in (a, b)):
        return False
    ratio = b / a
    return math.isclose(ratio, 2.0 if op.startswith("div") else 0.5, rel_tol=1e-9)


def _scale_chain(graph: torch.fx.Graph) -> tuple[list, torch.fx.Node]:
    """(the Python numbers skipped as constant factors on the way from the first output, the loss op reached):
    casts, views, scaling by a number and `out[0]` of a (loss, total_weight) op are passed through."""
    first = graph.output_node().args[0]
    return _chain_from(first[0] if isinstance(first, (tuple, list)) else first)


def _terms(graph: torch.fx.Graph) -> list[tuple[list, torch.fx.Node]]:
    """The loss terms of `graph`'s first output: `_scale_chain`, and through `a + b` / `a - b` of two computed
    values (a sum of losses) the terms of each side, each with the numbers that scale it (outer ones first)."""
    numbers, node = _scale_chain(graph)
    return _split(numbers, node)


def _split(numbers: list, node: torch.fx.Node) -> list[tuple[list, torch.fx.Node]]:
    """The terms under `node`, reached with the scale `numbers`: a sum or difference of two 0-d computed values
    splits into the terms of each side (a difference marks its right side's numbers with a sign)."""
    if not (node.op == "call_function" and node.target in (aten.add.Tensor, aten.sub.Tensor)
            and len(node.args) == 2 and all(isinstance(a, torch.fx.Node) for a in node.args)
            and node.kwargs.get("alpha", 1) == 1
            and all(isinstance(a.meta.get("val"), torch.Tensor) and not a.meta["val"].shape for a in node.args)):
        return [(numbers, node)]
    terms = []
    for k, a in enumerate(node.args):
        inner, base = _chain_from(a)
        sign = [("neg", 1)] if k == 1 and node.target == aten.sub.Tensor else []
        terms += _split(numbers + sign + inner, base)
    return terms


def _chain_from(node: torch.fx.Node) -> tuple[list, torch.fx.Node]:
    """The scale chain from `node` (the first output, or a term of a sum): (the numbers passed, the node reached)."""
    numbers = []
    while node.op == "call_function" and (node.target in _PASS or _by_constant(node) or _first_of_loss(node)):
        if _by_constant(node):
            numbers.append(_factor(node))
        node = node.args[0]
    return numbers, node


def _reduced_numel(node: torch.fx.Node) -> int | None:
    """The number of elements the loss op `node` reduces (its first input; for a quotient, its numerator's),
    or None for another op (graph_weighting has already accepted or refused it)."""
    if node.op != "call_function":
        return None
    if node.target == aten.div.Tensor and isinstance(node.args[0], torch.fx.Node):
        node = _unscaled(node.args[0])
    reduces = _CLASS_LOSSES | _ELEMENT_LOSSES | _PLAIN_REDUCTIONS
    if node.op != "call_function" or node.target not in reduces or not isinstance(node.args[0], torch.fx.Node):
        return None
    val = node.args[0].meta.get("val")
    return val.numel() if isinstance(val, torch.Tensor) else None


class ChunkCount:
    """`item_count` for `PipelineRun.step` from a weighting: a microbatch's chunk (dim 0 = `chunk`) counts
    `program(chunk)` ("count") or 1; any other tensor (the whole batch) counts the sum over its `microbatches`
    chunks, so N = sum_j n_j exactly; for "sum" every call counts 1 (weight 1 per microbatch)."""

    def __init__(self, weighting: OwnLossWeighting, microbatches: int, chunk: int) -> None:
        self.weighting, self.microbatches, self.chunk = weighting, microbatches, chunk

    def __call__(self, t: torch.Tensor):
        if self.weighting.kind == "sum":
            return 1
        if t.shape[0] != self.chunk:
            return sum(self(c) for c in t.tensor_split(self.microbatches))
        return self.weighting.program(t).detach() if self.weighting.program is not None else 1
