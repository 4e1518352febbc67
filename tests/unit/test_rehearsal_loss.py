"""The rehearsal's fallback loss (`runtime.rehearsal._loss`, used by pipeline rehearsals too) must make every
gradient before the output measurable: the plain mean of squares of a LayerNorm output at its initial weights
is ~1 whatever came before it (trial 10f: YolosModel's true gradients before its final norm were <= 1.8e-4,
below float32 rounding, so a wrong gradient there compared as a match)."""
import torch
from torch import nn

from parallelizer.runtime.rehearsal import _loss


def _normed():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16)), torch.randn(6, 5, 8)


def test_the_gradient_before_a_layer_norm_output_is_far_above_rounding():
    model, x = _normed()
    plain = torch.autograd.grad(model(x).pow(2).mean(), model[0].weight)[0]
    weighted = torch.autograd.grad(_loss(model(x)), model[0].weight)[0]
    assert plain.abs().max() < 1e-4  # the blind spot: the plain mean of squares is flat in the linear's weight
    assert weighted.abs().max() > 1e-2


def test_the_loss_of_a_batch_is_the_mean_of_its_equal_microbatches_losses():
    """Weights depend on the last-dim index only: pipelines average equal microbatches' losses."""
    model, x = _normed()
    out = model(x)
    torch.testing.assert_close(_loss(out), torch.stack([_loss(out[:3]), _loss(out[3:])]).mean())
    assert _loss(torch.tensor(2.5)) == 2.5  # a scalar first output is the model's own loss
