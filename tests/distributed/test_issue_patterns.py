"""The patterns behind issue 11's wrong numbers, each a class (DESIGN.md rules 8-9), run on real gloo ranks
against the single-device model: a constant added to a Partial sum, a narrowing cast of a Partial value,
position-dependent ops (tril) on sharded dims, creation ops that follow their input (zeros_like), a
TransformerEncoderLayer on an uneven batch, a CNN under data parallelism (conv, BatchNorm, pooling), an
einsum mixture of experts under tensor parallelism, and parameters whose dims do not divide the mesh."""
import contextlib
import dataclasses
import functools
import io

import pytest
import torch

import parallelizer
from parallelizer.core.layout import Layout, Shard
from parallelizer.rewriter.spec import NodeSharding, spec_from_plan
from parallelizer.runtime import spawn
from parallelizer.runtime.rehearsal import rehearse_many
from pattern_models import (causal_scores, einsum_moe, encoder_lm, microbatch_mixing_step, narrow_cast, odd_width,
                            out_of_range_indices, refactored_view, row_parallel_plus, small_resnet, sum_plus,
                            tied_vocab_ce, zeros_like_plus)
from launch_once import run_each
from semantics_models import run_outputs

pytestmark = pytest.mark.distributed


def _plan(builder, mesh, **options):
    model, inputs = builder()[:2]
    traced = parallelizer.trace(model, inputs)
    with contextlib.redirect_stdout(io.StringIO()):
        return traced, parallelizer.plan(traced, mesh, **options)


def test_a_constant_is_added_to_the_reduced_sum_once():
    """x.sum() + 10 and x.sum() - 10 on dp=2 with the ddp role (x = arange(10), batch-sharded): 55 and 35."""
    calls, wants = [], (55.0, 35.0)
    for c in (10.0, -10.0):
        builder = functools.partial(sum_plus, c)
        traced, plan = _plan(builder, {"dp": 2}, axis_roles={"dp": "ddp"})
        add = next(n for n in plan.nodes.values() if n.op == "aten.add.Tensor")
        assert add.inputs == ("R",), add  # the Partial sum is all-reduced first
        calls.append((run_outputs, (builder, spec_from_plan(plan))))
    for rank_outputs in spawn(run_each, 2, calls):  # both constants in one launch of ranks
        assert [out.item() for (out,) in rank_outputs] == list(wants)


@pytest.fixture(scope="module")
def two_rank_reports():
    cases = {}
    _, cases["cast"] = _plan(narrow_cast, {"tp": 2}, axis_roles={"tp": "tp"})
    wide = functools.partial(causal_scores, 512, 64, 0, "meta")  # planned wide (on meta), run narrow
    _, cases["tril"] = _plan(wide, {"tp": 2}, axis_roles={"tp": "tp"})
    _, cases["zeros_like"] = _plan(zeros_like_plus, {"dp": 2}, axis_roles={"dp": "ddp"})
    _, cases["view"] = _plan(refactored_view, {"dp": 2}, axis_roles={"dp": "ddp"})
    builders = {"cast": narrow_cast, "tril": causal_scores, "zeros_like": zeros_like_plus, "view": refactored_view}
    specs = {k: spec_from_plan(p) for k, p in cases.items()}
    for dim in (1, 2):  # the planner keeps the scores Partial through tril (linear); force row / column shards
        specs[f"tril_dim{dim}"] = _with_layout(specs["tril"], "aten.tril.default", cases["tril"], f"S({dim})")
        builders[f"tril_dim{dim}"] = causal_scores
    reports = rehearse_many([(builders[k], {}, spec) for k, spec in specs.items()])
    return {k: (cases.get(k, cases["tril"]), r) for k, r in zip(specs, reports)}


def _with_layout(spec, op: str, plan, layout: str):
    """`spec` with every `op` node consuming and producing `layout` (the rewriter adds the redistributions)."""
    nodes = dict(spec.nodes)
    for name, n in plan.nodes.items():
        if n.op == op:
            nodes[name] = NodeSharding((Layout.parse(layout),), Layout.parse(layout))
    return dataclasses.replace(spec, nodes=nodes)


def test_a_narrowing_cast_sees_the_reduced_sum(two_rank_reports):
    plan, report = two_rank_reports["cast"]
    cast = next(n for n in plan.nodes.values() if n.op in ("aten._to_copy.default", "aten.to.dtype"))
    assert "P" not in cast.inputs[0]
    assert report.matches(), report


def test_tril_on_sharded_rows_or_columns(two_rank_reports):
    """scores (B, T, T) planned wide, run narrow (T = 7 over 2 ranks: 4 + 3 rows): as planned (Partial through
    tril), and with tril forced onto row shards and onto column shards (the diagonal shifted by the offsets)."""
    for case in ("tril", "tril_dim1", "tril_dim2"):
        _, report = two_rank_reports[case]
        assert report.matches(), (case, report)


