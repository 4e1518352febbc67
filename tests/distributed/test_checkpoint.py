"""Sharded checkpoints through torch.distributed.checkpoint (issue 12 item 17), on 4 gloo ranks.

GPT-2 (tied embedding, vocab 4001 so that shards are uneven, position table frozen) trains 3 AdamW steps on
(dp=2 fsdp, tp=2 tp), is saved, and trains 2 more steps. The checkpoint is loaded into models of another
seed planned on {"tp": 4} and on {"dp": 4}: parameters and optimizer state equal the saved ones bit for bit
(resharded), the frozen parameter has no optimizer state, and the next 2 losses equal those of the run that
never stopped (torch.testing's float32 tolerance: another sharding sums in another order). Save, load and
the tensor-by-tensor export add at most one full tensor to any rank's memory (measured: peak RSS above the
level before the call). The export loads into the original model
with strict=True and through transformers' from_pretrained. Pipeline plans save and load the same checkpoint
(pp=2 x dp=2 -> dp=2 x tp=2 -> pp=2 x tp=2 zbv, a 4-block GPT-2), and export it.
"""
import contextlib
import io

import pytest
import torch

import parallelizer
from parallelizer import checkpoint
from parallelizer.rewriter.spec import spec_from_plan
from parallelizer.runtime import spawn
from checkpoint_workers import PIPE_CFG, build, resume

pytestmark = pytest.mark.distributed

SLACK_BYTES = 3 * 2**20  # DCP's metadata and pickled plans, file buffers, Python objects (measured ~1 MiB)


