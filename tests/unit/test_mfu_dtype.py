"""The peak a pipeline plan's MFU is reported against (`planner.costs.mfu_dtype`; round 12, trial r12a): it was
looked up by the dtype of the largest tensor of the model's state, buffers included, so a pipeline plan of a
model whose largest tensor is an FNO's complex spectral weight or a bool causal-mask buffer raised a raw
KeyError (torch.complex64 / torch.bool) from `parallelizer.plan` after the whole search had run. Round 18: the
traced dtype decided, not the priced one: an fp32-traced model planned in bf16 (the GPU presets' default)
reported its MFU against the fp32 peak (Llama-2-7B on h100:8x8: "671.7% MFU")."""
import contextlib
import io

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import parallelizer
from cost_model.topology import get_cluster

D = 8


class _Spectral(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(D, D, 4, dtype=torch.cfloat) / 8)  # the largest tensor: 256 complex
        self.lin = nn.Linear(D, D)

    def forward(self, h):  # (B, L, D)
        xf = torch.fft.rfft(h.transpose(1, 2), dim=-1)[..., :4]
        y = torch.fft.irfft(torch.einsum("bim,iom->bom", xf, self.w), n=h.shape[1], dim=-1)
        return h + F.gelu(y.transpose(1, 2) + self.lin(h))


class _Masked(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(D, D)
        self.register_buffer("causal", torch.tril(torch.ones(32, 32, dtype=torch.bool)))  # 1024 bools

    def forward(self, h):
        T = h.shape[1]
        s = (h @ h.transpose(-2, -1)).masked_fill(~self.causal[:T, :T], -1e4)
        return h + self.lin(torch.softmax(s, -1) @ h)


class _Stack(nn.Module):
    def __init__(self, block):
        super().__init__()
        self.inp, self.head = nn.Linear(3, D), nn.Linear(D, 1)
        self.blocks = nn.ModuleList(block() for _ in range(4))

    def forward(self, x, y):
        h = self.inp(x)
        for b in self.blocks:
            h = b(h)
        return F.mse_loss(self.head(h).squeeze(-1), y)


def _traced(block, dtype=torch.float32):
    torch.manual_seed(0)
    model = _Stack(block).to(dtype) if dtype != torch.float32 else _Stack(block)
    x, y = torch.randn(2, 10, 3, dtype=dtype), torch.randn(2, 10, dtype=dtype)
    return parallelizer.trace(model, (x, y))


def test_the_mfu_dtype_is_a_trained_parameters_real_dtype():
    from parallelizer.planner.costs import mfu_dtype

    device = get_cluster("h100:1x4").device
    assert mfu_dtype(_traced(_Spectral), device, "fp32") == torch.float32     # complex64 -> its real dtype
    assert mfu_dtype(_traced(_Spectral), device, "bf16") == torch.float32     # complex is not priced as bf16
    assert mfu_dtype(_traced(_Masked), device, "fp32") == torch.float32       # the bool buffer is not computed with
    assert mfu_dtype(_traced(_Masked, torch.bfloat16), device, None) == torch.bfloat16


def test_the_mfu_dtype_is_the_priced_precision():
    from parallelizer.planner.costs import mfu_dtype

    device = get_cluster("h100:1x4").device
    assert mfu_dtype(_traced(_Masked), device, "bf16") == torch.bfloat16
    assert mfu_dtype(_traced(_Masked), device, None) == torch.bfloat16       # a GPU preset's default: bf16


@pytest.mark.parametrize("precision, peak_dtype", [(None, torch.bfloat16), ("fp32", torch.float32)])
def test_a_pipeline_plans_mfu_is_against_the_peak_it_was_priced_at(precision, peak_dtype):
    """MFU = model FLOPs per step / (step x devices x peak) (Chowdhery et al. 2022, App. B), with the peak of
    the precision the step was priced in: an fp32-traced model planned with the GPU default (bf16)."""
    with contextlib.redirect_stdout(io.StringIO()):
        plan = parallelizer.plan(_traced(_Masked), {"pp": 2, "dp": 2}, schedule="1f1b", microbatches=2,
                                 axis_roles={"dp": "ddp"}, cluster="h100:1x4", precision=precision)
    found = plan.model["search"]
    peak = get_cluster("h100:1x4").device.peak_flops_per_s[peak_dtype]
    assert found["peak_flops_per_s"] == peak
    assert found["mfu"] == pytest.approx(found["tflops_per_device"] * 1e12 / peak, rel=1e-12)
    assert 0 < found["mfu"] < 1


@pytest.mark.parametrize("block", [_Spectral, _Masked])
def test_a_pipeline_plan_of_such_a_model_reports_its_mfu(block):
    with contextlib.redirect_stdout(io.StringIO()):
        plan = parallelizer.plan(_traced(block), {"pp": 2, "dp": 2}, schedule="1f1b", microbatches=2,
                                 axis_roles={"dp": "ddp"}, cluster="h100:1x4")
    assert plan.pipeline.pp == 2 and plan.pipeline.schedule == "1f1b"  # before: KeyError from plan()
