"""`PlanConfig.axis_roles`: forcing DDP, FSDP/ZeRO-3 or tensor parallelism on a mesh axis, and its errors."""
import contextlib
import io
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import parallelizer
from parallelizer import zoo
from parallelizer.config import PlanConfig
from parallelizer.errors import InfeasiblePlanError
from parallelizer.core import Layout, MeshSpec, Replicate, Shard
from parallelizer.planner import explain, plan
from parallelizer.planner.plan import Plan

R = Replicate()


@pytest.fixture(scope="module")
def bench_graph():
    # weights dominate (batch 64, 17M parameters): left free, the planner would run it replicated
    return parallelizer.trace(*zoo.mlp(in_features=256, dim=1024, hidden=4096, depth=2, batch=64, device="meta"))


@pytest.fixture(scope="module")
def mlp_graph():
    # activations dominate: left free, the planner picks DDP on 4 devices
    return parallelizer.trace(*zoo.mlp(in_features=32, dim=64, hidden=256, depth=2, batch=8192, device="meta"))


def _plan(tg, mesh, **options):
    with contextlib.redirect_stdout(io.StringIO()):
        return plan(tg, mesh, **options)


def _params(p):
    return [q for q in p.params.values() if not q.is_buffer]


def _param_edges(p):
    placeholders = {ph for q in _params(p) for ph in q.placeholders}
    return [e for e in p.edges if e.src in placeholders]


def test_ddp_role_replicates_parameters_and_all_reduces_gradients(mlp_graph):
    p = _plan(mlp_graph, {"dp": 4}, axis_roles={"dp": "ddp"})
    assert {q.stored for q in _params(p)} == {"R"}
    assert p.nodes[mlp_graph.input_names[0]].output == "S(0)"  # the batch is sharded
    # activations are never gathered over dp before the output, so every parameter meets batch shards
    assert all(e.dst_layout == "R" and [s.kind for s in e.steps] == ["grad_all_reduce"] for e in _param_edges(p))
    gathers = [e for e, s in p.steps("all_gather")]
    assert [e.dst for e in gathers] == ["output"]


def test_ddp_role_keeps_the_compute_data_parallel_where_replicating_would_be_cheaper(bench_graph):
    # fp32: the premise (the free optimum replicates everything) holds at fp32 prices; in bf16 the fp32 gradient
    # reduction and the bf16 activations shift that balance (the free plan then mixes in a gradient all-reduce)
    free = _plan(bench_graph, {"dp": 2}, precision="fp32")
    p = _plan(bench_graph, {"dp": 2}, axis_roles={"dp": "ddp"}, precision="fp32")
    assert not free.steps("grad_all_reduce")  # the free optimum gathers the tiny batch and replicates
    assert len(p.steps("grad_all_reduce")) == len(_params(p)) and p.cost.total_s >= free.cost.total_s
    assert all(n.output in ("S(0)", None) for name, n in p.nodes.items() if n.op != "placeholder"
               and name != "output")


