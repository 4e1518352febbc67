"""The words `show` / `Plan.summary` use for a pipeline plan (r21g finding 8): where the pipeline cuts between
stages is named as stage boundaries, never "dp cut" (dp is the data-parallel mesh axis; data parallelism is not
a cut), for both values the plan JSON keeps ("dp": the dynamic program, "uniform")."""
import json
from importlib import resources

import pytest

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
