"""Cutting the batch into a pipeline's microbatches must not change the model's numbers silently
(`tracer.microbatch_check`, trial r10b: a batch centering inside a block trained on pp=2 x dp=2 with its loss
1.7e-2 off one device, 1580x the float32 bound, and BatchNorm1d in the blocks left running means 1.4e4x the
bound off, with no error or warning). The check names the first module whose whole-batch outputs differ from
its outputs on the microbatches one at a time (or the parent's own code before it, or a buffer the forward
writes once per call), with the size of the difference computed here independently; a per-sample model gets
nothing; forwards that draw random numbers are skipped; the model's buffers and RNG are left as they were."""
import re
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from parallelizer import MicrobatchWarning
from parallelizer.runtime.pipeline_rehearsal import _warn_microbatch_mixing
from parallelizer.tracer.microbatch_check import microbatch_mixing


class Block(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.norm, self.a = nn.LayerNorm(6), nn.Linear(6, 6)
        self.bn = nn.BatchNorm1d(6)
        self.register_buffer("ema", torch.zeros(6))
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x):                         # x (B, T, 6)
        h = self.norm(x)
        if self.kind == "bn":
            h = self.bn(h.transpose(1, 2)).transpose(1, 2)
        elif self.kind == "center":
            h = h - h.mean(0, keepdim=True)       # mixes the samples in the block's own code
        elif self.kind == "ema":
            with torch.no_grad():
                self.ema.mul_(0.9).add_(0.1 * h.detach().mean((0, 1)))  # per call, not per sample
        elif self.kind == "ema_param":
            with torch.no_grad():  # a parameter written per call (MoCo's momentum update of a key encoder)
                self.a.bias.mul_(0.9).add_(0.1 * h.detach().mean((0, 1)))
        elif self.kind == "count":
            self.calls += 1                       # an integer counter of forward calls (a warm-up step count)
        elif self.kind == "dropout":
            h = F.dropout(h, 0.5, self.training)
        return x + self.a(h)


class Net(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(kind) for _ in range(2))
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x).pow(2).mean()         # a scalar loss: not compared itself


def _stated(message: str, before: str, after: str) -> float:
    """The number the message prints between `before` and `after` (a regex each side)."""
    found = re.search(before + r"\s*([-+0-9.eEinf]+)\s*" + after, message)
    assert found, (before, after, message)
    return float(found.group(1))


# The check computes its numbers with its own op graph (the model under forward hooks, differences in float64, a
# weighted sum in float64 cast to the model's dtype) and prints them rounded (3 or 6 digits); the test recomputes
# them independently (here: float32 differences, a Python mean). Two computations can round to different printed
# digits when the value lies near a rounding boundary (on another CPU, other kernels move it), so the printed
# value is compared within its printed precision (5e-3 relative at 3 digits, 5e-6 at 6) plus a few float32
# ulps, not as a string: a wrong number (another module's, a missing microbatch) is off by far more.
DIGITS3, DIGITS6 = 6e-3, 6e-6


def _net(kind: str):
    torch.manual_seed(0)
    return Net(kind), torch.randn(8, 5, 6, generator=torch.Generator().manual_seed(1))


def test_batchnorm_in_training_is_named_with_its_difference():
    model, x = _net("bn")
    blk = model.blocks[0]
    with torch.no_grad():  # independently: the first BatchNorm on the whole batch and on 2 microbatches of 4
        h = blk.norm(x).transpose(1, 2)
        whole = F.batch_norm(h, None, None, blk.bn.weight, blk.bn.bias, training=True)
        parts = torch.cat([F.batch_norm(p, None, None, blk.bn.weight, blk.bn.bias, training=True)
                           for p in h.tensor_split(2)])
    want = (whole - parts).abs().max().item()
    assert want > 0.1
    state = {k: v.clone() for k, v in model.state_dict().items()}
    where, message = microbatch_mixing(model, (x,), {}, 2)
    assert where == "blocks.0.bn" and "module 'blocks.0.bn'" in message and "2 microbatches" in message
    assert _stated(message, r"max \|whole batch - microbatches\| =", r"\)") == pytest.approx(want, rel=DIGITS3)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())  # running stats untouched