def test_zeros_like_follows_its_input_under_ddp(two_rank_reports):
    plan, report = two_rank_reports["zeros_like"]
    zl = next(n for n in plan.nodes.values() if n.op == "aten.zeros_like.default")
    assert zl.inputs == ("S(0)",) and zl.output == "S(0)"
    assert report.matches(), report


@pytest.fixture(scope="module")
def four_rank_reports():
    cases = {
        "row_parallel": (row_parallel_plus, {"tp": 4}, {"tp": "tp"}),
        "encoder": (encoder_lm, {"dp": 4}, {"dp": "ddp"}),      # batch 8, sequence 6: dim 1 (6) over 4
        "resnet": (small_resnet, {"dp": 4}, {"dp": "ddp"}),     # batch 6 over 4: 2, 2, 2, 0
        "moe": (einsum_moe, {"tp": 4}, {"tp": "tp"}),
        "odd": (odd_width, {"dp": 4}, {"dp": "fsdp"}),           # hidden 62, Embedding(101, 29)
        "view": (refactored_view, {"dp": 4}, {"dp": "ddp"}),     # (12, 8) -> (16, 6), rows 3 -> 4 per rank
    }
    plans = {k: _plan(b, mesh, axis_roles=roles)[1] for k, (b, mesh, roles) in cases.items()}
    reports = rehearse_many([(cases[k][0], {}, spec_from_plan(p)) for k, p in plans.items()])
    return {k: (p, r) for (k, p), r in zip(plans.items(), reports)}


def test_row_parallel_output_plus_constant_on_tp4(four_rank_reports):
    plan, report = four_rank_reports["row_parallel"]
    assert any(n.output == "P" for n in plan.nodes.values() if n.op == "aten.linear.default")  # row parallel
    assert report.matches(), report


def test_transformer_encoder_layer_on_an_uneven_batch_under_ddp(four_rank_reports):
    plan, report = four_rank_reports["encoder"]
    assert report.matches(), report


def test_cnn_under_ddp_is_batch_sharded_and_syncs_its_gradients(four_rank_reports):
    plan, report = four_rank_reports["resnet"]
    for n in plan.nodes.values():
        if n.op in ("aten.conv2d.default", "aten.batch_norm.default"):
            assert n.inputs[0] == "S(0)" and n.output == "S(0)", n
    synced = {e.src for e in plan.edges for s in e.steps if s.kind == "grad_all_reduce"}
    assert {"p_stem_0_weight", "p_c1_weight", "p_c2_weight", "p_head_weight"} <= synced
    assert not plan.fallbacks and report.matches(), report


def test_einsum_experts_are_sharded_under_the_tp_role(four_rank_reports):
    plan, report = four_rank_reports["moe"]
    for w in ("w1", "w2"):
        assert isinstance(Layout.parse(plan.params[w].stored)[0], Shard), plan.params[w]
    assert report.matches(), report


def test_parameters_whose_dims_do_not_divide_are_still_sharded(four_rank_reports):
    plan, report = four_rank_reports["odd"]
    for p in plan.params.values():  # fsdp: every parameter, uneven shards (62 -> 16, 16, 16, 14)
        assert p.stored != "R", p
    assert report.matches(), report
    _, eight = _plan(odd_width, {"dp": 8}, axis_roles={"dp": "fsdp"})
    assert eight.params["emb.weight"].stored != "R"  # Embedding(101, 29) on 8 ranks


# --- round 9: further public reports (trial/r9b_*; benchmarks/RESULTS.md "Round 9") -------------------------

def test_a_view_between_dims_of_unrelated_sizes_plans_and_runs():
    """pytorch#179502 (https://github.com/pytorch/pytorch/issues/179502): (12, 8) -> (16, 6) with the batch dim
    sharded. Its chunks of 6 rows (48 elements) are 8 rows of 6 on 2 and 4 ranks (a local view, no re-cut); on
    3 ranks 4 rows (32 elements) are 5.33 rows of 6 and no re-cut of whole rows exists, so the planner must not
    offer Shard(0) -> Shard(0) there (before: a re-cut by 16 // 12 = 1 row, a reshape error on every rank)."""
    from parallelizer.core.layout import IndivisibleShardError, view_regroups
    s0 = Layout.parse("S(0)")
    assert view_regroups((12, 8), (16, 6), s0, s0, (2,)) == [] == view_regroups((12, 8), (16, 6), s0, s0, (4,))
    with pytest.raises(IndivisibleShardError):
        view_regroups((12, 8), (16, 6), s0, s0, (3,))
    (r,) = view_regroups((10, 7), (70,), s0, s0, (4,))   # an integer ratio re-cuts as before
    assert (r.have, r.want, r.after) == ((21, 21, 21, 7), (18, 18, 18, 16), True)
    _, three = _plan(refactored_view, {"dp": 3}, axis_roles={"dp": "ddp"})
    view = next(n for n in three.nodes.values() if n.op == "aten.reshape.default")  # (views are traced as reshapes)
    assert (view.inputs[0], view.output) != ("S(0)", "S(0)"), view


