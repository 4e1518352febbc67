"""Finding 4: `as_strided` reads its input's STORAGE; the sharded program re-materialises values (a gathered
activation is a fresh tensor), so:
- `h.transpose(1, 2).as_strided(size, strides into h's memory)` gave outputs off by 2.1 on EVERY mesh (ddp,
  fsdp, tp=2, tp=3, dp x tp): silent in training;
- `h[:, 1:].as_strided(...)` raised torch's setStorage RuntimeError on every rank.
Now the tracer rewrites as_strided to read values (clone, or scatter at the traced storage positions), and
refuses (TraceError) an as_strided that reads memory outside its input's elements.
Run: PYTHONPATH=$PWD python trial/finding4_as_strided_storage.py"""
import contextlib
import io

import parallelizer
from parallelizer.runtime.rehearsal import rehearse
from trial.models import m_as_strided_off, m_as_strided_off2, m_as_strided_t

if __name__ == "__main__":
    for fn in (m_as_strided_t, m_as_strided_off, m_as_strided_off2):
        model, inputs = fn()
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                plan = parallelizer.plan(parallelizer.trace(model, inputs), {"dp": 2}, axis_roles={"dp": "ddp"})
            print(fn.__name__, rehearse(fn, {}, plan))
        except Exception as e:  # noqa: BLE001
            print(fn.__name__, "ERROR", type(e).__name__, str(e)[-400:])