def test_mixing_in_a_blocks_own_code_names_the_block():
    model, x = _net("center")
    where, message = microbatch_mixing(model, (x,), {}, 4)
    assert where == "blocks.0.a" and "the code of module 'blocks.0' before its call of 'blocks.0.a'" in message


def test_a_buffer_written_once_per_call_is_named():
    model, x = _net("ema")
    with torch.no_grad():  # one device: one update from the whole batch; the pipeline: one per microbatch
        h = model.blocks[0].norm(x)
        once = 0.1 * h.mean((0, 1))
        twice = torch.zeros(6)
        for p in h.tensor_split(2):
            twice = twice * 0.9 + 0.1 * p.mean((0, 1))
    where, message = microbatch_mixing(model, (x,), {}, 2)
    assert where == "blocks.0.ema" and "updated once per microbatch (2 times per step)" in message
    assert _stated(message, r"ends", r"away from") == pytest.approx((once - twice).abs().max().item(), rel=DIGITS3)
    assert torch.equal(model.blocks[0].ema, torch.zeros(6))


def test_an_integer_buffer_written_once_per_call_is_named():
    """An integer counter the forward increments (`self.calls += 1`, BatchNorm's `num_batches_tracked` kind) ends
    at microbatches times one device's count on a pipeline. Before (trial r24h) the buffer comparison took floating
    tensors only: on pp=2 x dp=2 a counter ended at 6 after 3 steps where one device counts 3, with no warning."""
    model, x = _net("count")
    model(x)  # one device: one call per step
    once = int(model.blocks[0].calls)
    model.blocks[0].calls.zero_()
    for part in x.tensor_split(4):  # a pipeline: one call per microbatch
        model(part)
    per_micro = int(model.blocks[0].calls)
    model.blocks[0].calls.zero_()
    where, message = microbatch_mixing(model, (x,), {}, 4)
    assert (once, per_micro) == (1, 4)
    assert where == "blocks.0.calls" and "updated once per microbatch (4 times per step)" in message, message
    assert _stated(message, r"ends", r"away from") == per_micro - once
    assert int(model.blocks[0].calls) == 0  # left as it was


def test_a_parameter_written_once_per_call_is_named_and_left_as_it_was():
    """A parameter the forward writes in place per call (MoCo's momentum update) is updated once per
    microbatch: the module reading it is named, with the difference computed here, and the parameter is left
    as it was. Before (r13b) the check restored buffers only, so its second whole-batch call started from the
    parameter its first call wrote, differed from it, and the model was taken for a random forward and
    skipped (None), with the parameter left written by the check's calls."""
    model, x = _net("ema_param")
    bias = model.blocks[0].a.bias.detach().clone()
    with torch.no_grad():  # blocks.0.a's output on each half: the bias written once (whole) or per microbatch
        h = model.blocks[0].norm(x)
        once = bias * 0.9 + 0.1 * h.mean((0, 1))
        second = (bias * 0.9 + 0.1 * h.tensor_split(2)[0].mean((0, 1))) * 0.9 + 0.1 * h.tensor_split(2)[1].mean((0, 1))
        first = bias * 0.9 + 0.1 * h.tensor_split(2)[0].mean((0, 1))
        expected = max((once - first).abs().max().item(), (once - second).abs().max().item())
    where, message = microbatch_mixing(model, (x,), {}, 2)
    assert where == "blocks.0.a", (where, message)
    assert _stated(message, r"microbatches\|\s*=", r"\)") == pytest.approx(expected, rel=DIGITS3)
    assert torch.equal(model.blocks[0].a.bias, bias)


