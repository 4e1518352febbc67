"""Shared test settings: offline Hugging Face, deterministic torch, a few small fixtures."""
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One intra-op thread per process (before torch is imported; spawned ranks inherit it): `make test` runs 2
# pytest workers whose launches start 2-4 ranks each on a 2-core machine, and more threads per process only
# oversubscribe it (test_contract.py: 27 s of CPU with the default threads, 23 s with one, under the same load).
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

torch.use_deterministic_algorithms(True, warn_only=True)


# `make test` runs `pytest -n 2 --dist loadfile --no-loadscope-reorder`: whole files go to the 2 workers in
# collection order (xdist's default reorder would queue files by test count, so the long single-test files ran
# last and one worker finished them alone). These files take longest (ordered by their time in a full run at
# 73a715b, after ranks started forking from a preloaded server): they start first, and the many short files
# fill in at the end. Order only; every file still runs.
LONG_FIRST = (
    "distributed/test_checkpoint.py",
    "distributed/test_numerics.py",
    "test_notebooks.py",
    "distributed/test_pipeline_run.py",
    "distributed/test_pipeline_rehearse.py",
    "distributed/test_step.py",
    "distributed/test_pipeline_eval.py",
    "distributed/test_schedules_run.py",
    "unit/test_cost_calibrate.py",
    "fuzz/test_fuzz_smoke.py",
    "unit/test_api_auto_parallelize.py",
    "distributed/test_semantics.py",
    "unit/test_plan_json_compact.py",
    "distributed/test_collectives.py",
    "distributed/test_recompute.py",
    "unit/test_pipeline_search.py",
    "distributed/test_issue_patterns.py",
    "distributed/test_stage_layouts_run.py",
    "distributed/test_boundary_compression_run.py",
    "distributed/test_models_smoke.py",
    "distributed/test_hierarchical.py",
    "distributed/test_pipeline_buffers.py",
    "distributed/test_contract.py",
    "distributed/test_mixed_precision.py",
    "distributed/test_grad_compression.py",
    "distributed/test_reshard.py",
    "distributed/test_reshard_after_backward_run.py",  # round 26 (r26c): one 4-rank launch, ~80 s under load
    "distributed/test_precision.py",
    "distributed/test_trial_findings.py",
    "rules/test_rule_harness.py",
    "distributed/test_rule_coverage_run.py",
    # round 25 (r25a): files of 10-16 s in the fresh clone's --durations (/tmp/r24/clone3_test.log) that were not
    # listed, so they ran in collection order, unit/test_vocab_parallel_price.py among the suite's last files
    "distributed/test_lean_layouts_run.py",
    "distributed/test_export_contract.py",
    "distributed/test_pipeline_findings.py",
    "distributed/test_local_storage_run.py",
    "unit/test_vocab_parallel_price.py",
    "distributed/test_pipeline_layer_kinds_run.py",
    # round 27 (r27b): 12-15 s set-ups in every quiet fresh clone of rounds 26-27 (/tmp/r27/clone0_test.log: 12.9 s)
    "distributed/test_bf16_recipe_memory_run.py",
)


def pytest_collection_modifyitems(session, config, items):
    """Put the files of LONG_FIRST first, in that order (a stable sort: other files and every file's tests keep
    their order)."""
    tests_dir = Path(__file__).resolve().parent
    rank = {name: i for i, name in enumerate(LONG_FIRST)}

    def key(item):
        path = Path(str(item.path)).resolve()
        name = path.relative_to(tests_dir).as_posix() if path.is_relative_to(tests_dir) else ""
        return rank.get(name, len(LONG_FIRST))

    items.sort(key=key)


# Launches that `runtime.spawn` re-ran once because a rank died by a crash signal without a report while the other
# ranks only lost their connection to it (RankCrashWarning, `parallelizer/runtime/rank_crash.py`): listed at the end
# of the run with the test that launched them (under xdist the controller receives the workers' warnings).
_RERUN_LAUNCHES: list[str] = []


def pytest_warning_recorded(warning_message, when, nodeid, location):
    if getattr(warning_message.category, "__name__", "") == "RankCrashWarning":
        first = str(warning_message.message).splitlines()[0]
        _RERUN_LAUNCHES.append(f"{nodeid or location}: {first}")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if _RERUN_LAUNCHES:
        terminalreporter.section("launches re-run after a rank died by a crash signal (RankCrashWarning)")
        for line in _RERUN_LAUNCHES:
            terminalreporter.write_line(line)
