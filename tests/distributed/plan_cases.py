"""Plans of each kind (DP, FSDP/ZeRO-3, TP, DP x TP) from the planner, for the numerics tests.

A plan is made for a WIDE version of each model on the meta device (where data parallelism pays off in the
cost model), with the kind forced through the planner option `axis_roles`, then applied to a NARROW real
model of the same structure: layouts refer to node names, which depend only on the structure, and every
sharded dim of the narrow model stays divisible.
"""
from __future__ import annotations

import contextlib
import functools
import io

import numpy as np

import parallelizer
from parallelizer.config import PlanConfig
from parallelizer.planner.api import build as build_problem, to_plan
from parallelizer.planner.ilp import solve
from parallelizer import zoo
from parallelizer.rewriter.spec import spec_from_plan

# name -> (builder, wide kwargs for planning (activations large enough that data parallelism pays in the cost
#          model), narrow kwargs for the real run)
MODELS = {
    "mlp": (zoo.mlp, dict(in_features=32, dim=64, hidden=256, depth=2, batch=8192),
            dict(in_features=32, dim=64, hidden=128, depth=2, batch=8)),
    "gpt": (zoo.gpt, dict(n_layer=2, n_embd=128, n_head=8, vocab_size=512, block_size=1024, batch=64, seq_len=1024),
            dict(n_layer=2, n_embd=64, n_head=4, vocab_size=256, block_size=64, batch=8, seq_len=16)),
    "gpt2": (zoo.gpt2, dict(n_layer=2, n_embd=128, n_head=8, vocab_size=512, batch=64, seq_len=1024),
             dict(n_layer=2, n_embd=64, n_head=4, vocab_size=256, batch=8, seq_len=16)),
    "llama": (zoo.llama, dict(num_hidden_layers=2, hidden_size=128, num_attention_heads=8, num_key_value_heads=4,
                              intermediate_size=352, vocab_size=512, batch=64, seq_len=1024),
              dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=8, num_key_value_heads=4,
                   intermediate_size=176, vocab_size=256, batch=8, seq_len=16)),
}

# kind -> (mesh of n devices, the planner's axis roles that force the kind)
KINDS = {
    "dp": (lambda n: {"dp": n}, {"dp": "ddp"}),
    "fsdp": (lambda n: {"dp": n}, {"dp": "fsdp"}),
    "tp": (lambda n: {"tp": n}, {"tp": "tp"}),
    "dp_tp": (lambda n: {"dp": 2, "tp": n // 2}, {"dp": "ddp", "tp": "tp"}),
}


@functools.cache
def wide_graph(model: str):
    """The wide `model` traced on the meta device, once per model (the planner only reads the graph; tracing
    costs seconds, and every kind and world size plans the same graph)."""
    builder, wide = MODELS[model][0], MODELS[model][1]
    return parallelizer.trace(*builder(device="meta", **wide))


def make_plan(model: str, kind: str, world_size: int):
    """The planner's plan of `kind` (forced by `PlanConfig.axis_roles`) for the wide `model` on `world_size`
    devices."""
    mesh_fn, roles = KINDS[kind]
    traced = wide_graph(model)
    with contextlib.redirect_stdout(io.StringIO()):  # the solver library prints a banner
        return parallelizer.plan(traced, mesh_fn(world_size), axis_roles=roles)


def case(model: str, kind: str, world_size: int):
    """(builder, narrow kwargs, spec, plan) of one rehearsal case."""
    builder, narrow = MODELS[model][0], MODELS[model][2]
    plan = make_plan(model, kind, world_size)
    return builder, narrow, spec_from_plan(plan), plan


@functools.cache
def traced_of(builder):
    """The trace of `builder()`'s model and inputs (a module-level function of no arguments), once per builder
    in this process, as `wide_graph`: the planner only reads the graph, and a test file planning one model on
    several meshes, roles or random costs traced it once per plan before (round 21: test_rule_coverage_run
    traced its 10 models 34 times)."""
    model, inputs = builder()[:2]
    with contextlib.redirect_stdout(io.StringIO()):
        return parallelizer.trace(model, inputs)


def random_cost_plan(builder, mesh, roles, seed):
    """A plan whose ILP costs are replaced by random ones (as `tests/fuzz/run_fuzz.py`), for unusual layouts."""
    with contextlib.redirect_stdout(io.StringIO()):
        traced, config = traced_of(builder), PlanConfig(axis_roles=roles)
        problem, pricer = build_problem(traced, parallelizer.core.MeshSpec(tuple(mesh), tuple(mesh.values())),
                                        config=config)
        rng = np.random.default_rng(seed)
        problem.lin = [np.where(np.isfinite(v), rng.random(v.shape), v) for v in problem.lin]
        problem.pairs = {k: np.where(np.isfinite(m), rng.random(m.shape), m) for k, m in problem.pairs.items()}
        for shared in problem.shared:  # keys priced once (`planner.shared_uses`)
            shared.cost = rng.random(shared.cost.shape)
        return to_plan(traced, problem, pricer, solve(problem, config), config)
