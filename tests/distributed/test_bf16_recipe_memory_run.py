"""bf16 recipe: the activations a plan prices are the ones its ranks hold under torch.autocast (round 25, r25b;
`planner.autocast_dtypes`, RESULTS.md "Round 25 (r25b)").

Class: a plan made with precision="bf16" for an fp32 model RUNS the traced program under torch.autocast(bf16)
(`runtime.precision`), but every fp32 tensor was priced at 2 B/element; autocast keeps the residual stream, norm
inputs and outputs, the traced program's own fp32 casts and the loss's log-softmax in fp32, and copies each matmul
input to bf16 per consumer (three bf16 copies of Llama's RMSNorm output for q, k and v). Members: every plan kind
that prices activations on a rank (ddp, tp=2, fsdp) of GPT-2 (4 layers, gelu_new MLP, fused qkv Conv1D) and Llama
(2 layers, GQA). Each case: the price of each op's saved bytes on the rank (`local_storage.local_saved_bytes` under
the CPU autocast policy the ranks run) equals what each gloo rank's program keeps under autocast
(`benchmarks.saved_by_node.rank_held_saved_bytes`: saved-tensor hooks, each storage charged once to its first saver;
autocast's bf16 weight copies, priced with the parameters at 2 B/param, apart), per node within one fp32 scalar
(4 B: the data-parallel loss's count, not this class), and the plan keeps pricing what it did for fp32.
Before: the bf16 price was 40-50% below the held bytes on every case (RESULTS.md table).
"""
from __future__ import annotations

import contextlib
import io

import pytest

import parallelizer
from benchmarks.saved_by_node import WEIGHT_COPIES, rank_held_saved_bytes
from cost_model.topology import MeshTopology
from parallelizer.config import PlanConfig
from parallelizer.planner.api import resolve_cluster
from parallelizer.planner.costs import Pricer
from parallelizer.planner.local_storage import local_saved_bytes, plan_choice
from parallelizer.rewriter.spec import spec_from_plan
from parallelizer.runtime.launch import spawn
from parallelizer.zoo import hf

pytestmark = pytest.mark.distributed

MODELS = {"gpt2": (hf.gpt2, dict(batch=4, seq_len=16, n_layer=4, labels=True, returns="loss")),
          "llama": (hf.llama, dict(batch=4, seq_len=16, labels=True, returns="loss"))}
PLANS = {"ddp": ({"dp": 2}, {"dp": "ddp"}), "tp2": ({"tp": 2}, {"tp": "tp"}), "fsdp": ({"dp": 2}, {"dp": "fsdp"})}
CASES = [f"{m}-{p}" for m in MODELS for p in PLANS]


def _priced(traced, plan) -> dict[str, int]:
    mesh = plan.mesh
    pricer = Pricer(MeshTopology(resolve_cluster(None, mesh.world_size)[0], mesh.shape, mesh.axis_names), mesh,
                    PlanConfig(precision="bf16"), traced, autocast_device="cpu")  # the policy the gloo ranks run
    strategy_of, spaces = plan_choice(traced, plan.nodes, pricer.backward_nodes(traced))
    return {n: b for n, b in local_saved_bytes(traced, strategy_of, spaces, pricer).items() if b}


@pytest.fixture(scope="module")
def runs():
    """{case: (priced per node, [held per node of each rank], [weight copies of each rank], parameters)}."""
    planned, cases = {}, []
    for m, (fn, kw) in MODELS.items():
        model, args, kwargs = fn(**kw)
        traced = parallelizer.trace(model, args, kwargs)
        params = sum(p.numel for p in traced.parameters.values() if not p.is_buffer)
        for p, (mesh, roles) in PLANS.items():
            with contextlib.redirect_stdout(io.StringIO()):
                plan = parallelizer.plan(traced, mesh, axis_roles=roles, precision="bf16", recompute="none")
            assert plan.config["mixed_precision"] == "autocast_bf16"
            planned[f"{m}-{p}"] = (_priced(traced, plan), params)
            cases.append((fn, kw, spec_from_plan(plan)))
    per_rank = spawn(rank_held_saved_bytes, 2, cases, timeout_s=600)
    out = {}
    for i, case in enumerate(CASES):
        held = [dict(ranks[i]) for ranks in per_rank]
        copies = [h.pop(WEIGHT_COPIES, 0) for h in held]
        out[case] = (*planned[case][:1], [{n: b for n, b in h.items() if b} for h in held], copies, planned[case][1])
    return out


@pytest.mark.parametrize("case", CASES)
def test_bf16_activations_priced_per_node_as_the_ranks_hold_them_under_autocast(runs, case):
    priced, held, copies, params = runs[case]
    for rank, on_rank in enumerate(held):
        differ = {n: (priced.get(n), on_rank.get(n)) for n in set(priced) | set(on_rank)
                  if abs(priced.get(n, 0) - on_rank.get(n, 0)) > 4}
        assert not differ, (case, rank, differ)
        assert abs(sum(priced.values()) - sum(on_rank.values())) <= 4, (case, rank)
    # autocast's weight copies: at most the 2 B/param the bf16 table prices (a tp=2 rank holds half the matrices)
    for c in copies:
        assert 0 < c <= 2 * params, (case, c, params)
