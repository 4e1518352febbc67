"""ZeRO-1 in the planner (`PlanConfig.zero1`): the optimizer state of parameters replicated over a data-parallel
axis is priced as one rank's 1/N share, and the broadcast of the stepped parameters (torch's
ZeroRedundancyOptimizer, `runtime/zero1.py`) as an all-gather of each local parameter over that axis, both
against closed forms; the axis runs data parallel; the option is recorded in the plan JSON, shown, given by the
CLI, and refused where it cannot hold."""
import contextlib
import io
import math

import pytest
import torch

import parallelizer
from cost_model.communication import collective_time_s
from cost_model.memory import bytes_per_param
from cost_model.topology import MeshTopology, get_cluster
from parallelizer import cli, zoo
from parallelizer.config import PlanConfig
from parallelizer.errors import InfeasiblePlanError
from parallelizer.plan_io import plan_text
from parallelizer.planner import Plan

MESH = {"dp": 4, "tp": 2}


@pytest.fixture(scope="module")
def gpt():
    model, inputs = zoo.gpt(n_layer=2, n_embd=256, n_head=4, block_size=128, vocab_size=512, batch=8,
                            with_targets=True, device="meta")
    # traced in bf16: every tensor at 2 B, as the budget below was set on (round 25 prices an fp32 model planned in
    # bf16 in autocast's dtypes, where full recomputation fits the plain plan too)
    return parallelizer.trace(model.to(torch.bfloat16), inputs)


def _plan(traced, **options):
    with contextlib.redirect_stdout(io.StringIO()):
        return parallelizer.plan(traced, MESH, cluster="a100:1x8", **options)


@pytest.fixture(scope="module")
def pair(gpt):
    """The same roles (dp data parallel, tp tensor parallel) without and with ZeRO-1 over dp."""
    return (_plan(gpt, axis_roles={"dp": "ddp", "tp": "tp"}),
            _plan(gpt, axis_roles={"tp": "tp"}, zero1="dp"))


