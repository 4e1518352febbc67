"""One planner on the user's path (issue 13, items 1-2): `parallelizer.plan(traced, cluster=, global_batch=)`
without a mesh searches (pp, dp, tp) x microbatches x schedule with the pipeline search and returns ONE Plan:
a pipeline Plan when a tight memory budget makes pp win, a plain ILP Plan when it does not. The Plan's stage
cuts, schedule and estimate are the search's; JSON round trip byte-identical; a mesh with pp fixes the
factorisation; schedule restrictions are honoured; schedules the runtime cannot run are refused.

Model: a 4-layer GPT-2 (hidden 64, vocab 256, batch 8 x seq 16) on 4 simulated H100s, fp32, Adam state
(16 B/param, about 0.22 M parameters = 3.5 MB of training state per full replica)."""
import contextlib
import io

import pytest

import parallelizer
from parallelizer import zoo
from parallelizer.cli import main
from parallelizer.errors import PipelineError
from parallelizer.plan_io import plan_text
from parallelizer.planner import Plan, plan_pipeline
from parallelizer.planner.stages import SCHEDULE_NAMES

CLUSTER = "h100:1x4"
TIGHT = 3_000_000  # bytes per device: a full replica's state (~3.5 MB) does not fit, half of it does


def _gpt(batch=8):
    return parallelizer.trace(*zoo.gpt2(device="meta", n_layer=4, n_embd=64, n_head=4, vocab_size=256, batch=batch,
                                        seq_len=16))


@pytest.fixture(scope="module")
def traced():
    return _gpt()


def _plan(*args, **kw):
    with contextlib.redirect_stdout(io.StringIO()):  # the solver library's banner
        return parallelizer.plan(*args, **kw)


@pytest.fixture(scope="module")
def tight(traced):
    return _plan(traced, cluster=CLUSTER, global_batch=8, memory_budget_bytes=TIGHT, precision="fp32")


def test_tight_budget_gives_a_pipeline_plan_with_the_search_cuts(traced, tight):
    with contextlib.redirect_stdout(io.StringIO()):
        found = plan_pipeline(traced, CLUSTER, global_batch=8, memory_budget_bytes=TIGHT, num_microbatches=1,
                              schedules=SCHEDULE_NAMES, zero1=False, precision="fp32", progress=False)
    assert found.pp > 1  # the case is what it claims: pp wins under this budget
    pipe = tight.pipeline
    assert (pipe.pp, pipe.schedule, pipe.microbatches) == (found.pp, found.schedule, found.num_microbatches)
    assert pipe.blocks_per_stage == tuple(s.num_blocks for s in found.stages)
    assert [s.blocks[0] for s in pipe.stages] == [f"transformer.h.{s.first_block}" for s in found.stages]
    assert pipe.estimate.step_s == pytest.approx(found.step_time_s, rel=1e-12)
    assert pipe.estimate.stage_s == pytest.approx([s.time_s for s in found.stages], rel=1e-12)
    assert max(m["total"] for m in pipe.estimate.rank_memory_bytes) == pytest.approx(found.memory_bytes, abs=8)
    assert tight.cost.memory_bytes["total"] <= TIGHT  # the plan's memory is the search's peak pipeline rank
    assert str(tight.mesh) == f"(dp={found.dp})" if found.dp > 1 else str(tight.mesh) == "(dp=1)"
    assert tight.pipeline.mesh.world_size == 4 and tight.model["search"]["step_s"] == found.step_time_s
    why = tight.model["search"]["alternatives"]  # the winner, then each other searched schedule's best
    assert why[0]["schedule"] == found.schedule and why[0]["step_s"] == found.step_time_s
    assert sorted(a["schedule"] for a in why) == ["1f1b", "gpipe"]  # interleaved needs m % pp == 0; m = 1
    assert all(a["step_s"] is None or a["step_s"] >= found.step_time_s for a in why)


def test_loose_budget_gives_a_plain_plan(traced):
    loose = _plan(traced, cluster=CLUSTER, global_batch=8, precision="fp32")
    assert loose.pipeline is None and loose.model["search"]["mesh"]["shape"][0] == 1
    assert loose.mesh.world_size == 4 and loose.cost.memory_bytes["total"] > TIGHT