def test_per_sample_models_eval_mode_and_random_forwards_pass():
    model, x = _net("none")
    assert microbatch_mixing(model, (x,), {}, 2) is None
    model, x = _net("bn")
    model.eval()  # running statistics: per sample
    assert microbatch_mixing(model, (x,), {}, 2) is None
    model, x = _net("dropout")
    assert microbatch_mixing(model, (x,), {}, 2) is None  # microbatches would draw other masks
    model, x = _net("bn")
    assert microbatch_mixing(model, (x,), {}, 1) is None and microbatch_mixing(model, (x[:7],), {}, 2) is None
    lin = nn.Linear(6, 6)  # dropout in the root's own code before a scalar loss: random, not compared
    root = type("Root", (nn.Module,), {"forward": lambda self, x: F.dropout(lin(x), 0.5, True).pow(2).mean()})()
    assert microbatch_mixing(root, (x,), {}, 2, torch.tensor([0.5, 0.5])) is None


def test_the_pipeline_rehearsal_warns_too():
    """rehearse_pipeline compares with gradient accumulation over the same microbatches, so a BatchNorm model
    reports a match there: it warns before its ranks start (the same check as auto_parallelize)."""
    def build(kind):
        model, x = _net(kind)
        return model, (x,)
    with pytest.warns(MicrobatchWarning, match="blocks.0.bn.*compares with gradient accumulation") as caught:
        _warn_microbatch_mixing(build, {"kind": "bn"}, 2)
    assert caught[0].message.where == "blocks.0.bn"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _warn_microbatch_mixing(build, {"kind": "none"}, 2)


