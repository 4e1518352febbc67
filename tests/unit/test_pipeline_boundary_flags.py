"""The gradient flags of a pipeline boundary's send and receive buffers agree (found in trial3a).

torch's stages allocate gradient buffers from the `requires_grad` flags of `output_args` (sender) and
`input_args` (receiver). A float model input used after the first stage (a float loss mask, passed through) was
flagged as grad-carrying on the send side only (`_sent_layouts` lists it, the receiver's `stage_spec.inputs`
leaves model inputs out), so the previous stage waited for a 64-byte mask gradient and got the 1024-byte
activation gradient: gloo aborted rank 0 (SIGABRT, "1024 vs 64") with no report (trial/pipeline_float_input.py,
pp=2 1f1b; after the fix it matches one device, loss 1.2e-07)."""
import contextlib
import io

import torch
import torch.nn.functional as F
from torch import nn

import parallelizer
from parallelizer.rewriter.spec import spec_from_plan
from parallelizer.runtime.pipeline import _examples, _sent_layouts, cut_stages, stage_spec

V, H, T, B = 32, 16, 8, 2


class MaskedLossNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb, self.head = nn.Embedding(V, H), nn.Linear(H, V)
        self.blocks = nn.ModuleList([nn.Linear(H, H) for _ in range(2)])

    def forward(self, ids, mask, labels):
        h = self.emb(ids)
        for b in self.blocks:
            h = h + torch.tanh(b(h))
        ce = F.cross_entropy(self.head(h).flatten(0, 1), labels.flatten(), reduction="none")
        return (ce * mask.flatten()).sum() / mask.sum()


def test_a_float_model_input_crossing_a_boundary_has_the_same_grad_flag_on_both_sides():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    inputs = (torch.randint(0, V, (B, T), generator=g), torch.ones(B, T), torch.randint(0, V, (B, T), generator=g))
    traced = parallelizer.trace(MaskedLossNet(), inputs)
    with contextlib.redirect_stdout(io.StringIO()):
        spec = spec_from_plan(parallelizer.plan(traced, {"dp": 1}))
    cut = cut_stages(traced, 2)
    assert "mask" in cut.outputs[0]  # the float mask is passed through to the last stage
    sender, receiver = stage_spec(spec, traced, cut, 0, 0), stage_spec(spec, traced, cut, 1, 1)
    sent = _examples(traced, cut.outputs[0], _sent_layouts(sender, cut.outputs[0]), spec, 0)
    received = _examples(traced, cut.inputs[1], receiver.inputs, spec, 0)
    assert cut.outputs[0] == cut.inputs[1]
    flags = {n: (s.requires_grad, r.requires_grad) for n, s, r in zip(cut.outputs[0], sent, received)}
    assert all(s == r for s, r in flags.values()), flags
    assert flags["mask"] == (False, False)  # a model input carries no gradient
    assert any(s for s, _ in flags.values())  # the activation does
