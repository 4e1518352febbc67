"""Sharded programs from real plans match the single-device model (issue: rewriter and runtime).

For the MLP, the in-repo GPT, transformers GPT-2 (tied embedding / lm_head) and Llama (GQA, RMSNorm,
rotary), with dropout off, on real gloo ranks at world sizes 1, 2 and 4: forward outputs, loss, every
gradient, and parameters after 3 AdamW steps agree within atol + rtol * |ref| (1e-5 each, fp32). Plans come
from the planner (`plan_cases`); one launch of ranks per world size runs every case.
"""
import pytest

from parallelizer.runtime.rehearsal import rehearse_many
from plan_cases import KINDS, MODELS, case

pytestmark = pytest.mark.distributed

CASES = {
    1: [(m, "dp") for m in MODELS],
    2: [(m, k) for m in MODELS for k in ("dp", "tp")],
    4: [(m, k) for m in MODELS for k in KINDS],
}


@pytest.fixture(scope="module")
def results():
    out = {}
    for world_size, cases in CASES.items():
        built = [case(m, k, world_size) for m, k in cases]
        reports = rehearse_many([(fn, kw, spec) for fn, kw, spec, _ in built], timeout_s=900)
        for (m, k), (_, _, _, plan), report in zip(cases, built, reports):
            out[(world_size, m, k)] = (plan, report)
    return out


@pytest.mark.parametrize("key", [(w, m, k) for w, cases in CASES.items() for m, k in cases],
                         ids=lambda key: "-".join(map(str, key)))
def test_matches_single_device(results, key):
    plan, report = results[key]
    assert report.matches(), f"{key}: {report}\nplan:\n{plan.summary()}"


def _stored_sharded(plan, axis):
    i = plan.mesh.axis_names.index(axis)
    return [p for p in plan.params.values() if not p.is_buffer and p.stored and "S" in _placements(p.stored)[i]]


def _placements(layout: str) -> list[str]:
    out, token = [], ""
    for ch in layout:
        token += ch
        if ch in "R)" or (ch == "P" and not layout[len("".join(out)) + len(token):].startswith("(")):
            out.append(token)
            token = ""
    return out


def test_every_plan_kind_was_exercised(results):
    """The planner's plans cover DDP, FSDP/ZeRO-3, tensor parallelism and a 2x2 DP x TP mesh."""
    plans = {key: plan for key, (plan, _) in results.items()}
    ddp = [k for k, p in plans.items() if k[0] > 1 and p.mesh.axis_names == ("dp",)
           and all(q.stored == "R" for q in p.params.values()) and p.steps("grad_all_reduce")]
    fsdp = [k for k, p in plans.items() if p.mesh.axis_names == ("dp",) and _stored_sharded(p, "dp")
            and any(s.bwd_kind == "reduce_scatter" for _, s in p.steps("all_gather"))]
    tp = [k for k, p in plans.items() if "tp" in p.mesh.axis_names and any(
        "S" in _placements(n.inputs[1])[p.mesh.axis_names.index("tp")]
        for n in p.nodes.values() if n.op == "aten.linear.default")]
    dp_tp = [k for k in tp if plans[k].mesh.shape == (2, 2) and plans[k].steps("grad_all_reduce")]
    assert ddp and fsdp and tp and dp_tp, (ddp, fsdp, tp, dp_tp)