def test_pipeline_plan_json_round_trip_is_byte_identical(traced, tight):
    text = tight.to_json()
    again = Plan.from_json(text)
    assert again.to_json() == text and again.pipeline == tight.pipeline
    assert _plan(traced, cluster=CLUSTER, global_batch=8, memory_budget_bytes=TIGHT,
                 precision="fp32").to_json() == text  # deterministic
    shown = plan_text(again)
    for part in ("Pipeline stages", "ms/microbatch", "Pipeline memory per device by pp rank", "search estimate",
                 "Activation recomputation", f"why {again.pipeline.schedule}", "vs "):
        assert part in shown, part


def test_schedule_restriction_and_zbv_placed_in_a_v(traced):
    gpipe = _plan(traced, cluster=CLUSTER, global_batch=8, memory_budget_bytes=TIGHT, precision="fp32",
                  schedule="gpipe")
    assert gpipe.pipeline.schedule == "gpipe"
    inter = _plan(traced, {"pp": 2}, schedule="interleaved_1f1b", microbatches=2, precision="fp32")
    assert inter.pipeline.virtual_stages == 2 and [s.pp_rank for s in inter.pipeline.stages] == [0, 1, 0, 1]
    zbv = _plan(traced, {"pp": 2}, schedule="zbv", microbatches=4, precision="fp32")  # runs since issue 14
    assert zbv.pipeline.virtual_stages == 2 and [s.pp_rank for s in zbv.pipeline.stages] == [0, 1, 1, 0]
    assert [s.ranks for s in zbv.pipeline.stages] == [(0, 0), (1, 1), (1, 1), (0, 0)]
    with pytest.raises(PipelineError, match="virtual_stages=2 with schedule"):
        _plan(traced, {"pp": 2}, schedule="1f1b", virtual_stages=2)
    with pytest.raises(PipelineError, match="axes pp, dp, tp"):
        _plan(traced, {"pp": 2, "x": 2})


