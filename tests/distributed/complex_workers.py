"""Models with complex parameters and the rank body of tests/distributed/test_complex_clipping.py (importable by
spawned ranks). Found by trial r12a (round 12, public reports of silent wrong numbers): complex values went
through `.double()` (real part only) in the global gradient norm, and through gloo's all-to-all (no complex
types); see `parallelizer.tracer.graph.as_real`."""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

import parallelizer
from parallelizer.runtime import create_groups
from parallelizer.rewriter.spec import all_axis_groups
from parallelizer.runtime.module import ParallelModule
from parallelizer.tracer.trace import trace

WIDTH, MODES = 8, 3


class SpectralConv(nn.Module):
    """An FNO layer in small (Li et al., Fourier Neural Operator, arXiv:2010.08895; physicsnemo's SpectralConv1d):
    rfft along the length, the lowest MODES frequencies mixed by a complex (cfloat) weight, irfft back, then a
    Linear. `complex_first`: the complex weight is registered before the real ones (torch's and our clip then
    see a complex gradient first)."""

    def __init__(self, complex_first: bool = True) -> None:
        super().__init__()
        spectral = nn.Parameter(torch.randn(WIDTH, WIDTH, MODES, dtype=torch.cfloat) / 4)
        if complex_first:
            self.w = spectral
        self.lin = nn.Linear(WIDTH, WIDTH)
        self.temperature = nn.Parameter(torch.tensor(0.5))
        if not complex_first:
            self.w = spectral

    def forward(self, x):  # (B, WIDTH, L)
        xf = torch.fft.rfft(x, dim=-1)[..., :MODES]  # (B, WIDTH, MODES) complex
        y = torch.fft.irfft(torch.einsum("bim,iom->bom", xf, self.w), n=x.shape[-1], dim=-1)
        return self.lin((F.gelu(y) * self.temperature.exp()).transpose(1, 2))  # (B, L, WIDTH)


def spectral(complex_first: bool = True, batch: int = 4):
    """(SpectralConv, (x (batch, WIDTH, 10),)), seeded."""
    torch.manual_seed(0)
    x = torch.randn(batch, WIDTH, 10, generator=torch.Generator().manual_seed(1))
    return SpectralConv(complex_first), (x,)


def _real(t: torch.Tensor) -> torch.Tensor:
    return torch.view_as_real(t).double() if t.is_complex() else t.double()


def clipped_training(rank: int, world_size: int, specs: dict) -> dict:
    """Per (spec name, complex_first): 3 SGD steps (lr 0.5) with the gradients clipped to a global norm of 0.05,
    alternately by torch's `clip_grad_norm_(pm.parameters())` (2-norm) and `pm.clip_grad_norm_` (inf-norm), on
    the ParallelModule and on the eager model: the norms each returned, the largest difference of the full
    parameters after the steps (real and imaginary parts), and the norm's dtype."""
    out = {}
    for key, spec in specs.items():
        try:
            out[key] = _clipped(rank, key[1], spec)
        except Exception as err:  # the same error on every rank (after the norm's collectives): recorded per case
            out[key] = {"error": f"{type(err).__name__}: {err}"}
    return out


def _clipped(rank: int, complex_first: bool, spec) -> dict:
    """One case of `clipped_training`."""
    model, (x,) = spectral(complex_first)
    reference = copy.deepcopy(model)
    create_groups(all_axis_groups(spec.mesh))
    pm = ParallelModule(trace(model, (x,)), spec, rank, model)
    opts = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (pm, reference)]
    norms = []
    for step in range(3):
        pair = []
        for m, opt in zip((pm, reference), opts):
            m(x).pow(2).mean().mul(100).backward()
            if step % 2 == 0:
                total = torch.nn.utils.clip_grad_norm_(m.parameters(), 0.05)
            elif m is pm:
                total = pm.clip_grad_norm_(0.05, float("inf"))
            else:
                total = torch.nn.utils.clip_grad_norm_(m.parameters(), 0.05, float("inf"))
            opt.step()
            opt.zero_grad()
            pair.append((total.item(), str(total.dtype)))
        norms.append(pair)
    full, eager = pm.full_state_dict(), reference.state_dict()
    return {"norms": norms, "params": max((_real(full[k]) - _real(eager[k])).abs().max().item() for k in eager)}


def imaginary_replicas(rank: int, world_size: int) -> str:
    """`check_same_weights` on a model whose complex weight differs between the ranks only in an imaginary part
    (as a rank seeded otherwise would build it): the PlanMismatchError's message, or "" when none was raised
    (before `as_real`, the float64 digest kept only real parts and saw no difference)."""
    from parallelizer.errors import PlanMismatchError
    from parallelizer.runtime.replicas import check_same_weights

    model, _ = spectral()
    with torch.no_grad():
        model.w.imag[0, 0, 0] += rank
    try:
        check_same_weights(model)
    except PlanMismatchError as err:
        return str(err)
    return ""
