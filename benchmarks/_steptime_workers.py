"""Rank-side code of `benchmarks.bench_steptime` (spawned functions must live in an importable module).

`time_rank` builds every case's model on this rank (seeded: all ranks hold the same weights), applies the case's
plan (`ParallelModule`, the runtime's default gradient buckets) with an AdamW optimizer, and times training
steps: zero_grad, forward on the full batch (the module takes its own slice), the model's loss
(`rehearsal._loss`: its own scalar loss, else the mean square of its output), backward, AdamW step, barrier.
A pipeline case (a plan JSON) is applied by `parallelizer.auto_parallelize` and stepped with
`pm.step(ids, target=next tokens, loss_fn=cross-entropy of the logits)` (`runtime.step`), then AdamW, barrier.
Cases are interleaved: `warmup` untimed rounds, then `rounds` timed rounds, each running `steps_per_round` steps
of every case in turn (ABCABC..., not all of A then all of B), so a slow phase of the shared machine hits all
cases alike; each round runs the cases in its own order (`round_order`: seeded by the round's number, the same
on every rank), so no case always runs first or after the same neighbour (a randomised complete block design).
The cases of one model run together in a round, after one untimed step of the first of them: the first step
after another model's ran slower (in both idle runs of 2026-12-03, 11:50 and 14:31 UTC, the plan timed first
for its model, "free dp=2", measured 1.13-1.19x ddp paired per round on GPT-2 and 1.04-1.15x on Llama, while
the same program timed later in the round, "free tp=2", measured 0.96-1.11x and 0.96-1.06x). Returns per case
the wall seconds of every timed step and the CPU seconds this rank's process spent in it (`time.process_time`: every
thread, gloo's too), a figure other jobs on the machine move far less than wall time.
"""
from __future__ import annotations

import random
import time

import torch
import torch.distributed as dist

import torch.nn.functional as F

from parallelizer import Plan, auto_parallelize, zoo
from parallelizer.rewriter.spec import ShardingSpec, all_axis_groups
from parallelizer.runtime.launch import create_groups
from parallelizer.runtime.module import ParallelModule
from parallelizer.runtime.rehearsal import _loss as rehearsal_loss
from parallelizer.tracer.trace import trace


def build(model: str, kwargs: dict):
    """(model, inputs, kwargs) of a zoo builder by name (`zoo.BUILDERS`)."""
    model_, inputs, *rest = zoo.BUILDERS[model](**kwargs)
    return model_, inputs, (rest[0] if rest else {})


def _step(pm: ParallelModule, opt: torch.optim.Optimizer, inputs: tuple, kwargs: dict):
    def step() -> None:
        opt.zero_grad(set_to_none=True)
        rehearsal_loss(pm(*inputs, **kwargs)).backward()
        opt.step()
        dist.barrier()
    return step


def _next_token_loss(output, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of a causal LM's logits (batch, seq, vocab) against `target` (batch, seq)."""
    logits = output.logits if hasattr(output, "logits") else output[0]
    return F.cross_entropy(logits.flatten(0, 1), target.flatten())


def _pipeline_step(pm, opt: torch.optim.Optimizer, ids: torch.Tensor):
    target = torch.roll(ids, -1, dims=1)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        pm.step(ids, target=target, loss_fn=_next_token_loss)
        opt.step()
        dist.barrier()
    return step


def round_order(groups: list, r: int) -> list[int]:
    """Case indices of timed round `r` of cases whose models are `groups` (one key per case): the cases of one
    model contiguous, the models' order and the order within each shuffled with seed `r` (module docstring)."""
    rng = random.Random(1000 + r)
    keys = sorted(set(groups), key=groups.index)
    rng.shuffle(keys)
    order = []
    for key in keys:
        members = [i for i, g in enumerate(groups) if g == key]
        rng.shuffle(members)
        order += members
    return order


def time_rank(rank: int, world_size: int, cases: list[tuple], warmup: int, rounds: int,
              steps_per_round: int) -> dict[str, list[list[float]]]:
    """{"wall": seconds, "cpu": process CPU seconds} of each timed step of each case on this rank (module
    docstring): ("spec", model name, builder kwargs, `ShardingSpec`) or ("pipeline", model name, builder
    kwargs, plan JSON)."""
    torch.set_num_threads(1)  # one compute thread per rank, as calibrated
    traced_by_model: dict = {}
    steps = []
    for what, model, kwargs, plan in cases:
        module, inputs, kw = build(model, kwargs)
        if what == "pipeline":
            pm = auto_parallelize(module, inputs, plan=Plan.from_json(plan))
            steps.append(_pipeline_step(pm, torch.optim.AdamW(pm.parameters(), lr=1e-4), inputs[0]))
            continue
        key = (model, tuple(sorted(kwargs.items())))
        if key not in traced_by_model:
            traced_by_model[key] = trace(module, inputs, kw)
        spec: ShardingSpec = plan
        create_groups(all_axis_groups(spec.mesh))
        pm = ParallelModule(traced_by_model[key], spec, rank, module)
        steps.append(_step(pm, torch.optim.AdamW(pm.parameters(), lr=1e-4), inputs, kw))
    for _ in range(warmup):
        for step in steps:
            step()
    wall: list[list[float]] = [[] for _ in cases]
    cpu: list[list[float]] = [[] for _ in cases]
    models = [case[1] for case in cases]
    for r in range(rounds):
        previous = None
        for i in round_order(models, r):
            if models[i] != previous:  # the first step after another model's is slower (module docstring)
                steps[i]()
                previous = models[i]
            for _ in range(steps_per_round):
                dist.barrier()
                start, start_cpu = time.perf_counter(), time.process_time()
                steps[i]()
                wall[i].append(time.perf_counter() - start)
                cpu[i].append(time.process_time() - start_cpu)
    return {"wall": wall, "cpu": cpu}
