"""A fast version of benchmarks/bench_models.py (issue 12): three catalog models, one of them a transformers
family with its default config (cache on), planned with forced roles and rehearsed on 2 gloo ranks against
one device; `rehearse` takes the Plans that `parallelizer.plan` returns (item 13)."""
import contextlib
import io

import pytest

import parallelizer
from parallelizer.runtime.rehearsal import rehearse_many
from parallelizer.zoo import catalog

pytestmark = pytest.mark.distributed

SMOKE = ("llama", "constants", "dict_inputs")  # default-config LLM, constants made in forward, dict/scalar inputs


def test_catalog_models_match_one_device_on_dp2():
    plans = []
    for name in SMOKE:
        traced = parallelizer.trace(*catalog.build(name))
        with contextlib.redirect_stdout(io.StringIO()):  # the solver library prints a banner
            plans.append(parallelizer.plan(traced, {"dp": 2}, axis_roles={"dp": "ddp"}))
    reports = rehearse_many([(catalog.build, {"name": n}, p) for n, p in zip(SMOKE, plans)], steps=2)
    for name, report in zip(SMOKE, reports):
        assert report.matches(), (name, str(report))  # outputs, loss, grads, params within 1e-5 of eager
        assert report.collectives.get("grad_all_reduce"), (name, report.collectives)  # really data parallel