def _spec(traced, mesh, roles):
    with contextlib.redirect_stdout(io.StringIO()):  # the solver library prints a banner
        return spec_from_plan(parallelizer.plan(traced, mesh, axis_roles=roles))


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    model, args, kwargs = build()
    traced = parallelizer.trace(model, args, kwargs)
    specs = {"first": _spec(traced, {"dp": 2, "tp": 2}, {"dp": "fsdp", "tp": "tp"}),
             "tp4": _spec(traced, {"tp": 4}, {"tp": "tp"}),
             "dp4": _spec(traced, {"dp": 4}, {"dp": "ddp"})}
    assert any(str(layout) == "S(0)" for layout in specs["tp4"].params.values())
    small, args, kwargs = build(cfg=PIPE_CFG)
    with contextlib.redirect_stdout(io.StringIO()):
        pipelines = {"dp2_tp2": parallelizer.plan(parallelizer.trace(small, args, kwargs), {"dp": 2, "tp": 2},
                                                  axis_roles={"dp": "fsdp", "tp": "tp"}).to_json()}
    # zbv on pp=2: 4 stages, pp rank 0 runs stages 0 and 3, so it holds wte AND the tied lm_head copy
    for name, mesh, schedule, m in (("pp_dp", {"pp": 2, "dp": 2}, "1f1b", 2), ("pp_tp", {"pp": 2, "tp": 2}, "zbv", 4)):
        micro = parallelizer.trace(small, tuple(a[:8 // m] for a in args), {k: v[:8 // m] for k, v in kwargs.items()})
        with contextlib.redirect_stdout(io.StringIO()):  # plans are made on one microbatch of the batch of 8
            pipelines[name] = parallelizer.plan(micro, mesh, schedule=schedule, microbatches=m).to_json()
    root = tmp_path_factory.mktemp("ckpt")
    results = spawn(resume, 4, specs, str(root), pipelines, timeout_s=500)
    return results, root


@pytest.mark.parametrize("name", ["tp4", "dp4"])
def test_resume_on_another_mesh_is_bitwise_and_continues_the_losses(resumed, name):
    results, _ = resumed
    for rank, r in enumerate(results):
        got = r[name]
        assert got["params_bitwise"] and got["state_keys_equal"] and got["state_bitwise"], (name, rank, got)
        assert not got["frozen_has_state"] and not r["frozen_has_state"]
        assert got["lr"] == 1e-3
        # tp4 / dp4 against the dp2 x tp2 run: the same parameters and optimizer state (bitwise, above) through
        # other op graphs (partial sums of other shardings), so float32's default tolerance, not a tighter one (the
        # losses are Python floats: torch.testing would take float64's); a wrong parameter, or a lost optimizer
        # state (AdamW steps of about lr = 1e-3 per element in another direction), moves them far more
        torch.testing.assert_close(got["losses"], r["losses"], rtol=1.3e-6, atol=1e-5)
        assert r["losses"][0] < 10  # a real loss (vocab 4001: ln(4001) = 8.3 at the start)


def test_no_rank_holds_more_than_its_shards_plus_one_tensor(resumed):
    results, _ = resumed
    for rank, r in enumerate(results):
        one = r["largest_bytes"]
        print(f"rank {rank}: largest tensor {one} B, model {r['full_bytes']} B, local state {r['local_bytes']} B; "
              f"peaks added: save {r['save_peak']} B, export {r['export_peak']} B, "
              + ", ".join(f"load {n} {r[n]['load_peak']} B (optimizer state created {r[n]['state_local_bytes']} B)"
                          for n in ("tp4", "dp4")))
        assert r["full_bytes"] > 2 * one + SLACK_BYTES  # gathering the model would break the bound below
        assert r["save_peak"] <= one + SLACK_BYTES, (rank, r["save_peak"], one)
        assert r["export_peak"] <= 2 * one + SLACK_BYTES, (rank, r["export_peak"], one)  # + one received shard
        for name in ("tp4", "dp4"):  # loading creates the optimizer's state: its own shards
            assert r[name]["load_peak"] <= r[name]["state_local_bytes"] + one + SLACK_BYTES, (rank, name, r[name])


def test_export_is_strict_loadable_and_transformers_loadable(resumed):
    results, root = resumed
    params = results[0]["params_at_3"]
    exported = checkpoint.read_full_state_dict(root / "export")
    model = build(seed=5)[0]
    assert sorted(exported) == sorted(model.state_dict())
    missing = model.load_state_dict(exported, strict=True)
    assert not missing.missing_keys and not missing.unexpected_keys
    assert all(torch.equal(model.state_dict()[k], v) for k, v in params.items())
    from transformers import GPT2LMHeadModel
    build(seed=5)[0].config.save_pretrained(root / "export")
    loaded = GPT2LMHeadModel.from_pretrained(root / "export")
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in params.items())


def test_pipeline_checkpoints_move_between_pipeline_and_other_plans(resumed):
    """A pipeline rank saves and loads the same DCP checkpoint as a ParallelModule (`checkpoint`'s module
    docstring), on a 4-block GPT-2: pp=2 x dp=2 (1f1b) -> dp=2 x tp=2 (fsdp, tp) -> pp=2 x tp=2 (zbv: wte and
    the tied lm_head copy on one rank, both loaded). Parameters are bitwise after each load, and the next 2
    steps match the run that never stopped (optimizer state restored) within 1e-5 (other op graphs)."""
    results, _ = resumed
    for rank, r in enumerate(results):
        pp = r["pipeline"]
        assert pp["into_plain_bitwise"] and pp["into_pp_bitwise"] and pp["export_equal"], rank
        assert pp["into_pp_lr"] == 1e-3
        for other in ("plain", "into_pp"):
            torch.testing.assert_close(pp[f"{other}_losses"], pp["pp_losses"], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(pp[f"{other}_at_5"], pp["pp_at_5"], rtol=1e-5, atol=1e-5)
        assert pp["moved"] > 1e-4  # the 2 steps moved the parameters (an optimizer state error would show above)


def test_a_key_only_some_pipeline_ranks_miss_raises_on_every_rank(resumed):
    """A checkpoint lacking tensors that only the last stage holds (e.g. saved from a shallower model): every
    rank raises StateDictError naming them, none enters DCP's collective load alone (a hang before)."""
    results, _ = resumed
    for rank, r in enumerate(results):
        got = r["pipeline"]["partial_errors"]
        assert got.startswith("StateDictError") and "transformer.h.3." in got, (rank, got)


def test_a_checkpoint_saved_before_the_first_step_changes_nothing_and_loads_anywhere(resumed):
    """Saved before the optimizer's first step: saving created no optimizer state (torch's own state dict call
    would step Adam once: a silently different run), and it loads on a pipeline and back, without state."""
    results, _ = resumed
    for rank, r in enumerate(results):
        s = r["pipeline"]["step0"]
        assert not s["dp_save_created_state"] and s["from_pp_error"] is None, (rank, s)
        assert s["into_pp_bitwise"] and not s["into_pp_state"] and not s["from_pp_state"], (rank, s)
        torch.testing.assert_close(s["losses"][1], s["losses"][0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(s["losses"][2], s["losses"][0], rtol=1e-5, atol=1e-5)
        assert s["max_diff"] < 1e-5, (rank, s["max_diff"])