def test_fsdp_role_shards_parameters_and_gathers_them_for_use(mlp_graph):
    ddp = _plan(mlp_graph, {"dp": 4}, axis_roles={"dp": "ddp"})
    p = _plan(mlp_graph, {"dp": 4}, axis_roles={"dp": "fsdp"})
    for q in _params(p):  # every parameter whatever its dims: uneven shards (e.g. head.bias 10 -> 3, 3, 3, 1)
        assert q.stored != "R", (q.fqn, q.shape, q.stored)
        d = Layout.parse(q.stored)[0].dim
        assert q.local_shape[d] == -(-q.shape[d] // 4)  # the largest shard, as priced
    for e in _param_edges(p):
        assert e.dst_layout == "R"
        if e.src_layout != "R":  # gathered for use; gradients reduce-scattered (the batch is sharded)
            assert [(s.kind, s.bwd_kind) for s in e.steps] == [("all_gather", "reduce_scatter")]
    assert p.cost.memory_bytes["params"] < ddp.cost.memory_bytes["params"] / 3


def test_tp_role_shards_matmul_weights_used_in_place(mlp_graph):
    p = _plan(mlp_graph, {"tp": 4}, axis_roles={"tp": "tp"})
    assert p.nodes[mlp_graph.input_names[0]].output == "R"  # no data parallelism over tp
    for q in _params(p):
        if len(q.shape) == 2 and any(d % 4 == 0 for d in q.shape):
            assert isinstance(Layout.parse(q.stored)[0], Shard), (q.fqn, q.stored)
    for e in _param_edges(p):
        if e.src_layout != "R":
            assert e.dst_layout == e.src_layout and not e.steps  # used as stored: never gathered
    assert p.config["axis_roles"] == [["tp", "tp"]]


class CumsumWeight(nn.Module):
    """A weight read through an op that takes a single matrix only whole (linalg.inv: its rule shards batch dims,
    and an (8, 8) matrix has none; cummax, used before, got a rule in round 14), so no op can use it sharded."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8))
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return self.lin(x @ torch.linalg.inv(self.w))


def test_tp_role_keeps_a_weight_no_op_can_use_sharded_replicated_and_says_why():
    tg = parallelizer.trace(CumsumWeight(), (torch.randn(4, 8),))
    p = _plan(tg, {"tp": 2}, axis_roles={"tp": "tp"})
    assert p.params["w"].stored == "R"
    assert p.params["lin.weight"].stored in ("S(0)", "S(1)")
    reasons = [f.reason for f in p.fallbacks if "axis role" in f.reason]
    assert len(reasons) == 1 and "aten.linalg_inv.default" in reasons[0] and "w (8, 8)" in reasons[0]
    both = _plan(tg, {"dp": 2, "tp": 2}, axis_roles={"dp": "ddp", "tp": "tp"})
    assert both.params["w"].stored == "RR"  # relaxed over tp only: still Replicate over the ddp axis
    assert both.params["lin.weight"].stored in ("RS(0)", "RS(1)")


def test_roles_are_recorded_validated_and_used_by_explain(mlp_graph, tmp_path):
    p = _plan(mlp_graph, {"dp": 2, "tp": 2}, axis_roles={"dp": "ddp", "tp": "tp"})
    path = tmp_path / "plan.json"
    p.save(path)
    loaded = Plan.load(path)  # schema-validated
    assert loaded.config["axis_roles"] == [["dp", "ddp"], ["tp", "tp"]]
    assert PlanConfig.from_record(loaded.config).axis_roles == (("dp", "ddp"), ("tp", "tp"))
    weight = next(q for q in _params(p) if len(q.shape) == 2).placeholders[0]
    alternatives = explain(mlp_graph, loaded, weight).alternatives
    assert alternatives and all(Layout.parse(a[0].split("-> ")[1])[0] == R for a in alternatives)  # R over dp


def test_role_errors_name_the_field_axis_and_remedy(mlp_graph):
    with pytest.raises(ValueError, match=r"axis_roles\['dp'\]='zero3'.*'ddp', 'fsdp', 'tp'"):
        PlanConfig(axis_roles={"dp": "zero3"})
    with pytest.raises(ValueError, match="contradicts data_axes"):
        PlanConfig(axis_roles={"tp": "tp"}, data_axes=("tp",))
    with pytest.raises(ValueError, match=r"axis_roles names mesh axis 'pp', but mesh \(dp=4\) has axes"):
        _plan(mlp_graph, {"dp": 4}, axis_roles={"pp": "ddp"})
    with pytest.raises(ValueError, match="give a dict of mesh axis name -> role"):
        PlanConfig(axis_roles="dp=fsdp")
    with pytest.raises(ValueError, match="axes must be distinct mesh axis names"):
        PlanConfig(axis_roles={0: "fsdp"})
    single = parallelizer.trace(*zoo.mlp(in_features=32, dim=64, hidden=256, depth=1, batch=1, device="meta"))
    with pytest.raises(ValueError, match=r"axis_roles\['dp'\]='ddp': no user input can be sharded over dp"):
        _plan(single, {"dp": 4}, axis_roles={"dp": "ddp"})
    norm_only = parallelizer.trace(nn.LayerNorm(6), (torch.randn(8, 6),))  # 1-D weights only: nothing for tp
    with pytest.raises(ValueError, match=r"axis_roles\['tp'\]='tp': no parameter can be stored sharded over tp"):
        _plan(norm_only, {"tp": 4}, axis_roles={"tp": "tp"})
    ddp = _plan(mlp_graph, {"dp": 4}, axis_roles={"dp": "ddp"})
    with pytest.raises(InfeasiblePlanError, match=r"with axis_roles \{'dp': 'ddp'\}. Remedies: roles that shard more"):
        _plan(mlp_graph, {"dp": 4}, axis_roles={"dp": "ddp"}, memory_budget_bytes=ddp.cost.memory_bytes["total"] // 2,
              recompute="none")  # (with recompute="auto" recomputing the blocks makes it fit)
    for mesh, roles, absent, present in (  # remedies already in effect are not suggested (found pricing
            # torchtitan's Llama 3.1 8B FSDP layout: bf16 + fsdp were told to use bf16, fsdp and a data axis)
            ({"dp": 4}, {"dp": "fsdp"}, ("roles that shard more", "a data axis", "bf16 precision"), ()),
            ({"dp": 2, "tp": 2}, {"dp": "ddp", "tp": "tp"}, ("a data axis", "bf16 precision"), ("roles that shard",))):
        lean = _plan(mlp_graph, mesh, axis_roles=roles, precision="bf16")
        with pytest.raises(InfeasiblePlanError, match="Remedies: ") as err:
            _plan(mlp_graph, mesh, axis_roles=roles, precision="bf16", recompute="none",
                  memory_budget_bytes=lean.cost.memory_bytes["total"] // 4)
        assert not [a for a in absent if a in str(err.value)] and all(p in str(err.value) for p in present), err.value
    odd = parallelizer.trace(*zoo.mlp(in_features=32, dim=64, hidden=256, depth=1, batch=6, device="meta"))
    uneven = _plan(odd, {"dp": 4}, axis_roles={"dp": "ddp"})  # a batch of 6 on 4 ranks: shards 2, 2, 2, 0
    assert uneven.nodes[odd.input_names[0]].output == "S(0)"


def test_memory_remedies_leave_out_a_data_axis_the_free_mesh_has_and_a_reserve_of_zero():
    """Trial r14e: `--mesh dp=2,tp=2 --memory-budget-gb 0.0001` (no roles: both axes already searched as data axes;
    an explicit budget keeps no reserve) was told to add "a data axis" and use "a smaller memory reserve"."""
    tg = parallelizer.trace(*zoo.mlp(in_features=32, dim=64, hidden=256, depth=1, batch=8, device="meta"))
    with pytest.raises(InfeasiblePlanError, match="Remedies: ") as err:
        _plan(tg, {"dp": 2, "tp": 2}, memory_budget_bytes=1000, recompute="none")
    text = str(err.value)
    assert "a data axis" not in text and "memory reserve" not in text, text
    assert "more devices" in text and text.endswith("."), text
    with pytest.raises(InfeasiblePlanError) as err:  # every axis forced to tp: a data axis is the remedy
        _plan(tg, {"tp": 2}, axis_roles={"tp": "tp"}, memory_budget_bytes=1000, recompute="none")
    assert "a data axis" in str(err.value), err.value


def test_a_plan_without_parallelism_says_so_and_the_ddp_role_is_the_remedy():
    from parallelizer.plan_io import plan_text

    tiny = parallelizer.trace(*zoo.mlp(depth=1, batch=8, dim=16, hidden=32, in_features=8, device="meta"))
    free = _plan(tiny, {"dp": 8})
    assert not free.steps() and len(free.notes()) == 1
    note = free.notes()[0]
    assert note.startswith("no parallelism") and "8 devices" in note and "axis_roles={'dp': 'ddp'}" in note
    assert free.summary().startswith("NOTE: no parallelism") and "## Notes" in plan_text(free)
    forced = _plan(tiny, {"dp": 8}, axis_roles={"dp": "ddp"})
    assert forced.notes() == [] and forced.steps("grad_all_reduce")
    assert _plan(tiny, {"dp": 1}).notes() == []  # one device: nothing to say


def test_tp_role_never_gathers_a_weight_sharded_over_two_axes():
    """GPT-2 with a vocabulary of 257 (odd): the tied wte/lm_head weight is stored sharded over both fsdp and
    tp (uneven vocabulary shards are allowed), and no parameter edge gathers over tp."""
    tg = parallelizer.trace(*zoo.gpt2(batch=8, seq_len=32, vocab_size=257, device="meta"))
    p = _plan(tg, {"dp": 2, "tp": 2}, axis_roles={"dp": "fsdp", "tp": "tp"})
    stored = Layout.parse(p.params["transformer.wte.weight"].stored)
    assert all(isinstance(x, Shard) for x in stored), stored
    assert not [(e.src, s) for e in _param_edges(p) for s in e.steps if s.mesh_axis == "tp" and s.kind == "all_gather"]


def test_axis_roles_none_means_no_roles_and_a_non_mapping_is_a_value_error():
    """`plan(..., axis_roles=None)` raised a bare TypeError ('NoneType' object is not iterable) from
    PlanConfig; None now means no roles, and a non-mapping such as 5 is the documented ValueError."""
    from parallelizer.config import PlanConfig

    assert PlanConfig(axis_roles=None).axis_roles == ()
    with pytest.raises(ValueError, match=r"PlanConfig.axis_roles=5: give a dict"):
        PlanConfig(axis_roles=5)


def test_a_weight_written_in_place_through_a_view_under_fsdp_is_stored_replicate_naming_the_writer():
    """nn.Embedding(max_norm=...) renormalises rows of weight.detach() in place (embedding_renorm_). Under fsdp the
    weight could not be redistributed, and the plan was infeasible (the error named the writer, first detach, then
    embedding_renorm_). Since r13b a parameter written in forward is stored Replicate over 'fsdp' axes, recorded
    as a fallback that names the writer (the numbers: test_trial_findings.py, against eager)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(11, 8, max_norm=1.0), torch.nn.Linear(8, 8))
    traced = parallelizer.trace(model, (torch.randint(0, 11, (4, 3)),))
    plan = _plan(traced, {"dp": 2}, axis_roles={"dp": "fsdp"})
    assert not any(isinstance(x, Shard) for x in Layout.parse(plan.params["0.weight"].stored).placements)
    assert isinstance(Layout.parse(plan.params["1.weight"].stored).placements[0], Shard)
    [written] = [f for f in plan.fallbacks if "written in place in forward" in f.reason]
    assert "parameter 0.weight (11, 8)" in written.reason and "aten.embedding_renorm_.default" in written.reason


