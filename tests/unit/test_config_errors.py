"""Options outside their values raise `ConfigError` (a ParallelizerError and a ValueError), as README section 7
promises of every error (round 18, new-user trial: `axis_roles={"dp": "zero3"}` raised a builtins ValueError).
One case per place options are checked: PlanConfig's fields, the mesh parser, the cluster string (cost_model's
own ValueError, re-raised at the planner's boundary), and `parallelizer.plan`'s own arguments."""
import contextlib
import io

import pytest
import torch
from torch import nn

import parallelizer
from parallelizer import ConfigError, ParallelizerError
from parallelizer.config import PlanConfig
from parallelizer.core.mesh import MeshSpec


@pytest.fixture(scope="module")
def traced():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
    return parallelizer.trace(model, (torch.randn(4, 8),))


@pytest.mark.parametrize("kwargs, names", [
    ({"axis_roles": {"dp": "zero3"}}, "zero3"),
    ({"precision": "fp8"}, "fp8"),
    ({"optimizer": "lion"}, "lion"),
    ({"solver": "gurobi"}, "gurobi"),
    ({"recompute": "sometimes"}, "sometimes"),
])
def test_a_plan_config_option_outside_its_values(kwargs, names):
    with pytest.raises(ConfigError, match=names) as info:
        PlanConfig(**kwargs)
    assert isinstance(info.value, ParallelizerError) and isinstance(info.value, ValueError)


@pytest.mark.parametrize("mesh", ["dp2", "dp=2,dp=2", "dp=two"])
def test_a_malformed_mesh(mesh):
    with pytest.raises(ConfigError, match="mesh"):
        MeshSpec.of(mesh)


def test_a_malformed_cluster_names_the_option(traced):
    with pytest.raises(ConfigError, match="cluster='h100:3y'"):
        parallelizer.plan(traced, {"dp": 2}, cluster="h100:3y")


def test_plan_arguments_that_do_not_fit_the_traced_graph(traced):
    with contextlib.redirect_stdout(io.StringIO()):
        with pytest.raises(ConfigError, match="zero1='zz'"):
            parallelizer.plan(traced, {"dp": 2}, zero1="zz")
        with pytest.raises(ConfigError, match="global_batch=6"):
            parallelizer.plan(traced, None, global_batch=6)