def test_retrace_lets_the_search_choose_microbatches():
    traced = _gpt(batch=8)
    asked = []

    def retrace(batch):
        asked.append(batch)
        return _gpt(batch)

    p = _plan(traced, cluster=CLUSTER, global_batch=32, memory_budget_bytes=TIGHT, precision="fp32", retrace=retrace)
    m = p.model["search"]["microbatches"]
    assert p.model["inputs"][next(iter(p.model["inputs"]))][0] == 32 // m  # the Plan's graph is one microbatch
    assert asked == ([] if 32 // m == 8 else [32 // m])
    with pytest.raises(ValueError, match="not a multiple of the traced batch"):
        _plan(traced, cluster=CLUSTER, global_batch=12)
    with pytest.raises(ValueError, match="needs a graph traced at batch 4, not 8"):
        _plan(traced, cluster=CLUSTER, global_batch=8, microbatches=2)


def test_cli_mesh_with_pp_fixes_the_factorisation(tmp_path):
    out = tmp_path / "plan.json"
    argv = ["plan", "--model", "gpt2", "--config", "n_layer=4,n_embd=64,n_head=4,vocab_size=256", "--seq-len", "16",
            "--mesh", "pp=2,dp=2", "--schedule", "1f1b", "--global-batch", "16", "--no-progress", "-o", str(out)]
    with contextlib.redirect_stdout(io.StringIO()) as shown:
        assert main(argv) == 0
    plan = Plan.load(out)
    assert str(plan.pipeline.mesh) == "(pp=2, dp=2)" and plan.pipeline.schedule == "1f1b"
    m = plan.pipeline.microbatches
    assert plan.model["batch"]["traced_batch"] == 16 // m and plan.model["recipe"]["kwargs"]["batch"] == 16 // m
    assert "search estimate" in shown.getvalue() and "Pipeline stages" in shown.getvalue()


def test_the_planner_offers_no_pipeline_plan_the_runtime_refuses(traced):
    # one class: a configuration `plan` returns must run. BitPipe (our P2P runner) has no boundary compression
    # (refused at run time before this test). Pipeline stages run the bf16 autocast recipe (`runtime.pipeline`,
    # tests/distributed/test_pipeline_run.py), so a fixed pp mesh and a search may plan it
    searched = _plan(traced, {"pp": 2, "dp": 2}, boundary_compression="int8", microbatches=4, precision="fp32")
    assert searched.pipeline.schedule != "bitpipe" and searched.pipeline.compression is not None
    with pytest.raises(ValueError, match="bitpipe runs no pipeline-boundary compression"):
        _plan(traced, {"pp": 2, "dp": 2}, schedule="bitpipe", boundary_compression="int8", microbatches=4,
              precision="fp32")
    fixed = _plan(traced, {"pp": 2}, microbatches=4, precision="bf16")
    assert fixed.pipeline.pp == 2 and fixed.config["mixed_precision"] == "autocast_bf16"
    # searched: a budget a full replica's state does not fit picks a pipeline, as in fp32
    bf16 = _plan(traced, cluster=CLUSTER, global_batch=8, precision="bf16", memory_budget_bytes=TIGHT)
    assert bf16.pipeline is not None and bf16.pipeline.pp > 1, bf16.mesh
    assert bf16.config["mixed_precision"] == "autocast_bf16"


def test_an_invalid_fixed_schedule_names_its_own_reason(traced):
    # the error of a fully fixed (pp, tp, m, schedule) names why it was excluded, not the batch split
    with pytest.raises(ValueError, match="bitpipe needs an even pp >= 2 and an even microbatch count"):
        _plan(traced, {"pp": 2}, schedule="bitpipe", microbatches=3, global_batch=24, precision="fp32")


@pytest.mark.parametrize("mesh, cluster, message", [
    ({"pp": 2, "dp": 2}, "h100:1x8", "has 4 devices but the cluster has 1 nodes x 8 = 8"),
    ({"pp": 2, "dp": 4}, CLUSTER, "has 8 devices but the cluster has 1 nodes x 4 = 4"),
])
def test_a_pipeline_mesh_must_use_all_the_clusters_devices(traced, mesh, cluster, message):
    """Round 17 new-user trial: a mesh with "pp" resized the cluster silently (pp=2,dp=2 on h100:1x8 was priced on
    1 x 4 devices and labelled "h100:1x8"); a mesh without pp was refused. Now both are."""
    with pytest.raises(ValueError, match=message):
        _plan(traced, mesh, cluster=cluster, global_batch=8)
    with pytest.raises(ValueError, match=message):  # the same devices without pp: the same refusal as before
        _plan(traced, {"dp": mesh["pp"] * mesh["dp"]}, cluster=cluster)
    plan = _plan(traced, mesh, cluster=f"h100:1x{mesh['pp'] * mesh['dp']}", global_batch=8, precision="fp32")
    assert (plan.cluster["num_nodes"], plan.cluster["devices_per_node"]) == (1, mesh["pp"] * mesh["dp"])


def test_microbatches_that_do_not_divide_the_global_batch_are_named_with_the_divisors(traced):
    """Round 17 new-user trial: microbatches=3 with global_batch=8 said "needs a graph traced at batch 2.66667",
    and with retrace= named a `num_microbatches` option that `plan` does not have."""
    for retrace in (None, lambda batch: _gpt(batch)):
        with pytest.raises(PipelineError, match=r"global_batch=8 does not split into microbatches=3 of whole samples\. "
                                                r"Remedy: microbatches= one of \[1, 2, 4, 8\]"):
            _plan(traced, {"pp": 2, "dp": 2}, cluster=CLUSTER, global_batch=8, microbatches=3, retrace=retrace)


def test_a_searched_plan_shows_its_throughput_and_mfu(tight):
    """Round 17 new-user trial: `show` printed no MFU or throughput (the PipelinePlan of the search had them)."""
    found = tight.model["search"]
    assert found["mfu"] == pytest.approx(found["tflops_per_device"] * 1e12 / found["peak_flops_per_s"], rel=1e-9)
    line = next(x for x in tight.summary().splitlines() if x.startswith("  throughput: "))
    assert f"= {found['mfu']:.1%} MFU of {found['device']}" in line
    assert f"{found['global_batch'] / found['step_s']:.1f} samples/s" in line
    assert line in Plan.from_json(tight.to_json()).summary().splitlines()  # kept in the JSON
