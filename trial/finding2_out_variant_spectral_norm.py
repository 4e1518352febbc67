"""Finding 2: `nn.utils.spectral_norm` (and `parametrizations.spectral_norm`) could not be planned on any mesh:
its power iteration writes the u / v buffers with `F.normalize(..., out=u)`, exported as `aten.div.out`, and
strategy enumeration counted the `out` keyword as an input: a bare `IndexError: tuple index out of range`.
Run: PYTHONPATH=$PWD python trial/finding2_out_variant_spectral_norm.py"""
import contextlib
import io

import parallelizer
from parallelizer.runtime.rehearsal import rehearse
from trial.models import spectral_new, spectral_old

if __name__ == "__main__":
    for fn in (spectral_old, spectral_new):
        model, inputs = fn()
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                plan = parallelizer.plan(parallelizer.trace(model, inputs), {"tp": 2}, axis_roles={"tp": "tp"})
            print(fn.__name__, rehearse(fn, {}, plan))
        except Exception as e:  # noqa: BLE001
            print(fn.__name__, "ERROR", type(e).__name__, str(e)[-300:])
