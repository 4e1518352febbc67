"""Packed sequences in forward (round 23, r23f): every way `pack_padded_sequence` / `pack_sequence` fails under
torch.export is one TraceError naming the packed sequence, the user's line and the padded-and-masked remedy
(before: "takes another path when traced ... masking_utils", "change the module's configuration, e.g.
BatchNorm's momentum", or "x[mask] / nonzero"), and that remedy computes what the packed RNN computes."""
import inspect

import pytest
import torch
import torch.nn as nn
from torch.nn.utils.rnn import pack_padded_sequence, pack_sequence, pad_packed_sequence

import parallelizer
from parallelizer.errors import TraceError


class _Packed(nn.Module):
    """A classifier over packed sequences, the way users write one; `kind` picks the member of the class."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        rnn = nn.GRU if kind == "gru_bi_2l_unsorted" else nn.LSTM
        bi = kind == "gru_bi_2l_unsorted"
        self.rnn = rnn(3, 4, 2 if bi else 1, batch_first=True, bidirectional=bi)

    def forward(self, x, lens):
        if self.kind == "pack_sequence":
            packed = pack_sequence([x[0, :4], x[1, :3]])
        else:
            packed = pack_padded_sequence(x, lens, batch_first=True, enforce_sorted=self.kind != "lstm_h0")
        if self.kind == "data_only":
            return packed.data.sum()
        if self.kind == "lstm_h0":
            out, _ = self.rnn(packed, (x.new_zeros(1, 4, 4), x.new_zeros(1, 4, 4)))
        else:
            out, _ = self.rnn(packed)
        return pad_packed_sequence(out, batch_first=True)[0].sum()


_CALL_LINES = {  # the user's line each member fails at
    "lstm_no_h0": "out, _ = self.rnn(packed)", "gru_bi_2l_unsorted": "out, _ = self.rnn(packed)",
    "lstm_h0": "out, _ = self.rnn(packed, (x.new_zeros", "pack_sequence": "out, _ = self.rnn(packed)",
    "data_only": "packed = pack_padded_sequence(x, lens"}


@pytest.mark.parametrize("kind", list(_CALL_LINES))
def test_a_packed_sequence_is_named_with_the_padded_and_masked_remedy_at_the_users_line(kind):
    lines, start = inspect.getsourcelines(_Packed.forward)
    line = start + next(i for i, text in enumerate(lines) if _CALL_LINES[kind] in text)
    with pytest.raises(TraceError, match="packed sequence") as err:
        parallelizer.trace(_Packed(kind), (torch.randn(4, 4, 3), torch.tensor([4, 3, 2, 1])))
    assert err.value.location == f"{__file__}:{line}"
    assert "masked_fill" in err.value.remedy and "reversed within its length" in err.value.remedy


class _PaddedBiGRU(nn.Module):
    """The remedy written out: a bidirectional GRU as two unidirectional ones on the padded batch, the reverse
    one over each sequence reversed within its length (idx = (lengths - 1 - t) % T) and reversed back."""

    def __init__(self):
        super().__init__()
        self.fwd, self.bwd = nn.GRU(3, 4, batch_first=True), nn.GRU(3, 4, batch_first=True)

    def forward(self, x, lens, pad):  # x (B, T, 3), lens (B,), pad (B, T) True past the length
        T = x.shape[1]
        idx = (lens[:, None] - 1 - torch.arange(T, device=x.device)) % T  # (B, T)
        rev = x.gather(1, idx[..., None].expand_as(x))
        out_f, _ = self.fwd(x)
        out_b, _ = self.bwd(rev)
        out_b = out_b.gather(1, idx[..., None].expand_as(out_b))
        return torch.cat([out_f, out_b], -1).masked_fill(pad[..., None], 0.0)  # (B, T, 8)


def test_the_remedy_computes_what_the_packed_bidirectional_rnn_computes_and_traces():
    torch.manual_seed(0)
    packed_rnn = nn.GRU(3, 4, batch_first=True, bidirectional=True)
    model = _PaddedBiGRU()
    with torch.no_grad():
        for name in ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"):
            getattr(model.fwd, name).copy_(getattr(packed_rnn, name))
            getattr(model.bwd, name).copy_(getattr(packed_rnn, name + "_reverse"))
    x, lens = torch.randn(4, 5, 3), torch.tensor([5, 2, 4, 1])
    pad = torch.arange(5)[None, :] >= lens[:, None]
    ref, _ = pad_packed_sequence(packed_rnn(pack_padded_sequence(x, lens, batch_first=True,
                                                                 enforce_sorted=False))[0], batch_first=True)
    out = model(x, lens, pad)
    torch.testing.assert_close(out, ref)
    weights = torch.randn_like(ref)
    g_ref = torch.autograd.grad((ref * weights).sum(), [packed_rnn.weight_hh_l0, packed_rnn.weight_hh_l0_reverse])
    g_out = torch.autograd.grad((out * weights).sum(), [model.fwd.weight_hh_l0, model.bwd.weight_hh_l0])
    for a, b in zip(g_out, g_ref):
        torch.testing.assert_close(a, b)
    parallelizer.trace(model, (x, lens, pad))  # fixed shapes: traces