class _PairsOverTheBatch(nn.Module):
    """A margin ranking loss over every pair of the batch: s_i - s_j needs the whole batch on each rank."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 1)

    def forward(self, x):
        s = self.a(x).squeeze(-1)
        return torch.relu(0.5 - (s[:, None] - s[None, :])).mean()


def test_an_infeasible_problem_is_reported_as_proved_not_as_a_time_limit():
    """The solver proves the problem infeasible (forced ddp forbids gathering the batch a pairwise loss needs):
    the error says so. It read 'found no plan within 60.0 s' and advised raising time_limit_s (trial h2)."""
    torch.manual_seed(0)
    traced = parallelizer.trace(_PairsOverTheBatch(), (torch.randn(4, 8),))
    with pytest.raises(InfeasiblePlanError) as err:
        _plan(traced, {"dp": 2}, axis_roles={"dp": "ddp"})
    text = str(err.value)
    assert "time_limit_s" not in text and "within" not in text, text
    assert "no plan" in text and "axis_roles" in text, text
    assert "compute such a loss outside the model" in text, text  # not only "plan without axis_roles", whose
    # plan (no parallelism) in turn suggested forcing ddp


@pytest.mark.parametrize("roles", [{"dp": "ddp"}, {"dp": "fsdp"}])
def test_a_slice_over_the_merged_batch_dim_has_a_data_parallel_plan(roles):
    """TimeSformer slices `e[:batch]` of its (batch x frames) dim after adding a position embedding. The slice
    followed the add (shared ILP variables): for the add's batch-sharded layout that fixed a gather to Replicate,
    which forced ddp / fsdp forbid, although an all-to-all to the feature dim serves: InfeasiblePlanError naming
    the add (trial 10e). A node whose rule cannot take each of its producer's layouts now chooses its own."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))
    from trial_user_models import merged_batch_slice
    model, inputs = merged_batch_slice()
    p = _plan(parallelizer.trace(model, inputs), {"dp": 2}, axis_roles=roles)
    assert str(p.nodes["x"].output) == "S(0)", p.nodes["x"]
    stored = {q.placeholders[0]: p.nodes[q.placeholders[0]].output for q in _params(p)}
    replicated = [str(L) == "R" for L in stored.values()]
    assert all(replicated) if roles["dp"] == "ddp" else not any(replicated), stored