def test_a_view_between_dims_of_unrelated_sizes_matches_one_device(two_rank_reports, four_rank_reports):
    for plan, report in (two_rank_reports["view"], four_rank_reports["view"]):  # dp=2 and dp=4, ddp
        view = next(n for n in plan.nodes.values() if n.op == "aten.reshape.default")  # (views are traced as reshapes)
        assert (view.inputs[0], view.output) == ("S(0)", "S(0)"), view  # the batch stays sharded through it
        assert report.matches(), report


def test_indices_outside_a_sharded_vocabulary_raise_as_on_one_device():
    """torchtitan#4297 (https://github.com/pytorch/torchtitan/pull/4297): a label outside the vocabulary (not the
    ignore_index) in a vocab-parallel cross-entropy falls in no rank's slice, so every rank dropped its target
    term and the loss was the log-sum-exp alone, where one device raises IndexError; an id outside the
    vocabulary of a vocab-parallel embedding read zeros. On tp=2 (37 classes: 19 + 18) both now raise IndexError
    on every rank, and valid labels with -100 rows give one device's loss."""
    _, plan = _plan(tied_vocab_ce, {"tp": 2}, axis_roles={"tp": "tp"})
    spec = spec_from_plan(plan)  # force the vocab-parallel loss and lookup (the planner keeps this small one off)
    nodes, L = dict(spec.nodes), Layout.parse
    for name, n in plan.nodes.items():
        if n.op == "aten.cross_entropy_loss.default":
            nodes[name] = NodeSharding((L("S(1)"), L("R")), L("R"))
        elif n.op == "aten.embedding.default":
            nodes[name] = NodeSharding((L("S(0)"), L("R")), L("P"))
    spec = dataclasses.replace(spec, nodes=nodes)
    for ranks in spawn(out_of_range_indices, 2, spec):
        got, want = ranks.pop("valid")
        # the vocab-parallel loss against eager's: two op graphs, float32 values handed back as Python floats, so
        # float32's tolerance given explicitly (torch.testing would take float64's 1e-7 for Python floats)
        torch.testing.assert_close(got, want, rtol=1.3e-6, atol=1e-5)
        assert ranks == {k: ("IndexError", "IndexError") for k in ("label_high", "label_negative", "id_high")}, ranks


# --- round 10 (b): public reports of a third round (trial/r10b_*; benchmarks/RESULTS.md "Round 10 (r10b)") ------

def test_a_pipeline_whose_microbatches_change_the_model_warns():
    """GPipe's BatchNorm-over-microbatches class (pytorch#175024 / #1051 for BatchNorm called on two batches per
    step): a pipeline runs each stage on one microbatch at a time, so batch centering inside a block (x - x.mean(0))
    and BatchNorm in training compute another function than the model on the whole batch, and so does an in-batch
    contrastive loss in the model's own code or as pm.step's loss_fn (CLIP's; trial r10b: pm.step 1.44 where one
    device gives 2.16).
    auto_parallelize on
    pp=2 x dp=2 trained them silently (trial r10b: loss 1.7e-2 off one device, 1580x the fp32 bound); now rank 0
    warns MicrobatchWarning naming the module, pm.step's loss is the gradient-accumulation loss, which differs
    from the whole batch's, and a per-sample model is not warned about and gives the whole batch's loss."""
    ranks = spawn(microbatch_mixing_step, 4, ("center", "bn", "contrastive", "embeddings", "plain"), timeout_s=300)
    first = ranks[0]
    assert first["center"]["warned"] == ["blocks.0.a"] and first["bn"]["warned"] == ["blocks.0.bn"]
    assert first["contrastive"]["warned"] == ["the model's loss"]  # CLIP's in-batch loss in the model's code
    assert first["embeddings"]["warned"] == ["loss_fn"]  # the same loss as pm.step's loss_fn
    assert first["plain"]["warned"] == [] and all(r[k]["warned"] == [] for r in ranks[1:] for k in r)
    # pm.step's loss (the pipeline's microbatches on dp ranks) against one device's: two op graphs, float32 losses
    # handed back as Python floats, so float32's tolerance given explicitly (torch.testing takes float64's 1e-7 for
    # Python floats: the step and the accumulated loss were measured half of that apart here, 1-2 float32 ulps); the
    # whole-batch loss the accumulation is told from lies > 1e-3 away, 100 times the bound
    f32 = dict(rtol=1.3e-6, atol=1e-5)
    for kind in ("center", "bn", "contrastive", "embeddings"):
        got = first[kind]
        torch.testing.assert_close(got["step"], got["accumulated"], **f32)
        assert abs(got["whole"] - got["accumulated"]) > 1e-3, got
    torch.testing.assert_close(first["plain"]["step"], first["plain"]["whole"], **f32)
