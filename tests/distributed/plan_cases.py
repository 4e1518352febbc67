"""Plans of each kind (DP, FSDP/ZeRO-3, TP, DP x TP) from the planner, for the numerics tests.

A plan is made for a WIDE version of each model on the meta device (where sharding pays off in the cost
model), then applied to a NARROW real model of the same structure: layouts refer to node names, which
depend only on the structure, and every sharded dim of the narrow model stays divisible.
"""
from __future__ import annotations

import contextlib
import dataclasses
import io

import parallelizer
from parallelizer import zoo
from parallelizer.config import PlanConfig
from parallelizer.core.mesh import MeshSpec
from parallelizer.planner.api import build
from parallelizer.planner.problem import min_memory_bytes
from parallelizer.rewriter.spec import spec_from_plan

# name -> (builder, wide kwargs where activations dominate (data parallel pays), wide kwargs where weights
#          dominate (tensor parallel pays), narrow kwargs for the real run)
MODELS = {
    "mlp": (zoo.mlp, dict(in_features=32, dim=64, hidden=256, depth=2, batch=8192),
            dict(in_features=32, dim=2048, hidden=8192, depth=2, batch=64),
            dict(in_features=32, dim=64, hidden=128, depth=2, batch=8)),
    "gpt": (zoo.gpt, dict(n_layer=2, n_embd=128, n_head=8, vocab_size=512, block_size=1024, batch=64, seq_len=1024),
            dict(n_layer=2, n_embd=2048, n_head=16, vocab_size=4096, block_size=256, batch=16, seq_len=256),
            dict(n_layer=2, n_embd=64, n_head=4, vocab_size=256, block_size=64, batch=8, seq_len=16)),
    "gpt2": (zoo.gpt2, dict(n_layer=2, n_embd=128, n_head=8, vocab_size=512, batch=64, seq_len=1024),
             dict(n_layer=2, n_embd=2048, n_head=16, vocab_size=4096, batch=16, seq_len=256),
             dict(n_layer=2, n_embd=64, n_head=4, vocab_size=256, batch=8, seq_len=16)),
    "llama": (zoo.llama, dict(num_hidden_layers=2, hidden_size=128, num_attention_heads=8, num_key_value_heads=4,
                              intermediate_size=352, vocab_size=512, batch=64, seq_len=1024),
              dict(num_hidden_layers=2, hidden_size=2048, num_attention_heads=16, num_key_value_heads=8,
                   intermediate_size=5632, vocab_size=4096, batch=16, seq_len=256),
              dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=8, num_key_value_heads=4,
                   intermediate_size=176, vocab_size=256, batch=8, seq_len=16)),
}

# kind -> (mesh of n devices, plan options, which wide config, memory squeeze)
KINDS = {
    "dp": (lambda n: {"dp": n}, {}, 1, False),
    "fsdp": (lambda n: {"dp": n}, {}, 1, True),
    "tp": (lambda n: {"tp": n}, {"data_axes": ()}, 2, False),
    "dp_tp": (lambda n: {"dp": 2, "tp": n // 2}, {"data_axes": ("dp",)}, 2, False),
}


def make_plan(model: str, kind: str, world_size: int):
    """The planner's plan of `kind` for the wide `model` on `world_size` devices. With a memory squeeze the
    budget is halfway between the least memory any plan needs and what the unconstrained plan uses."""
    builder, wide = MODELS[model][0], MODELS[model][KINDS[kind][2]]
    mesh_fn, options, _, squeeze = KINDS[kind]
    traced = parallelizer.trace(*builder(device="meta", **wide))
    mesh = mesh_fn(world_size)
    with contextlib.redirect_stdout(io.StringIO()):  # the solver library prints a banner
        plan = parallelizer.plan(traced, mesh, **options)
        if squeeze:
            spec = MeshSpec(tuple(mesh), tuple(mesh.values()))
            problem, _ = build(traced, spec, config=dataclasses.replace(PlanConfig(), **options))
            budget = (min_memory_bytes(problem) + plan.cost.memory_bytes["total"]) // 2
            plan = parallelizer.plan(traced, mesh, memory_budget_bytes=budget, **options)
    return plan


def case(model: str, kind: str, world_size: int):
    """(builder, narrow kwargs, spec, plan) of one rehearsal case."""
    builder, narrow = MODELS[model][0], MODELS[model][3]
    plan = make_plan(model, kind, world_size)
    return builder, narrow, spec_from_plan(plan), plan
