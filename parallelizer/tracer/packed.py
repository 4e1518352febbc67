"""Packed sequences (`torch.nn.utils.rnn.PackedSequence`, made by `pack_padded_sequence` / `pack_sequence`) met
while tracing: one TraceError for every way they fail.

A PackedSequence carries `batch_sizes`, a tensor computed from the lengths' VALUES, and an RNN given one runs
`batch_sizes[t]` rows at step t, so every shape of the packed run depends on values. torch.export fails on it in
three places, each of which gave a cause and remedy that did not fit (round 23, r23f: LSTM / GRU, bidirectional,
2 layers, `enforce_sorted` either way): an RNN called without h0 builds `torch.zeros(..., batch_sizes[0], ...)`
("type must be tuple of ints, but got FakeTensor": "takes another path when traced ... masking_utils"); with h0
`_VF.lstm` reads the batch sizes ("change the module's configuration, e.g. BatchNorm's momentum"); packing alone
exports `aten._pack_padded_sequence` with an output of unbacked size ("x[mask] / nonzero"). `packed_sequence_error`
is the one message; `in_failure` (an export failure) and `is_pack_node` (a node of the exported graph) find it.
"""
from __future__ import annotations

import os

import torch
from torch.nn.utils.rnn import PackedSequence

from ..errors import TraceError

_RNN_UTILS = os.path.join(os.path.dirname(torch.__file__), "nn", "utils", "rnn.py")
_PACK_OPS = ("_pack_padded_sequence",)

REMEDY = (
    "run the RNN on the padded batch (fixed shapes; dim 0 the batch with batch_first=True) and mask what the "
    "lengths leave out: out.masked_fill(pad.unsqueeze(-1), 0) for the outputs, out.gather(1, (lengths - 1)"
    ".view(-1, 1, 1).expand(-1, 1, out.shape[-1])) for each sequence's last output. A forward-direction RNN then "
    "computes what the packed one does at every kept step; a bidirectional one's reverse direction would start in "
    "the padding, so run it as a second unidirectional RNN over each sequence reversed within its length: "
    "idx = (lengths[:, None] - 1 - torch.arange(T)) % T, rev = x.gather(1, idx[..., None].expand_as(x)), and "
    "reverse its output with the same gather (idx maps each kept step to its mirror and back). Or bucket the "
    "batch so that every sequence has the same length")


def packed_sequence_error(location: str | None, detail: str = "") -> TraceError:
    """The TraceError of a packed sequence in forward, at `location` ("file:line" of the user's call)."""
    return TraceError(
        "a packed sequence (torch.nn.utils.rnn.pack_padded_sequence / pack_sequence -> PackedSequence): its "
        "batch_sizes are computed from the lengths' values, so every shape of the packed RNN run depends on "
        "tensor values", location, REMEDY, detail=detail)


def in_failure(exc: BaseException) -> bool:
    """True when an export failure passed through torch's packing functions or a frame holding a PackedSequence
    (an RNN's forward given one)."""
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_filename == _RNN_UTILS:
            return True
        if any(isinstance(v, PackedSequence) for v in frame.f_locals.values()):
            return True
        tb = tb.tb_next
    return False


def is_pack_node(node: torch.fx.Node) -> bool:
    """True for an exported node that packs a padded batch (`aten._pack_padded_sequence`)."""
    return any(op in str(node.target) for op in _PACK_OPS)
