"""`runtime.loss_weight`: the weights read from a model's own loss op make the weighted microbatch losses equal
the single-device loss of the whole batch (labels -100 unevenly spread), and an unknown loss op raises."""
import pytest
import torch
import torch.nn.functional as F

from parallelizer.runtime.loss_weight import (batch_target, check_batch_scaling, needs_batch_check,
                                              own_loss_weighting)
from parallelizer.runtime.step import StepError
from parallelizer.tracer.trace import trace

V, B, T, M = 11, 4, 6, 2


class Own(torch.nn.Module):
    """A model that computes its own loss in one of several ways (`kind`)."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.emb, self.head = torch.nn.Embedding(V, 8), torch.nn.Linear(8, V)

    def forward(self, ids, labels):
        logits = self.head(self.emb(ids))
        if self.kind == "shifted":  # transformers' causal-LM loss: pad with -100, shift left
            shifted = F.pad(labels, (0, 1), value=-100)[:, 1:]
            return F.cross_entropy(logits.flatten(0, 1), shifted.flatten())
        if self.kind == "nll":
            return F.nll_loss(logits.log_softmax(-1).flatten(0, 1), labels.flatten(), ignore_index=-100) * 2.0
        if self.kind == "mask":
            mask = (labels != -100).float()
            return (logits.pow(2).mean(-1) * mask).sum() / mask.sum()
        if self.kind in ("clamped", "offset"):  # a guarded masked mean: the count does not add up over microbatches
            mask = (labels != -100).float()
            count = mask.sum().clamp(min=1) if self.kind == "clamped" else mask.sum() + 1.0
            return (logits.pow(2).mean(-1) * mask).sum() / count
        if self.kind == "sum":
            return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum")
        if self.kind == "mean":
            return logits.pow(2).mean()
        if self.kind == "aux":  # cross-entropy + an MoE-style load-balancing term: a product of batch means
            probs = logits.softmax(-1).flatten(0, 1)
            return F.cross_entropy(logits.flatten(0, 1), labels.flatten()) + 0.1 * (probs.mean(0) * probs.mean(0)).sum() * V
        if self.kind == "per_sequence":  # a sum divided by the batch size (a per-sequence loss)
            return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum") / ids.shape[0]
        if self.kind == "batch_first":  # a mean over the batch dim before the final sum
            return logits.pow(2).mean(0).sum()
        if self.kind == "weighted":
            return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), weight=self.head.bias.detach().abs())
        return logits.pow(2).mean(-1).max()  # "max": no per-microbatch count


def _batch():
    g = torch.Generator().manual_seed(3)
    ids, labels = torch.randint(0, V, (B, T), generator=g), torch.randint(0, V, (B, T), generator=g)
    labels[0, :5] = -100  # microbatch 0 counts far fewer tokens than microbatch 1
    return ids, labels


@pytest.mark.parametrize("kind", ["shifted", "nll", "mask", "sum", "mean"])
def test_weighted_microbatch_losses_equal_the_batch_loss(kind):
    torch.manual_seed(0)
    model, (ids, labels) = Own(kind), _batch()
    weighting = own_loss_weighting(trace(model, (ids[:B // M], labels[:B // M])))
    target, count = batch_target(weighting, [ids, labels], M)
    chunks = target.tensor_split(M)
    total = count(target)
    parts = [model(i, y) * (count(c) / total) for i, y, c in zip(ids.tensor_split(M), labels.tensor_split(M), chunks)]
    full = model(ids, labels)
    torch.testing.assert_close(sum(parts), full, rtol=1e-6, atol=1e-6)
    if kind in ("shifted", "nll", "mask"):  # the plain mean of microbatch means is another number here
        plain = sum(model(i, y) for i, y in zip(ids.tensor_split(M), labels.tensor_split(M))) / M
        assert abs(float((plain - full).detach())) > 1e-3


@pytest.mark.parametrize("kind", ["weighted", "max", "clamped", "offset", "aux"])
def test_a_loss_without_a_known_count_raises_with_the_remedy(kind):
    """Clamped / offset (`/ mask.sum().clamp(min=1)`, `/ (mask.sum() + 1)`): weighing microbatch j by its own
    b_j gives sum_j S_j / sum_j b_j, not the batch's S / b(batch) (a microbatch without items has b_j = 1);
    before, they were weighted as counts and trained on another loss than one device (trial3a)."""
    ids, labels = _batch()
    with pytest.raises(StepError, match="item_count=") as info:
        own_loss_weighting(trace(Own(kind), (ids[:B // M], labels[:B // M])))
    assert "node " in str(info.value)


def test_the_remedy_says_a_batch_level_term_is_not_one_devices_value():
    """Cross-entropy + a load-balancing term (a product of means over the batch, as Mixtral's router aux loss):
    its n_j / N-weighted microbatch values (what the remedy's item_count gives) differ from the whole batch's,
    while the cross-entropy part alone agrees; the StepError's remedy says so instead of promising one device's
    loss (trial4a: Mixtral on pp=2 x dp=2 followed the remedy to a loss 8e-6 and gradients 234x the bound off)."""
    ids, labels = _batch()
    model = Own("aux")
    with torch.no_grad():
        whole = model(ids, labels)
        n = [(labels[j * B // M:(j + 1) * B // M] != -100).sum() for j in range(M)]
        parts = [model(ids[j * B // M:(j + 1) * B // M], labels[j * B // M:(j + 1) * B // M]) for j in range(M)]
        weighted = sum(p * n[j] / sum(n) for j, p in enumerate(parts))
    assert abs(weighted - whole) > 1e-4, (weighted, whole)
    with pytest.raises(StepError, match="load-balancing") as info:
        own_loss_weighting(trace(Own("aux"), (ids[:B // M], labels[:B // M])))
    assert "gradient accumulation" in str(info.value)


def test_a_users_shifted_loss_fn_is_weighted_by_its_own_count():
    """Loss_fn with a target: the count is read from loss_fn's graph (shifted labels), not labels != -100."""
    from parallelizer.runtime.loss_fn_weight import loss_fn_weighting
    from parallelizer.runtime.loss_weight import ChunkCount
    from parallelizer.tracer.graph import TensorMeta

    def shifted(out, y):
        return F.cross_entropy(out["logits"][:, :-1].flatten(0, 1), y[:, 1:].flatten())

    torch.manual_seed(0)
    logits, (_, labels) = torch.randn(B, T, V), _batch()
    labels[2, 0] = -100  # counted by labels != -100, not by the shifted loss: the default count would be off
    labels[1, 1:] = -100
    spec = torch.utils._pytree.tree_flatten({"logits": logits})[1]
    weighting = loss_fn_weighting(shifted, [TensorMeta((B // M, T, V), torch.float32)], spec, labels[:B // M])
    count = ChunkCount(weighting, M, B // M)
    parts = [shifted({"logits": lg}, y) * (count(y) / count(labels))
             for lg, y in zip(logits.tensor_split(M), labels.tensor_split(M))]
    torch.testing.assert_close(sum(parts), shifted({"logits": logits}, labels), rtol=1e-6, atol=1e-6)
    default = [shifted({"logits": lg}, y) * ((y != -100).sum() / (labels != -100).sum())
               for lg, y in zip(logits.tensor_split(M), labels.tensor_split(M))]
    assert abs(float(sum(default) - shifted({"logits": logits}, labels))) > 1e-3
    untraceable = loss_fn_weighting(lambda out, y: out["logits"].mean() * float(y.max()),
                                    [TensorMeta((B // M, T, V), torch.float32)], spec, labels[:B // M])
    assert untraceable is None  # .item()-like Python on values: the caller keeps count_items
    with pytest.raises(StepError, match="item_count="):
        loss_fn_weighting(lambda out, y: out["logits"].amax(), [TensorMeta((B // M, T, V), torch.float32)], spec,
                          labels[:B // M])


def test_a_clamped_count_would_not_give_the_batch_loss():
    """Independent of the weighting code: one device's loss of the whole batch is S / max(M, 1), while weighing
    the microbatch losses by their clamped counts gives S / sum_j max(m_j, 1), another number when a microbatch
    has no items (the reason `clamped` must raise above)."""
    torch.manual_seed(0)
    model, (ids, labels) = Own("clamped"), _batch()
    labels[: B // M] = -100  # microbatch 0 has no items
    full = model(ids, labels)
    parts = [(model(i, y), (y != -100).sum().clamp(min=1)) for i, y in zip(ids.tensor_split(M), labels.tensor_split(M))]
    weighted = sum(p * c for p, c in parts) / sum(c for _, c in parts)
    assert abs(float((weighted - full).detach())) > 1e-3


def test_a_loss_fn_holding_a_cpu_tensor_is_weighted_by_its_graph_not_guessed():
    """A loss_fn that holds a tensor of its own (here a logit bias; class weights alike) was traced by
    make_fx on meta tensors, which fails when the meta logits meet that CPU tensor, and the step then counted
    labels != -100 per microbatch without a word. For a shifted loss that weighting is not one device's (checked
    here against the loss of the whole batch computed directly); traced on fake CPU tensors, the graph's shifted
    count is read and the weighted microbatch losses equal the batch loss."""
    from parallelizer.runtime.loss_fn_weight import loss_fn_weighting
    from parallelizer.runtime.loss_weight import ChunkCount
    from parallelizer.tracer.graph import TensorMeta

    bias = torch.linspace(-1.0, 1.0, V)

    def shifted_with_bias(out, y):
        return F.cross_entropy((out["logits"] + bias)[:, :-1].flatten(0, 1), y[:, 1:].flatten())

    torch.manual_seed(0)
    logits, (_, labels) = torch.randn(B, T, V), _batch()
    labels[2, 0] = -100  # counted by labels != -100, not by the shifted loss
    labels[1, 1:] = -100
    spec = torch.utils._pytree.tree_flatten({"logits": logits})[1]
    weighting = loss_fn_weighting(shifted_with_bias, [TensorMeta((B // M, T, V), torch.float32)], spec,
                                  labels[:B // M])
    assert weighting is not None and weighting.kind == "count", weighting  # before: None (make_fx failed)
    count = ChunkCount(weighting, M, B // M)
    parts = [shifted_with_bias({"logits": lg}, y) * (count(y) / count(labels))
             for lg, y in zip(logits.tensor_split(M), labels.tensor_split(M))]
    torch.testing.assert_close(sum(parts), shifted_with_bias({"logits": logits}, labels), rtol=1e-6, atol=1e-6)


def test_a_class_weighted_loss_fn_is_refused_with_its_own_remedy():
    """A class-weighted cross-entropy as loss_fn on a pipeline trained 1e-2 off one device (pp=2 x tp=2): its mean divides by the sum of the targets' weights, which labels != -100
    does not give. Now a StepError that speaks of the loss_fn (not of the model's own loss) and names the
    weighted count as the remedy."""
    from parallelizer.runtime.loss_fn_weight import loss_fn_weighting
    from parallelizer.tracer.graph import TensorMeta

    weight = torch.linspace(0.5, 1.5, V)

    def weighted(out, y):
        return F.cross_entropy(out["logits"].flatten(0, 1), y.flatten(), weight=weight)

    _, labels = _batch()
    spec = torch.utils._pytree.tree_flatten({"logits": torch.zeros(1)})[1]
    with pytest.raises(StepError, match="class weights") as info:
        loss_fn_weighting(weighted, [TensorMeta((B // M, T, V), torch.float32)], spec, labels[:B // M])
    assert "your loss_fn's loss" in str(info.value) and "loss_fn=None" not in str(info.value)
    assert "weight[y[y != -100]].sum()" in str(info.value)


PER_ITEM_LOSS_FNS = {  # a sum divided by a number proportional to the microbatch size: a per-item mean
    "sum / shape[0]": lambda lg, y: F.cross_entropy(lg.flatten(0, 1), y.flatten(), reduction="sum") / y.shape[0],
    "sum / numel": lambda lg, y: F.cross_entropy(lg.flatten(0, 1), y.flatten(), reduction="sum") / y.numel(),
    "sum * (1 / len)": lambda lg, y: lg.pow(2).sum() * (1.0 / len(y)),
    "kl_div batchmean": lambda lg, y: F.kl_div(lg.log_softmax(-1), F.one_hot(y.clamp(min=0), V).float(),
                                               reduction="batchmean"),
    "2 x (sum / shape[0])": lambda lg, y: 2.0 * (lg.pow(2).sum() / y.shape[0]),
}
NOT_PER_ITEM_LOSS_FNS = {  # divided by the microbatch size in a way no microbatch weighting can undo
    "sum / shape[0] ** 2": lambda lg, y: lg.pow(2).sum() / y.shape[0] ** 2,
    "mean / shape[0]": lambda lg, y: lg.pow(2).mean() / y.shape[0],
    "ce mean / shape[0]": lambda lg, y: F.cross_entropy(lg.flatten(0, 1), y.flatten()) / y.shape[0],
}


@pytest.mark.parametrize("name", sorted(PER_ITEM_LOSS_FNS))
def test_a_loss_fn_that_is_a_sum_divided_by_the_microbatch_size_weighs_microbatches_equally(name):
    """`F.cross_entropy(..., reduction="sum") / y.shape[0]` (or `/ y.numel()`, `* (1 / len(y))`,
    `F.kl_div(..., reduction="batchmean")`) as loss_fn on a pipeline. Before round 9 the division was skipped as
    a constant factor and the sum weighted 1 per microbatch: m times one device's loss (pp=2 x tp=2, 4
    microbatches: loss 69 off, gradients 1.5); then it was refused (a false refusal: `batchmean` is the
    documented KL loss). Such a term is a mean over per-item sums, and with equal microbatches each weighs 1 / m:
    the weighted microbatch losses equal the whole batch's loss, computed directly here."""
    from parallelizer.runtime.loss_fn_weight import loss_fn_weighting
    from parallelizer.runtime.loss_weight import ChunkCount
    from parallelizer.tracer.graph import TensorMeta

    fn = PER_ITEM_LOSS_FNS[name]

    def loss_fn(out, y):
        return fn(out["logits"], y)

    torch.manual_seed(0)
    logits, (_, labels) = torch.randn(B, T, V), _batch()
    spec = torch.utils._pytree.tree_flatten({"logits": logits})[1]
    metas = [TensorMeta((B // M, T, V), torch.float32)]
    summed = sum(loss_fn({"logits": lg}, y) for lg, y in zip(logits.tensor_split(M), labels.tensor_split(M)))
    whole = loss_fn({"logits": logits}, labels)
    assert abs(float(summed - whole)) > 0.5 * abs(float(whole))  # weight 1 each (a sum's): about M x too large
    weighting = loss_fn_weighting(loss_fn, metas, spec, labels[:B // M])
    assert weighting.kind == "equal", weighting
    count = ChunkCount(weighting, M, B // M)
    parts = [loss_fn({"logits": lg}, y) * (count(y) / count(labels))
             for lg, y in zip(logits.tensor_split(M), labels.tensor_split(M))]
    torch.testing.assert_close(sum(parts), whole)


@pytest.mark.parametrize("name", sorted(NOT_PER_ITEM_LOSS_FNS))
def test_a_loss_fn_divided_by_the_microbatch_size_otherwise_is_refused(name):
    """A sum divided by the square of the microbatch size, or a mean (or a token-counting cross-entropy) divided
    again by it: no weighting of the microbatch values gives one device's loss; StepError naming the loss op. A
    fixed factor (x 2.0) is still read as a constant and its weighted microbatch losses equal the whole batch's."""
    from parallelizer.runtime.loss_fn_weight import loss_fn_weighting
    from parallelizer.runtime.loss_weight import ChunkCount
    from parallelizer.tracer.graph import TensorMeta

    fn = NOT_PER_ITEM_LOSS_FNS[name]
    torch.manual_seed(0)
    logits, (_, labels) = torch.randn(B, T, V), _batch()
    spec = torch.utils._pytree.tree_flatten({"logits": logits})[1]
    metas = [TensorMeta((B // M, T, V), torch.float32)]
    with pytest.raises(StepError, match="microbatch size"):
        loss_fn_weighting(lambda out, y: fn(out["logits"], y), metas, spec, labels[:B // M])

    def doubled(out, y):
        return 2.0 * F.cross_entropy(out["logits"].flatten(0, 1), y.flatten())

    weighting = loss_fn_weighting(doubled, metas, spec, labels[:B // M])
    count = ChunkCount(weighting, M, B // M)
    parts = [doubled({"logits": lg}, y) * (count(y) / count(labels))
             for lg, y in zip(logits.tensor_split(M), labels.tensor_split(M))]
    torch.testing.assert_close(sum(parts), doubled({"logits": logits}, labels), rtol=1e-6, atol=1e-6)


def test_a_loss_fn_reducing_over_the_batch_before_its_final_sum_is_refused():
    """`nll.mean(0).sum()` as loss_fn on a pipeline (pp=2 x tp=2, 8 microbatches): the final sum was
    weighted 1 per microbatch, but its terms are batch means, so the step returned about m times one device's loss
    (270 off). Checked here directly: the sum of the microbatch values is not the whole batch's; the weighting
    is now refused. A reduction over per-item terms (`.sum(-1).mean()`) is still accepted and matches."""
    from parallelizer.runtime.loss_fn_weight import loss_fn_weighting
    from parallelizer.runtime.loss_weight import ChunkCount
    from parallelizer.tracer.graph import TensorMeta

    def batch_mean_then_sum(out, y):
        return F.cross_entropy(out["logits"].flatten(0, 1), y.clamp(min=0).flatten(), reduction="none") \
            .view(y.shape).mean(0).sum()

    def per_item(out, y):
        return F.cross_entropy(out["logits"].flatten(0, 1), y.clamp(min=0).flatten(), reduction="none") \
            .view(y.shape).sum(-1).mean()

    torch.manual_seed(0)
    logits, (_, labels) = torch.randn(B, T, V), _batch()
    spec = torch.utils._pytree.tree_flatten({"logits": logits})[1]
    metas = [TensorMeta((B // M, T, V), torch.float32)]
    summed = sum(batch_mean_then_sum({"logits": lg}, y) for lg, y in zip(logits.tensor_split(M), labels.tensor_split(M)))
    assert abs(float(summed - batch_mean_then_sum({"logits": logits}, labels))) > 1.0
    with pytest.raises(StepError, match="do not grow with the batch"):
        loss_fn_weighting(batch_mean_then_sum, metas, spec, labels[:B // M])
    weight = torch.randn(16, 8)  # round 13 (r13d): an L2 penalty on a tensor is named among the causes

    def with_penalty(out, y):
        return F.cross_entropy(out["logits"].flatten(0, 1), y.flatten()) + 1e-4 * weight.pow(2).sum()

    with pytest.raises(StepError, match=r"or a term over parameters alone, e\.g\. an L2 penalty"):
        loss_fn_weighting(with_penalty, metas, spec, labels[:B // M])
    count = ChunkCount(loss_fn_weighting(per_item, metas, spec, labels[:B // M]), M, B // M)
    parts = [per_item({"logits": lg}, y) * (count(y) / count(labels))
             for lg, y in zip(logits.tensor_split(M), labels.tensor_split(M))]
    torch.testing.assert_close(sum(parts), per_item({"logits": logits}, labels), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kind, refused", [("per_sequence", False), ("batch_first", True), ("sum", False),
                                           ("mean", False), ("nll", False)])
def test_a_models_own_loss_normalised_by_its_batch_is_found_by_a_second_trace(kind, refused):
    """A model's OWN loss `F.cross_entropy(..., reduction="sum") / ids.shape[0]` or `x.mean(0).sum()`: one trace
    at the microbatch size shows a sum scaled by a constant (export bakes the batch size in), which the
    pipeline step weighted as a per-item sum: about m times one device's loss (pp=2 x tp=2, 4 microbatches:
    69 and 116 off). `PipelineModule.step` traces the model again on twice the microbatch when the loss has
    such a form (`needs_batch_check`): the sum divided by the batch size is a per-item mean and weighs 1 / m
    (own_loss_weighting with the second trace), `x.mean(0).sum()` is refused by `check_batch_scaling`; a sum,
    a mean and a constant factor (nll x 2.0) are kept. Checked against the whole batch computed directly."""
    torch.manual_seed(0)
    model, (ids, labels) = Own(kind), _batch()
    traced = trace(model, (ids[:B // M], labels[:B // M]))
    one = traced.graph_module.graph
    two = trace(model, (ids[:2 * B // M], labels[:2 * B // M]))
    if refused:
        assert needs_batch_check(one)
        with pytest.raises(StepError, match="pm.step\\(loss_fn=None\\)"):
            check_batch_scaling(one, two.graph_module.graph, "own")
        return
    weighting = own_loss_weighting(traced, two)
    target, count = batch_target(weighting, [ids, labels], M)
    parts = [model(i, y) * (count(c) / count(target)) for i, y, c in
             zip(ids.tensor_split(M), labels.tensor_split(M), target.tensor_split(M))]
    torch.testing.assert_close(sum(parts), model(ids, labels))
    if kind == "per_sequence":  # what the one-trace weighting gave: a sum's weights, m times the batch loss
        assert own_loss_weighting(traced).kind == "sum" and weighting.kind == "equal"


def test_a_loss_fn_scaled_by_a_fresh_grad_scaler_is_weighted_and_leaves_the_scaler_real():
    """`loss_fn=lambda out, y: scaler.scale(ce(out, y))` (torch.amp.GradScaler on a pipeline): tracing the
    loss_fn ran the scaler's first `scale` under make_fx, which left a FakeTensor as the user's scaler's scale and
    recorded its creation as an op (`full`), so the step raised StepError ("an op whose per-microbatch item count
    the graph does not show"). Now the scale is created as a real tensor (the value the first real call creates)
    and is read as a constant factor: the weighting is the cross-entropy's count, and the weighted microbatch
    losses equal the scaled loss of the whole batch (computed directly)."""
    from parallelizer.runtime.loss_fn_weight import loss_fn_weighting
    from parallelizer.runtime.loss_weight import ChunkCount
    from parallelizer.tracer.graph import TensorMeta

    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 7)

    def scaled(out, y):
        return scaler.scale(F.cross_entropy(out["logits"].flatten(0, 1), y.flatten()))

    torch.manual_seed(0)
    logits, (_, labels) = torch.randn(B, T, V), _batch()
    spec = torch.utils._pytree.tree_flatten({"logits": logits})[1]
    weighting = loss_fn_weighting(scaled, [TensorMeta((B // M, T, V), torch.float32)], spec, labels[:B // M])
    assert weighting is not None and weighting.kind == "count", weighting
    assert type(scaler._scale) is torch.Tensor and scaler.get_scale() == 2.0 ** 7
    count = ChunkCount(weighting, M, B // M)
    parts = [scaled({"logits": lg}, y) * (count(y) / count(labels))
             for lg, y in zip(logits.tensor_split(M), labels.tensor_split(M))]
    torch.testing.assert_close(sum(parts), scaled({"logits": logits}, labels))
    assert abs(float(sum(parts) / 2 ** 7 - F.cross_entropy(logits.flatten(0, 1), labels.flatten()))) < 1e-5


class ElementLoss(torch.nn.Module):
    """A model whose own loss is one of the elementwise losses that have a sharding rule
    (`planner.rules.losses.ELEMENTWISE_LOSSES`), reduced by `reduction`."""

    def __init__(self, op: str, reduction: str) -> None:
        super().__init__()
        self.op, self.reduction = op, reduction
        self.emb, self.head = torch.nn.Embedding(V, 8), torch.nn.Linear(8, V)

    def forward(self, ids, y):
        h, r = self.head(self.emb(ids)), self.reduction
        sign = torch.where(y > 0, 1.0, -1.0)
        if self.op in ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss"):
            return getattr(F, self.op)(h, y, reduction=r)
        if self.op == "soft_margin_loss":
            return F.soft_margin_loss(h, sign, reduction=r)
        if self.op == "kl_div":
            return F.kl_div(h.log_softmax(-1), y.softmax(-1), reduction=r)
        if self.op == "binary_cross_entropy":
            return F.binary_cross_entropy(h.sigmoid(), y.sigmoid(), reduction=r)
        if self.op == "binary_cross_entropy_with_logits":
            return F.binary_cross_entropy_with_logits(h, y.sigmoid(), reduction=r)
        if self.op == "hinge_embedding_loss":
            return F.hinge_embedding_loss(h, sign, reduction=r)
        if self.op == "margin_ranking_loss":
            return F.margin_ranking_loss(h[..., 0], h[..., 1], sign[..., 0], reduction=r)
        rows, ids_ = h.flatten(0, 1), ids.flatten()              # per-sample losses: one sample per (b, t)
        if self.op == "multi_margin_loss":
            return F.multi_margin_loss(rows, ids_, reduction=r)
        if self.op == "multilabel_margin_loss":
            labels = torch.where(torch.arange(V) == 0, ids_[:, None], -1)   # one label each, then -1 padding
            return F.multilabel_margin_loss(rows, labels, reduction=r)
        if self.op == "cosine_embedding_loss":
            return F.cosine_embedding_loss(rows, rows.flip(-1), sign.flatten(0, 1)[:, 0], reduction=r)
        if self.op == "triplet_margin_loss":
            return F.triplet_margin_loss(rows, rows.flip(-1), rows.roll(1, -1), reduction=r)
        assert self.op == "poisson_nll_loss"
        return F.poisson_nll_loss(h, y.abs(), reduction=r)


_LOSSES = __import__("parallelizer.planner.rules.losses", fromlist=["x"])
ELEMENT_OPS = sorted(p.__name__ for p in (*_LOSSES.ELEMENTWISE_LOSSES, *_LOSSES.PER_SAMPLE_LOSSES))


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("op", ELEMENT_OPS)
def test_every_elementwise_loss_with_a_rule_is_weighted_on_a_pipeline(op, reduction):
    """Round 9 (d): kl_div, poisson_nll_loss, hinge_embedding_loss and margin_ranking_loss got sharding rules
    (`planner.rules.losses.ELEMENTWISE_LOSSES`) but the pipeline's weighting knew only 7 of the 11 by name: a
    model returning one of them as its own loss was refused on every pipeline plan (pm.step and `rehearse`:
    StepError "an op whose per-microbatch item count the graph does not show"). Their mean is over every
    element, so equal microbatches weigh equally; a sum adds up. Checked against the whole batch eagerly.
    Round 10's per-sample losses (multi-margin, multilabel-margin, cosine-embedding, triplet-margin: rows and
    the same class of refusal, 8 cases failed before) average over the samples: equal weights too."""
    torch.manual_seed(0)
    model = ElementLoss(op, reduction)
    g = torch.Generator().manual_seed(5)
    ids, y = torch.randint(0, V, (B, T), generator=g), torch.randn(B, T, V, generator=g)
    traced = trace(model, (ids[:B // M], y[:B // M]))
    assert any(getattr(n.target, "__name__", "").startswith(op + ".") for n in traced.graph_module.graph.nodes), op
    weighting = own_loss_weighting(traced)
    target, count = batch_target(weighting, [ids, y], M)
    chunks, total = target.tensor_split(M), count(target)
    parts = [model(i, t) * (count(c) / total) for i, t, c in zip(ids.tensor_split(M), y.tensor_split(M), chunks)]
    torch.testing.assert_close(sum(parts), model(ids, y))


class Terms(torch.nn.Module):
    """A model whose own loss is a sum of loss terms (`kind`): a VAE (reconstruction mse + BCE + 0.1 x a KL term
    averaged over the batch), an SRGAN generator's l1 minus a BCE-with-logits term, two sums, and forms that
    must stay refused."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.enc, self.dec = torch.nn.Linear(V, 8), torch.nn.Linear(4, V)

    def forward(self, x, eps):
        h = self.enc(x)
        mu, lv = h[:, :4], h[:, 4:]
        rec = self.dec(mu + eps * torch.exp(0.5 * lv))
        kl = -0.5 * torch.mean(torch.sum(1 + lv - mu.pow(2) - lv.exp(), dim=1))
        if self.kind == "vae":
            return F.mse_loss(rec, x) + F.binary_cross_entropy(rec.sigmoid(), x.sigmoid()) + 0.1 * kl
        if self.kind == "difference":
            return F.l1_loss(rec, x) - 0.01 * F.binary_cross_entropy_with_logits(rec, x.sigmoid())
        if self.kind == "sums":
            return F.mse_loss(rec, x, reduction="sum") + (1 + lv - mu.pow(2)).sum()
        if self.kind == "per_sample_sums":  # each term a sum over the microbatch divided by its size
            return F.mse_loss(rec, x, reduction="sum") / x.shape[0] + (1 + lv - mu.pow(2)).sum() / x.shape[0]
        if self.kind == "batch_term":  # a mean of squared batch means: a batch-level term, not per item
            return F.mse_loss(rec, x) + h.mean(0).pow(2).mean()
        return F.mse_loss(rec, x, reduction="sum") + kl  # "mixed": a sum plus a mean


def _terms_batch():
    g = torch.Generator().manual_seed(9)
    return torch.randn(2 * B, V, generator=g), torch.randn(2 * B, 4, generator=g)


@pytest.mark.parametrize("kind", ["vae", "difference", "sums", "per_sample_sums"])
def test_a_sum_of_loss_terms_that_weigh_alike_is_the_batch_loss(kind):
    """Round 9 (d): a VAE's own loss (mse + BCE + 0.1 x KL) on pp=2 x dp=2 raised StepError ("node add_3, an op
    whose per-microbatch item count the graph does not show"): a false refusal. Terms that all weigh equally
    (means over fixed numbers of items, or sums divided by the microbatch size, which the second trace finds)
    or all add up (sums) now weigh as their terms; checked against the whole batch eagerly."""
    torch.manual_seed(0)
    model, (x, eps) = Terms(kind), _terms_batch()
    n = x.shape[0] // M
    traced = trace(model, (x[:n], eps[:n]))
    weighting = own_loss_weighting(traced, trace(model, (x[:2 * n], eps[:2 * n])))
    assert weighting.kind == ("sum" if kind == "sums" else "equal")
    target, count = batch_target(weighting, [x, eps], M)
    parts = [model(a, e) * (count(c) / count(target))
             for a, e, c in zip(x.tensor_split(M), eps.tensor_split(M), target.tensor_split(M))]
    torch.testing.assert_close(sum(parts), model(x, eps))


def test_a_sum_of_loss_terms_weighted_differently_or_reduced_over_the_batch_is_refused():
    """A sum plus a mean has no one weighting (refused, naming both terms); a batch-level mean (of squared batch
    means) beside a per-item mean is found by the second trace in every term, as for one term."""
    x, eps = _terms_batch()
    n = x.shape[0] // M
    with pytest.raises(StepError, match="loss terms weighted differently"):
        own_loss_weighting(trace(Terms("mixed"), (x[:n], eps[:n])))
    model = Terms("batch_term")
    one = trace(model, (x[:n], eps[:n])).graph_module.graph
    assert own_loss_weighting(trace(model, (x[:n], eps[:n]))).kind == "equal" and needs_batch_check(one)
    with pytest.raises(StepError, match="do not grow with the batch"):
        check_batch_scaling(one, trace(model, (x[:2 * n], eps[:2 * n])).graph_module.graph, "own")


class FixedBatch(torch.nn.Module):
    """A model that reshapes to the batch it was written for (4 rows) and returns a scaled sum: it traces on a
    microbatch of 4 but not on twice it."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(V, V)

    def forward(self, x):
        return self.lin(x).reshape(4, V).pow(2).sum() * 0.25


def test_a_loss_whose_confirming_second_trace_fails_is_refused_not_guessed():
    """`sum * 0.25` at a microbatch of 4 is either a sum scaled by a constant (weight 1 per microbatch) or a per-item
    mean (`/ x.shape[0]`, weight 1 / m): one trace cannot tell, and the two weightings differ by a factor m. Before,
    a model that did not trace on twice the microbatch kept the one-trace weighting (a sum) silently; now
    `doubled_trace` raises StepError naming the loss op and why the second trace failed."""
    from parallelizer.runtime.loss_weight import doubled_trace
    from parallelizer.runtime.modes import Retracer

    torch.manual_seed(0)
    model, x = FixedBatch(), torch.randn(4, V)
    traced = trace(model, (x,))
    assert needs_batch_check(traced.graph_module.graph) and own_loss_weighting(traced).kind == "sum"
    with pytest.raises(StepError, match="that trace failed") as info:
        doubled_trace(Retracer.of(model), traced)
    assert "node" in str(info.value) and "sum" in str(info.value)


@pytest.mark.parametrize("ignore_index", [-100, 0])
def test_a_label_smoothed_loss_fn_is_weighted_by_its_targets(ignore_index):
    """`F.cross_entropy(..., label_smoothing=0.1)` as a loss_fn: make_fx decomposes it into the nll mean plus the
    smoothing term's sum over the targets != ignore_index divided by their count, two means over the same targets.
    It was refused (StepError "a sum of 2 loss terms weighted differently ... count, count": pass item_count=);
    now weighted by that count, the microbatch losses give the batch loss (labels ignored unevenly)."""
    from parallelizer.runtime.loss_fn_weight import loss_fn_weighting
    from parallelizer.runtime.loss_weight import ChunkCount
    from parallelizer.tracer.graph import TensorMeta

    def smoothed(out, y):
        return F.cross_entropy(out["logits"].flatten(0, 1), y.flatten(), label_smoothing=0.1, ignore_index=ignore_index)

    torch.manual_seed(0)
    logits, (_, labels) = torch.randn(B, T, V), _batch()
    labels[labels == -100] = ignore_index
    labels[0, 1:] = ignore_index  # microbatch 0 counts 1 + 6 targets, microbatch 1 counts 12 (or fewer zeros)
    spec = torch.utils._pytree.tree_flatten({"logits": logits})[1]
    weighting = loss_fn_weighting(smoothed, [TensorMeta((B // M, T, V), torch.float32)], spec, labels[:B // M])
    assert weighting.kind == "count", weighting
    count = ChunkCount(weighting, M, B // M)
    parts = [smoothed({"logits": lg}, y) * (count(y) / count(labels))
             for lg, y in zip(logits.tensor_split(M), labels.tensor_split(M))]
    torch.testing.assert_close(sum(parts), smoothed({"logits": logits}, labels), rtol=1.3e-6, atol=1e-5)
    equal = sum(smoothed({"logits": lg}, y) for lg, y in zip(logits.tensor_split(M), labels.tensor_split(M))) / M
    assert abs(float(equal - smoothed({"logits": logits}, labels))) > 1e-3  # the counts matter here


@pytest.mark.parametrize("dtype, big", [(torch.float16, 2048.0), (torch.bfloat16, 256.0)])
def test_a_narrow_batch_loss_adds_its_weighted_microbatch_losses_in_float32(dtype, big):
    # round 26: the batch loss `PipelineRun.step` returns and the eval loss `pipeline_eval._merge` merges
    # (`microbatch_loss.batch_loss`). Microbatch means 4 big, 4, 4, -4 big weighted 1/4 each: exact in `dtype`, and
    # big + 1 rounds back to big there, so summed in `dtype` they gave 0 (before) where one device's mean is 2
    from parallelizer.runtime.microbatch_loss import batch_loss

    rows = torch.tensor([4 * big, 4.0, 4.0, -4 * big], dtype=dtype)  # one row per microbatch
    one_device = rows.mean()  # the whole batch's mean (float32 accumulation inside the kernel)
    got = batch_loss([(row, 0.25) for row in rows])
    assert got.dtype == dtype and one_device.item() == 2.0
    torch.testing.assert_close(got, one_device)
    # a zero-weight microbatch (no item) whose mean is NaN adds 0; an item-count tensor weight keeps its dtype
    assert batch_loss([(rows[1], 1.0), (torch.tensor(float("nan"), dtype=dtype), 0.0)]).item() == 4.0
    assert batch_loss([(rows[1], torch.tensor(0.5))]).dtype == torch.float32