def test_zero1_divides_the_optimizer_state_and_prices_the_parameter_broadcast(gpt, pair):
    plain, zero = pair
    assert {f: p.stored for f, p in zero.params.items()} == {f: p.stored for f, p in plain.params.items()}
    for kind in ("params", "grads", "activations", "buffers"):
        assert zero.cost.memory_bytes[kind] == plain.cost.memory_bytes[kind], kind
    p_bytes, _, o_bytes = bytes_per_param(zero.config["precision"], "adamw")
    trained = [(p, math.prod(p.local_shape)) for p in zero.params.values()
               if not p.is_buffer and gpt.parameters[p.fqn].requires_grad]
    assert zero.cost.memory_bytes["optimizer"] == sum(o_bytes * n // 4 for _, n in trained)
    assert plain.cost.memory_bytes["optimizer"] == sum(o_bytes * n for _, n in trained)
    topo = MeshTopology(get_cluster("a100:1x8"), (4, 2), ("dp", "tp"))
    broadcast = sum(collective_time_s("all_gather", n * p_bytes, topo, ("dp",)) + topo.cluster.device.collective_sync_s
                    for _, n in trained)
    assert broadcast > 0
    assert zero.cost.comm_s["all_gather"] - plain.cost.comm_s["all_gather"] == pytest.approx(broadcast, rel=1e-9)
    assert zero.cost.total_s == pytest.approx(zero.solver.objective_s, rel=1e-9)


def test_zero1_fits_a_budget_that_replicated_optimizer_state_does_not(gpt, pair):
    plain, zero = pair
    budget = (plain.cost.memory_bytes["total"] + zero.cost.memory_bytes["total"]) // 2
    with pytest.raises(InfeasiblePlanError):
        _plan(gpt, axis_roles={"dp": "ddp", "tp": "tp"}, memory_budget_bytes=budget)
    fitted = _plan(gpt, axis_roles={"tp": "tp"}, zero1="dp", memory_budget_bytes=budget)
    assert fitted.cost.memory_bytes["total"] <= budget


def test_zero1_is_recorded_shown_and_round_trips(pair, tmp_path):
    plain, zero = pair
    assert "zero1" not in plain.config and zero.config["zero1"] == "dp"  # plans without it: byte-identical
    path = tmp_path / "plan.json"
    zero.save(path)
    assert Plan.load(path).config["zero1"] == "dp"
    assert PlanConfig.from_record(zero.config).zero1 == "dp"
    assert "process_group=pm.process_group('dp')" in plan_text(zero)
    assert "ZeRO-1" not in plan_text(plain)


def test_cli_zero1_flag(tmp_path):
    out = tmp_path / "plan.json"
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli.main(["plan", "--model", "gpt2", "--config", "n_layer=2,n_embd=64,n_head=4,vocab_size=256",
                         "--seq-len", "16", "--mesh", "dp=2", "--global-batch", "4", "--zero1", "dp", "--no-progress",
                         "-o", str(out)]) == 0
    plan = Plan.load(out)
    assert plan.config["zero1"] == "dp" and dict(map(tuple, plan.config["axis_roles"])).get("dp") is None
    assert {p.stored for p in plan.params.values()} == {"R"}  # the zero1 axis runs data parallel


def test_zero1_refused_where_it_cannot_hold(gpt):
    with pytest.raises(ValueError, match="zero1='dp'.*'fsdp' axis already shards"):
        PlanConfig(zero1="dp", axis_roles={"dp": "fsdp"})
    with pytest.raises(ValueError, match="zero1='tp'"):
        PlanConfig(zero1="tp", axis_roles={"tp": "tp"})
    with pytest.raises(ValueError, match="zero1='data' names no axis of mesh"):
        _plan(gpt, zero1="data")


def test_pipeline_search_prices_zero_redundancy_optimizers_broadcast():
    """The pipeline search with zero1 prices the optimizer state / dp (as Megatron's distributed optimizer,
    `plan_pipeline(zero1=True)`); with `PlanConfig.zero1 == "dp"` (the user's path, run by torch's
    ZeroRedundancyOptimizer) the dp sync adds an all-gather of the rank's parameters: more than the distributed
    optimizer's, less than an all-gather of the whole model's parameters."""
    from parallelizer.planner.search import plan_pipeline

    model, inputs = zoo.gpt2(device="meta", n_layer=4, n_embd=256, n_head=4, vocab_size=2048, batch=1, seq_len=128)
    traced = parallelizer.trace(model, inputs)

    def search(zero1, config=None):
        with contextlib.redirect_stdout(io.StringIO()):
            return plan_pipeline(traced, "a100:1x8", global_batch=16, pp=2, tp=1, schedules=("1f1b",),
                                 num_microbatches=4, zero1=zero1, config=config, progress=False)

    plain, megatron, torch_zero = search(False), search(True), search(True, PlanConfig(zero1="dp"))
    assert str(torch_zero.mesh) == "(pp=2, dp=4, tp=1)"
    for a, b in zip(megatron.ranks, plain.ranks):
        assert a.memory_bytes < b.memory_bytes  # optimizer state / 4
    assert [r.memory_bytes for r in torch_zero.ranks] == [r.memory_bytes for r in megatron.ranks]
    extra = torch_zero.step_breakdown_s["dp_grad_sync"] - megatron.step_breakdown_s["dp_grad_sync"]
    topo = MeshTopology(get_cluster("a100:1x8"), (2, 4, 1), ("pp", "dp", "tp"))
    whole = collective_time_s("all_gather", sum(p.numel for p in traced.parameters.values()) * 2, topo, ("dp",))
    assert 0 < extra < whole, (extra, whole)


def test_zero1_on_a_pipeline_mesh_names_its_dp_axis(gpt):
    """A pipeline or searched plan partitions the optimizer state over 'dp' only: zero1='dp' on a mesh without
    dp, or zero1 naming another axis, is refused before planning (it was accepted, and `show` then printed a
    recipe whose process_group('dp') raised, trial r12e)."""
    for mesh, zero1 in (({"pp": 2, "tp": 2}, "dp"), ({"pp": 2, "dp": 2}, "pp"), ({"pp": 2, "dp": 2}, "tp")):
        with pytest.raises(ValueError, match=f"zero1={zero1!r} on mesh"):
            with contextlib.redirect_stdout(io.StringIO()):
                parallelizer.plan(gpt, mesh, cluster="a100:1x8", zero1=zero1, schedule="1f1b", microbatches=2)