def test_a_conv3d_tubelet_embedding_keeps_the_batch_sharded_under_ddp():
    """aten.conv3d had no sharding rule (the convolution rule named it, the table did not register it): under
    forced ddp ViViT / VideoMAE gathered the batch into the tubelet conv and ran every op after it replicated,
    the whole batch on each rank with no gradient all-reduce (trial 10e). It now takes the batch shard."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv3d(3, 8, (2, 4, 4), stride=(2, 4, 4)), nn.Flatten(2), nn.Linear(8, 8))
    p = _plan(parallelizer.trace(model, (torch.randn(4, 3, 4, 8, 8),)), {"dp": 2}, axis_roles={"dp": "ddp"})
    conv = next(n for n, q in p.nodes.items() if q.op == "aten.conv3d.default")
    assert str(p.nodes[conv].output) == "S(0)", p.nodes[conv]
    assert not p.fallbacks, p.fallbacks


class _TrilOnASlice(nn.Module):
    """An in-place op with no sharding rule written through a slice (`h[..., 2:9].tril_()`): it runs replicated,
    which the ddp role cannot give the activation it writes."""
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 16)

    def forward(self, x):
        h = self.a(x).clone()
        h[..., 0] = 0.0
        h[..., 2:9].tril_()
        return h


def test_an_in_place_op_without_a_rule_under_ddp_is_named_as_the_cause_with_an_out_of_place_remedy():
    # round 17: the refusal blamed only "an op that pairs samples across the batch", which this model has none of
    traced = parallelizer.trace(_TrilOnASlice(), (torch.randn(5, 6, 16),))
    with pytest.raises(InfeasiblePlanError) as err, contextlib.redirect_stdout(io.StringIO()):
        plan(traced, MeshSpec(("dp",), (2,)), config=PlanConfig(axis_roles={"dp": "ddp"}))
    msg = str(err.value)
    assert "tril_ has no sharding rule for aten.tril_.default and writes in place" in msg, msg
    assert "write it out of place" in msg, msg
