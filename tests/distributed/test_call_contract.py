"""Calls a user's loop makes, on 2 gloo ranks (tp=2) against eager (DESIGN.md rule 10):

- a model traced as `model(x)` ran forward with its defaults, so `pm(x, mask=None)`, `pm(x, scale=1.0)` and
  `pm(x, None, 1.0)` compute the traced function: they now run and equal eager (before: TypeError "unexpected
  keyword(s)"); another value (`scale=2.0`, `scale=1` for a float default, a mask tensor) is a TypeError naming the
  input, both values and the remedy (`example_kwargs=`);
- `torch.save(pm)` / `pickle.dumps(pm)` raise UnsupportedOpError naming the remedies (before: pickle's "Can't pickle
  <class 'torch.nn.modules.linear.Linear'>: it's not the same object"); the whole-model recipe it names
  (`torch.save` inside `pm.full_model()`) loads and equals eager.
"""
import contextlib
import io

import pytest

import parallelizer
from parallelizer.rewriter.spec import spec_from_plan
from parallelizer.runtime import spawn
from call_workers import defaults, explicit_defaults_and_pickling

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def ranks():
    model, inputs = defaults()
    with contextlib.redirect_stdout(io.StringIO()):  # the solver library prints a banner
        spec = spec_from_plan(parallelizer.plan(parallelizer.trace(model, inputs), {"tp": 2}, axis_roles={"tp": "tp"}))
    return spawn(explicit_defaults_and_pickling, 2, spec, timeout_s=300)


def test_defaults_passed_explicitly_run_the_traced_program(ranks):
    for r in ranks:
        for name in ("mask=None", "scale=1.0", "return_hidden=False", "positional None, 1.0"):
            assert isinstance(r[name], float) and r[name] < 1e-5, (name, r[name])


def test_other_values_of_untraced_inputs_name_the_input_and_the_remedy(ranks):
    for r in ranks:
        # InputMismatchError is a TypeError (round 15, r15f: a typed error of its own)
        assert r["scale=2.0"].startswith("InputMismatchError: input 'scale' = 2.0 was not passed when the model "
                                         "was traced")
        assert "default scale=1.0" in r["scale=2.0"] and "example_kwargs={'scale': 2.0}" in r["scale=2.0"]
        assert "input 'scale' = 1 " in r["scale=1"]
        assert "input 'mask' = a tensor of shape (4, 32)" in r["mask tensor"] and "default mask=None" in r["mask tensor"]


def test_pickling_pm_is_refused_with_remedies_and_the_full_model_recipe_works(ranks):
    for r in ranks:
        for key in ("torch.save", "pickle"):
            assert r[key].startswith("UnsupportedOpError: torch.save / pickle of a ParallelModule"), r[key]
            assert "parallelizer.checkpoint.save" in r[key] and "pm.full_model()" in r[key]
        assert r["full_model saved"] < 1e-5
