"""Finding 1: an all-gather of uneven shards along a dim > 0 handed back a strided view (the padded buffer,
trimmed with narrow), where the single-device tensor is contiguous. On tp=3 with hidden 16 (shards 6, 6, 4):
- `h.as_strided((B, T, H // 2), (T * H, H, 2))` read the padded buffer: outputs off by ~1.7 (silent mismatch);
- `h.view(B, T * H)` raised torch's "view size is not compatible with input tensor's size and stride".
Run: PYTHONPATH=$PWD python trial/finding1_uneven_gather_strides.py  (prints one line per case)"""
import contextlib
import io

import parallelizer
from parallelizer.runtime.rehearsal import rehearse
from trial.models import m_as_strided, m_merge_view

if __name__ == "__main__":
    for fn in (m_as_strided, m_merge_view):
        model, inputs = fn()
        with contextlib.redirect_stdout(io.StringIO()):
            plan = parallelizer.plan(parallelizer.trace(model, inputs), {"tp": 3}, axis_roles={"tp": "tp"})
        try:
            print(fn.__name__, rehearse(fn, {}, plan))
        except Exception as e:  # noqa: BLE001
            print(fn.__name__, "ERROR", type(e).__name__, str(e)[-400:])
