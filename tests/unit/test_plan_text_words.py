"""The words `show` / `Plan.summary` use for a pipeline plan (r21g finding 8): where the pipeline cuts between
stages is named as stage boundaries, never "dp cut" (dp is the data-parallel mesh axis; data parallelism is not
a cut), for both values the plan JSON keeps ("dp": the dynamic program, "uniform")."""
import json
from importlib import resources

import pytest

from parallelizer.core.mesh import MeshSpec
from parallelizer.planner.stages import PARTITION_WORDS, PipelineEstimate, partition_text


@pytest.mark.parametrize("partition", ["dp", "uniform"])
def test_the_pipeline_estimate_names_stage_boundaries_not_a_dp_cut(partition):
    est = PipelineEstimate(1e-3, 9e-4, 1e-4, 1e-4, 0.0, 4, 32, partition, (4e-4, 5e-4),
                           ({"total": 10},) * 2)
    first = est.lines()[0]
    assert "dp cut" not in first and "cut" not in first.split(";")[-1]
    assert first.endswith(PARTITION_WORDS[partition]) and "stage boundaries" in first
    assert "dynamic programming" in partition_text("dp") and "mesh" not in partition_text("uniform")
    assert partition_text("hand-edited") == "stage boundaries 'hand-edited'"


def test_the_plan_schema_says_what_partition_dp_means():
    schema = json.loads(resources.files("parallelizer").joinpath("plan_schema.json").read_text())
    text = json.dumps(schema)
    assert "not the data-parallel mesh axis" in text


def test_show_says_what_the_stage_column_is_on_ranks_sharing_cores_and_the_sums_agree():
    """r21g finding 10: on 4 CPU ranks `show`'s stages summed to 88.4 ms per microbatch while one microbatch
    through the 4 stages in turn (GPipe, 1 microbatch) was simulated at 57.5 ms, unexplained. The stage column is
    priced with all processes computing (the device's calibrated slowdown), the simulation runs a stage alone at
    `sharing.pipeline_cores`' scale of it. Here 4 processes on 2 cores (x2 with 4 at once, x1 with 2: scale 1/2),
    links of zero cost: the simulated pipeline equals the stage sum times the scale, and `show` says both."""
    import contextlib
    import io

    import torch

    import parallelizer
    from cost_model.calibrate import Profile
    from cost_model.hardware import DeviceSpec
    from cost_model.topology import Link
    from parallelizer import zoo

    cpu = DeviceSpec("cpu", {torch.float32: 1e11}, 10**10, 1e10, 1.0, 1.0, 2e-6, kind="cpu",
                     optimizer_bytes_per_s=4e9, optimizer_tensor_s=40e-6)  # as tests/unit/test_sharing.py
    cluster = Profile(cpu, {4: Link("gloo_x4", 0.0, 1e18)}, contention={2: (1.0, 1.0, 1.0), 4: (2.0, 2.0, 2.0)},
                      cpu_count=2).cluster(4)
    m, inp = zoo.gpt(n_layer=4, n_embd=64, n_head=2, block_size=32, vocab_size=128, batch=1, with_targets=True,
                     device="meta")
    with contextlib.redirect_stdout(io.StringIO()):
        plan = parallelizer.plan(parallelizer.trace(m, inp), {"pp": 4}, cluster=cluster, microbatches=1,
                                 schedule="gpipe", global_batch=1)
    est, scale = plan.pipeline.estimate, plan.model["search"]["stage_scale"]
    assert scale == pytest.approx(0.5)
    assert est.pipeline_s == pytest.approx(sum(est.stage_s) * scale, rel=1e-6)  # one stage computing at a time
    assert est.pipeline_s < sum(est.stage_s)  # what read as a contradiction
    text = plan.summary()
    assert "stage times: the stage column is priced with all 4 processes computing at once" in text, text
    assert f"x0.5 of that" in text and f"about {sum(est.stage_s) * scale * 1e3:.3f} ms" in text, text


def test_a_gpu_plan_records_no_stage_scale_and_shows_no_stage_times_row():
    """Without core sharing the stage column is what the simulation runs: no row, and plan JSON as before."""
    from parallelizer.planner.plan_text import search_rows

    class _Plan:  # the fields `search_rows` reads
        model = {"search": {"mesh": {"axis_names": ["pp"], "shape": [2]}, "schedule": "1f1b", "microbatches": 2,
                            "microbatch_size": 1, "global_batch": 2, "step_s": 1e-3, "candidates": 1, "priced": 1,
                            "infeasible_memory": 0, "pruned": 0}}
        pipeline = type("P", (), {"estimate": PipelineEstimate(1e-3, 1e-3, 0.0, 0.0, 0.0, 1, 2, "dp", (4e-4, 4e-4),
                                                               ({"total": 1},) * 2),
                                  "schedule": "1f1b", "microbatches": 2, "mesh": MeshSpec(("pp",), (2,))})()
        mesh = "(dp=1)"
        cost = type("C", (), {"total_s": 8e-4})()
    assert [k for k, _ in search_rows(_Plan())] == ["chosen", "searched", "search estimate", "pipeline",
                                                    "per microbatch"]


def test_a_long_cell_in_the_last_column_does_not_widen_its_rule():
    """`show`'s Mesh table drew a rule as wide as its ~300-character precision line (trials r23h, r24h); the last
    column's rule now stops at `LAST_COLUMN_RULE_MAX`, the cells are printed whole and the other columns aligned."""
    from parallelizer.plan_io import LAST_COLUMN_RULE_MAX, text_table

    long = "bf16: bf16 params and activations, " * 9
    lines = text_table(("axis", "size"), [("pp", "2"), ("precision", long.strip())])
    assert lines[1] == "-" * len("precision") + "  " + "-" * LAST_COLUMN_RULE_MAX, lines[1]
    assert lines[3] == "precision  " + long.strip() and lines[2] == "pp         2", lines
    short = text_table(("axis", "size"), [("dp", "2"), ("tp", "4")])
    assert short == ["axis  size", "----  ----", "dp    2", "tp    4"], short
