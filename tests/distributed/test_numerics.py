"""Sharded programs from real plans match the single-device model (issue: rewriter and runtime).

For the MLP, the in-repo GPT, transformers GPT-2 (tied embedding / lm_head) and Llama (GQA, RMSNorm,
rotary), with dropout off, on real gloo ranks at world sizes 2 and 4: forward outputs, loss, every
gradient, and parameters after 3 AdamW steps agree within atol + rtol * |ref| (1e-5 each, fp32). Plans come
from the planner (`plan_cases`); one launch of ranks per world size runs every case.
"""
import pytest

from parallelizer.core.layout import Layout, Replicate
from parallelizer.runtime import DistributedError
from parallelizer.runtime.rehearsal import rehearse_many
from plan_cases import KINDS, MODELS, case

# pytest-timeout's 600 s (pyproject) covers the module fixture's setup too: two launches with deadlines of 900 s
# each (they name the ranks still running) must not be cut short by it on a loaded machine; a launch re-run after a
# rank's crash signal (`runtime.spawn`, RankCrashWarning) has a deadline of its own, within this on a normal run
pytestmark = [pytest.mark.distributed, pytest.mark.timeout(2100)]

CASES = {
    2: [(m, k) for m in MODELS for k in ("dp", "tp")],
    4: [(m, k) for m in MODELS for k in KINDS],
}
# Round 25 (r25a): cases of `make test-long` only (benchmarks/RESULTS.md, "Round 25 (r25a)"). Data parallelism on 2
# ranks runs the same program as on 4 (every rank the whole model, its batch rows, one gradient all-reduce): the
# 4-rank dp case of each model keeps that class in `make test`. The MLP's tp=2 is its tp=4 with wider shards (no
# head to split). tp=2 of the three attention models stays: 2 heads (llama: 2 key/value heads) per rank, where tp=4
# holds one, is the only case whose heads are split within a rank.
LONG = {(2, m, "dp") for m in MODELS} | {(2, "mlp", "tp")}
KEYS = [(w, m, k) for w, cases in CASES.items() for m, k in cases]


def _params(keys):
    return [pytest.param(key, marks=pytest.mark.long) if key in LONG else key for key in keys]


def _selected(request) -> list[tuple]:
    """The keys of this file's tests that this run executes (after `-m` / `-k` deselection): only their plans are
    made and only their cases launched, so `make test` does not pay for the cases of `make test-long`."""
    keys = {item.callspec.params["key"] for item in request.session.items
            if item.path == request.path and "key" in getattr(getattr(item, "callspec", None), "params", {})}
    return [key for key in KEYS if key in keys]


@pytest.fixture(scope="module")
def built(request):
    """(model fn, kwargs, spec, plan) per selected key; made without ranks, so that a failed launch leaves the tests
    of the plans' kinds standing."""
    return {key: case(key[1], key[2], key[0]) for key in _selected(request)}


@pytest.fixture(scope="module")
def results(built):
    """key -> (plan, report), or world size -> the DistributedError of its launch: a failed launch fails the tests
    of its own world size only, each with the launch's message (the rank, how it failed, its stack)."""
    out = {}
    for world_size in CASES:
        keys = [key for key in built if key[0] == world_size]
        if not keys:
            continue
        try:
            reports = rehearse_many([built[key][:3] for key in keys], timeout_s=900)
        except DistributedError as err:
            out[world_size] = err
            continue
        for key, report in zip(keys, reports):
            out[key] = (built[key][3], report)
    return out


@pytest.mark.parametrize("key", _params(KEYS), ids=lambda key: "-".join(map(str, key)))
def test_matches_single_device(results, key):
    if key[0] in results:
        pytest.fail(f"the {key[0]}-rank launch of every {key[0]}-rank case failed:\n{results[key[0]]}", pytrace=False)
    plan, report = results[key]
    assert report.matches(), f"{key}: {report}\nplan:\n{plan.summary()}"


def _on(plan, layout: str, axis: str):
    """The placement of a layout string on mesh axis `axis`."""
    return Layout.parse(layout).placements[plan.mesh.axis_names.index(axis)]


def _shardable(plan, param, axis: str) -> bool:
    return any(d > 1 and d % plan.mesh.size(axis) == 0 for d in param.shape)


def _kind_problems(plan, kind: str) -> list[str]:
    """What keeps `plan` from being a plan of `kind` (empty when it is one)."""
    params = [q for q in plan.params.values() if not q.is_buffer]
    placeholders = {ph for q in params for ph in q.placeholders}
    problems = []
    if kind in ("dp", "dp_tp"):
        problems += [f"{q.fqn} stored {q.stored}" for q in params if _on(plan, q.stored, "dp") != Replicate()]
        if not any(s.mesh_axis == "dp" for _, s in plan.steps("grad_all_reduce")):
            problems.append("no gradient all-reduce over dp")
    if kind == "fsdp":
        problems += [f"{q.fqn} {q.shape} stored {q.stored}" for q in params
                     if _shardable(plan, q, "dp") and _on(plan, q.stored, "dp") == Replicate()]
        if not any(s.bwd_kind == "reduce_scatter" for e, s in plan.steps("all_gather") if e.src in placeholders):
            problems.append("no parameter all-gather with a reduce-scatter backward")
    if kind in ("tp", "dp_tp"):
        problems += [f"{q.fqn} {q.shape} stored {q.stored}" for q in params
                     if len(q.shape) >= 2 and _shardable(plan, q, "tp") and _on(plan, q.stored, "tp") == Replicate()]
        problems += [f"{e.src} gathered over tp" for e, s in plan.steps("all_gather")
                     if e.src in placeholders and s.mesh_axis == "tp"]
        if not any(n.op == "aten.linear.default" and _on(plan, n.inputs[1], "tp") != Replicate()
                   for n in plan.nodes.values()):
            problems.append("no linear uses a weight sharded over tp")
    return problems


@pytest.mark.parametrize("key", _params(KEYS), ids=lambda key: "-".join(map(str, key)))
def test_plan_is_of_its_kind(built, key):
    """The planner option `axis_roles` forces each kind for every model: DDP (parameters replicated over dp,
    gradient all-reduce), FSDP/ZeRO-3 (parameters sharded over dp, all-gather with reduce-scatter
    backward), tensor parallelism (matmul weights sharded over tp and used sharded), and 2x2 DP x TP."""
    plan = built[key][3]
    assert not _kind_problems(plan, key[2]), f"{key}: {_kind_problems(plan, key[2])}\n{plan.summary()}"