class InBatch(nn.Module):
    """Per-sample blocks and CLIP's loss in the model's own code (kind "clip": logits over the batch) or a
    token-mean over a mask (kind "mask": per sample, weighted by token counts on a pipeline)."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind, self.net = kind, Net("none")

    def forward(self, x, mask):
        h = x
        for b in self.net.blocks:
            h = b(h)
        if self.kind == "clip":
            z = F.normalize(self.net.head(h).mean(1), dim=-1)
            return F.cross_entropy(z @ z.t() * 5.0, torch.arange(x.shape[0]))
        return (self.net.head(h).pow(2).sum(-1) * mask).sum() / mask.sum()


def test_a_loss_that_mixes_the_samples_in_the_models_own_code_is_found_with_the_pipelines_weights():
    torch.manual_seed(0)
    x = torch.randn(8, 5, 6, generator=torch.Generator().manual_seed(1))
    mask = torch.zeros(8, 5)
    for i, n in enumerate((5, 1, 0, 2, 5, 5, 4, 5)):  # microbatches of 4 rows: 8 and 19 tokens
        mask[i, :n] = 1
    model = InBatch("clip")
    with torch.no_grad():  # one device on the whole batch; the pipeline: the mean of the microbatch means
        whole = model(x, mask).item()
        parts = sum(model(a, m).item() for a, m in zip(x.tensor_split(2), mask.tensor_split(2))) / 2
    where, message = microbatch_mixing(model, (x, mask), {}, 2, torch.tensor([0.5, 0.5]))
    assert where == "the model's loss"
    assert _stated(message, r"on the whole batch is", r",") == pytest.approx(whole, rel=DIGITS6)
    assert _stated(message, r"weighs them give", r"\(") == pytest.approx(parts, rel=DIGITS6)
    assert microbatch_mixing(model, (x, mask), {}, 2) is None  # without the weights: not compared
    model = InBatch("mask")  # per sample: the token counts' weights reproduce the whole batch's loss
    assert microbatch_mixing(model, (x, mask), {}, 2, torch.tensor([8 / 27, 19 / 27])) is None
    assert microbatch_mixing(model, (x, mask), {}, 2, torch.tensor([0.5, 0.5]))[0] == "the model's loss"


def test_a_loss_fn_that_mixes_the_samples_is_found_and_per_item_losses_are_not():
    """PipelineModule.step's probe of the user's loss_fn (`loss_fn_mixing`), on random outputs of the global batch:
    CLIP's in-batch loss (trial r10b: pm.step(loss_fn=...) 1.44 where one device gives 2.16 on pp=2 x dp=2) is
    found with both numbers, computed here independently; a cross-entropy over padded labels weighted by its
    non-ignored counts, a mean squared error weighted equally and a sum weighted 1 per microbatch are not."""
    from parallelizer.tracer.microbatch_check import loss_fn_mixing

    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(8, 4, generator=g), torch.randn(8, 4, generator=g)

    def clip(out, target):
        return F.cross_entropy(out[0] @ out[1].t(), torch.arange(out[0].shape[0]))
    whole = clip((a, b), None).item()
    parts = (clip((a[:4], b[:4]), None) + clip((a[4:], b[4:]), None)).item() / 2
    message = loss_fn_mixing(clip, [a, b], [True, True], torch.zeros(8), lambda t: 0.5, 2)
    assert _stated(message, r"loss_fn gives", r"on the whole batch") == pytest.approx(whole, rel=DIGITS6)
    assert _stated(message, r"and", r"weighted over") == pytest.approx(parts, rel=DIGITS6)
    logits, labels = torch.randn(8, 5, 7, generator=g), torch.randint(0, 7, (8, 5), generator=g)
    labels[1, 2:] = -100
    labels[5:] = -100
    ce = (lambda out, y: F.cross_entropy(out[0].flatten(0, 1), y.flatten()))
    n = (labels != -100).sum()
    assert loss_fn_mixing(ce, [logits], [True], labels, lambda y: (y != -100).sum() / n, 2) is None
    mse = (lambda out, y: (out[0] - 1).pow(2).mean())
    assert loss_fn_mixing(mse, [logits], [True], torch.zeros(8), lambda t: 0.5, 2) is None
    total = (lambda out, y: out[0].sum())
    assert loss_fn_mixing(total, [logits], [True], torch.zeros(8), lambda t: 1.0, 2) is None
    assert loss_fn_mixing(ce, [logits], [True], labels, lambda y: 0.5, 2) is not None  # wrong weights: found


class SectionPositions(nn.Module):
    """mRoPE-style position ids of shape (3, B, T): the batch is dim 1 of that input (NeMo Automodel#1482)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb, self.pos = nn.Embedding(10, 8), nn.Embedding(16, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, ids, position_ids):
        return self.head(torch.tanh(self.emb(ids) + self.pos(position_ids).sum(0)))


def test_an_input_whose_batch_is_not_dim_0_is_named_when_its_dim_0_happens_to_split():
    """trial r13a: with B = 3 and 3 microbatches, dim 0 of the (3, B, T) position ids splits too, so a pipeline
    cut the sections instead of the samples and every microbatch paired sample j with section j of all samples:
    pm.step on pp=2 gave loss 0.881 where one device gives 1.259, silently (the output, (3, T, 3) on every
    microbatch, is not batch-major there, so no module was compared). The check names it now."""
    torch.manual_seed(0)
    model = SectionPositions()
    g = torch.Generator().manual_seed(1)
    ids, pos = torch.randint(0, 10, (3, 5), generator=g), torch.randint(0, 16, (3, 3, 5), generator=g)
    whole = model(ids, pos)
    cut = model(ids[:1], pos[:1])  # what the first microbatch computes: not whole[:1]
    assert cut.shape == (3, 5, 3) and not torch.allclose(cut[:1], whole[:1])
    found = microbatch_mixing(model, (ids, pos), {}, 3)
    assert found is not None and found[0] == "the model", found
    assert "(3, 5, 3) on a microbatch, not (1, 5, 3)" in found[1] and "batch in dim 0" in found[1], found[1]
    # with the batch in dim 0 of every input the pipeline's cut is right and nothing is said
    per_sample = SectionPositions()
    per_sample.forward = lambda ids, p: per_sample.head(torch.tanh(per_sample.emb(ids)
                                                                   + per_sample.pos(p.transpose(0, 1)).sum(0)))
    assert microbatch_mixing(per_sample, (ids, pos.transpose(0, 1).contiguous()), {}, 3) is None


class SequenceFirstLM(nn.Module):
    """pytorch/examples word_language_model's TransformerModel: (T, B) token ids, a positional table sliced by
    `x.size(0)`, an nn.TransformerEncoder in its default sequence-first layout, a causal mask of len(src)."""

    def __init__(self):
        super().__init__()
        self.emb, self.pe = nn.Embedding(20, 16), nn.Parameter(torch.randn(32, 1, 16))
        self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0), 1,
                                             enable_nested_tensor=False)
        self.head = nn.Linear(16, 20)

    def forward(self, src):
        x = self.emb(src) + self.pe[:src.size(0)]
        mask = nn.Transformer.generate_square_subsequent_mask(len(src))
        return self.head(self.encoder(x, mask=mask, is_causal=True))


