"""Rank body for test_boundary_compression_run: a pipelined GPT-2 (pp=2 x dp=2) trained with each boundary codec
against the single-device model (importable by name)."""
from __future__ import annotations

import copy
import time

import torch
import torch.distributed as dist

from parallelizer import zoo
from parallelizer.runtime.pipeline import build, cut_stages
from parallelizer.runtime.pipeline_rehearsal import stage_diffs
from parallelizer.tracer.trace import trace
from pipeline_workers import mean_square, optimizers, train


def run_arms(rank: int, world_size: int, model_kwargs: dict, spec, arms: tuple, microbatches: int,
             steps: int) -> list[dict]:
    """For each arm (codec kind or None on the one boundary; arms run in turn from the same seed): `steps`
    AdamW steps pipelined (pp=2, gpipe) and on one device. Per arm: the last stage's step losses (mean of
    its microbatch losses) and the reference's, the largest gradient difference at step 0 and parameter
    difference after the steps (this rank's shards), and this rank's parameters (for determinism checks)."""
    out = []
    initial, (ids,) = zoo.gpt2(**model_kwargs)
    traced = trace(initial, (ids[:ids.shape[0] // microbatches],))  # once: the stages copy the model's weights
    for kind in arms:
        model, reference = copy.deepcopy(initial), copy.deepcopy(initial)
        run = build(traced, spec, cut_stages(traced, 2), model, pp=2, schedule="gpipe", microbatches=microbatches,
                    loss_fn=mean_square, boundary=(kind,), boundary_rank=8)
        start = time.perf_counter()
        report = dict(train(run, reference, spec, ids, steps, *optimizers(run, reference)), kind=kind,
                      codecs=[tuple(c.wire_shape if c else None for c in m.out_codecs + m.in_codecs)
                              for m in run.stages])
        report["params"] = stage_diffs(run, reference, spec, None, grads=False)[0]
        report["seconds"] = time.perf_counter() - start
        report["state"] = {n: p.detach().clone() for n, p in run.stages[0].named_parameters()}
        out.append(report)
        dist.barrier()
    return out
