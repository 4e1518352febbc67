"""nn.TransformerEncoder's nested-tensor fast path, which only an eager call can take: noted and warned.

In eval mode, with `enable_nested_tensor=True` (the default; torch turns it off for `norm_first` layers and others,
`use_nested_tensor`), a `src_key_padding_mask` and no `mask`, and under `torch.no_grad()` (or with no parameter
requiring grad), torch runs the encoder on a nested tensor of the kept positions and pads the result with 0:
the output at padded positions is 0. On every other path (training, eval with grad enabled, and any traced
program: torch.export takes the regular path even under no_grad) those positions hold the layers' values; kept
positions agree (round 23, r23f: `pm.eval()` outputs of a batch-first encoder 3.1 apart from the model's own
under no_grad, only at padded positions; nn.Transformer's decoder output, reading that memory without
memory_key_padding_mask, 0.26 apart everywhere). A traced program is one path, so such a call is noted in
`TracedGraph.notes` and warned with the remedies that make both agree.
"""
from __future__ import annotations

import contextlib
import warnings

import torch.nn as nn

NOTE = ("nn.TransformerEncoder {fqns} called in eval mode with src_key_padding_mask and enable_nested_tensor=True: "
        "under torch.no_grad() torch's eager fast path returns 0 at padded positions, while this program (one path: "
        "the regular one, as in training or with grad enabled) returns the layers' values there; the encoder's kept "
        "positions agree, but what reads its padded positions differs too (nn.Transformer's decoder without "
        "memory_key_padding_mask: every output). To make both the same: mask the padded positions before they are "
        "read (out.masked_fill(pad.unsqueeze(-1), 0); memory_key_padding_mask=pad for a decoder), or turn the path "
        "off (nn.TransformerEncoder(..., enable_nested_tensor=False), or encoder.use_nested_tensor = False, e.g. on "
        "nn.Transformer's .encoder)")


@contextlib.contextmanager
def nested_fast_path_watch(model: nn.Module, notes: list[str]):
    """Inside, calls of the model's nn.TransformerEncoders that torch's nested-tensor fast path would take under
    no_grad (eval mode, `use_nested_tensor`, a key padding mask, no attention mask) are recorded; on exit they
    are noted and warned (`NOTE`)."""
    names = {id(m): name for name, m in model.named_modules() if isinstance(m, nn.TransformerEncoder)}
    original = nn.TransformerEncoder.forward
    found: list[str] = []

    def forward(self, src, mask=None, src_key_padding_mask=None, is_causal=None):
        if (not self.training and getattr(self, "use_nested_tensor", False) and src_key_padding_mask is not None
                and mask is None and id(self) in names):
            found.append(names[id(self)] or "(the model)")
        return original(self, src, mask=mask, src_key_padding_mask=src_key_padding_mask, is_causal=is_causal)

    if names:
        nn.TransformerEncoder.forward = forward
    try:
        yield
    finally:
        nn.TransformerEncoder.forward = original
    if found:
        note = NOTE.format(fqns=", ".join(sorted(set(found))))
        notes.append(note)
        warnings.warn(note, UserWarning, stacklevel=3)