def test_a_sequence_first_input_is_named_as_a_possible_cause_with_the_batch_first_remedy():
    """Trial r16b: the message named only samples mixed in the batch and offered to keep the pipeline for
    gradient-accumulation semantics, while the microbatches cut every sequence (dim 0 is the time axis)."""
    torch.manual_seed(0)
    src = torch.randint(0, 20, (8, 4), generator=torch.Generator().manual_seed(1))
    found = microbatch_mixing(SequenceFirstLM(), (src,), {}, 2)
    assert found is not None, found
    assert "sequence-first input" in found[1] and "inputs passed batch-first" in found[1], found[1]


def test_a_microbatch_that_counts_no_item_is_no_false_alarm():
    """Round 22 (r22b): a per-sample loss whose first microbatch counts no item (every mask entry 0, every label
    -100; weight n_j / N = 0, its mean 0/0 = NaN) is what the pipeline adds as exactly 0 (`runtime.pipeline.
    weighted_loss`), and one device's loss of the whole batch equals the others' weighted sum. The check combined
    NaN x 0 = NaN and warned "the loss mixes the samples of the batch ... give nan (|difference| 0)" on a right
    plan (the model's own masked mean and a cross-entropy loss_fn alike, pp=2 with 2 microbatches)."""
    from parallelizer.tracer.microbatch_check import loss_fn_mixing

    torch.manual_seed(0)
    x = torch.randn(8, 5, 6, generator=torch.Generator().manual_seed(1))
    mask = torch.zeros(8, 5)
    for i, n in enumerate((0, 0, 0, 0, 5, 1, 4, 5)):  # microbatch 0 (rows 0-3) counts nothing, microbatch 1: 15
        mask[i, :n] = 1
    model = InBatch("mask")
    with torch.no_grad():
        assert torch.isfinite(model(x, mask)) and torch.isnan(model(x[:4], mask[:4]))  # independently: 0/0 alone
    assert microbatch_mixing(model, (x, mask), {}, 2, torch.tensor([0.0, 1.0])) is None
    g = torch.Generator().manual_seed(0)
    logits, labels = torch.randn(8, 5, 7, generator=g), torch.randint(0, 7, (8, 5), generator=g)
    labels[:4] = -100
    ce = (lambda out, y: F.cross_entropy(out[0].flatten(0, 1), y.flatten()))
    n = (labels != -100).sum()
    assert loss_fn_mixing(ce, [logits], [True], labels, lambda y: (y != -100).sum() / n, 2) is None
    clip = InBatch("clip")  # a loss that does mix the samples is still found beside an empty microbatch
    assert microbatch_mixing(clip, (x, mask), {}, 2, torch.tensor([0.0, 1.0]))[0] == "the model's loss"
