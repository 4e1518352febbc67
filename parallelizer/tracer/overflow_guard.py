"""Training-time overflow guards traced as the clamp they guard.

Sixteen transformers model families (DETR, Conditional DETR, Deformable DETR, Table Transformer, RT-DETR v1 / v2,
D-FINE, DEIMv2, Grounding DINO, MM-Grounding-DINO, OmDet-Turbo, OneFormer, Mask2Former, PP-DocLayout v2-v4; transformers
5.24) end an encoder layer with

    if self.training:
        if not torch.isfinite(hidden_states).all():
            clamp_value = torch.finfo(hidden_states.dtype).max - 1000
            hidden_states = torch.clamp(hidden_states, min=-clamp_value, max=clamp_value)

a Python branch on a tensor value, which torch.export cannot trace: every such model was refused in training
mode (a TraceError at the `if`). For a dtype whose largest finite value minus 1000 rounds back to that value
(float32, bfloat16, float64: the spacing of floats there is far above 1000), the clamp is the identity on finite
values (values and gradient) and maps +-inf to +-max, NaN to NaN, which is what the branch does in both of its
arms. So the branch equals its unconditional clamp, and the model is traced with it (noted). float16 (max 65504:
the clamp would change finite values above 64504) and any other form of guard stay refused.
"""
from __future__ import annotations

import contextlib
import linecache
import re

import torch

_IF = re.compile(r"^(\s*)if not torch\.isfinite\((\w+)\)\.all\(\):\s*(#.*)?$")
_BODY = (r"^{indent}\s+clamp_value = torch\.finfo\({name}\.dtype\)\.max - 1000\s*$",
         r"^{indent}\s+{name} = torch\.clamp\({name}, min=-clamp_value, max=clamp_value\)\s*$")


def _guarded_name(filename: str, lineno: int) -> str | None:
    """The tensor name of an overflow guard at `filename:lineno` (the `if` line followed by exactly the two
    lines of its clamp, as transformers writes it), else None."""
    m = _IF.match(linecache.getline(filename, lineno).rstrip("\n"))
    if m is None:
        return None
    indent, name = m.group(1), m.group(2)
    body = [linecache.getline(filename, lineno + k).rstrip("\n") for k in (1, 2)]
    if all(re.match(p.format(indent=re.escape(indent), name=name), line) for p, line in zip(_BODY, body)):
        return name
    return None


def clamp_is_identity_on_finite(dtype: torch.dtype) -> bool:
    """Whether clamping to +-(finfo(dtype).max - 1000) leaves every finite value of `dtype` as it is."""
    if not dtype.is_floating_point:
        return False
    big = torch.finfo(dtype).max
    return float(torch.tensor(big - 1000, dtype=torch.float64).to(dtype)) == big


@contextlib.contextmanager
def overflow_guards_as_clamps(notes: list[str]):
    """Inside, `bool()` of the condition of a recognised overflow guard (`_guarded_name`) on a tensor of a dtype
    where its clamp is the identity on finite values answers False ("not all finite"), so the traced program
    takes the clamp unconditionally: the same values as either arm (module docstring). Noted with the sites."""
    original = torch.Tensor.__bool__
    sites: dict[tuple[str, int], str] = {}

    def __bool__(self):
        import sys
        frame = sys._getframe(1)
        key = (frame.f_code.co_filename, frame.f_lineno)
        name = _guarded_name(*key)
        guarded = frame.f_locals.get(name) if name else None
        if isinstance(guarded, torch.Tensor) and self.dtype == torch.bool and self.numel() == 1 and \
                clamp_is_identity_on_finite(guarded.dtype):
            sites[key] = name
            return False
        return original(self)

    torch.Tensor.__bool__ = __bool__
    try:
        yield
    finally:
        torch.Tensor.__bool__ = original
    if sites:
        where = ", ".join(f"{f.rsplit('/', 1)[-1]}:{n}" for f, n in sorted(sites))
        notes.append(f"traced {len(sites)} training-time overflow guard(s) `if not torch.isfinite(x).all(): x = "
                     f"torch.clamp(x, +-(finfo.max - 1000))` as the clamp alone ({where}): the same values and "
                     "gradients in either arm at this dtype (the identity on finite values, +-inf to +-max)")
