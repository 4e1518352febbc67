"""Rank body for test_pipeline: a pipelined GPT-2 against the single-device model (importable by name)."""
from __future__ import annotations

import copy
from unittest import mock

import torch
import torch.distributed as dist

from parallelizer import zoo
from parallelizer.rewriter import grad_sync
from parallelizer.runtime.pipeline import build, cut_stages
from parallelizer.runtime.pipeline_rehearsal import stage_diffs
from parallelizer.tracer.trace import trace


def mean_square(output, target) -> torch.Tensor:
    """The test's loss: mean of squared logits (target unused; pipelining passes one)."""
    logits = output[0] if isinstance(output, tuple) else output
    return logits.float().pow(2).mean()


def run_pipeline(rank: int, world_size: int, model_kwargs: dict, spec, pp: int, num_stages: int, schedule: str,
                 microbatches: int, steps: int = 3) -> dict:
    """Train `steps` AdamW steps pipelined and single-device; returns the largest differences seen."""
    model, (ids,) = zoo.gpt2(**model_kwargs)
    reference = copy.deepcopy(model)
    micro = ids.shape[0] // microbatches
    traced = trace(model, (ids[:micro],))
    run = build(traced, spec, cut_stages(traced, num_stages), model, pp=pp, schedule=schedule,
                microbatches=microbatches, loss_fn=mean_square)
    opt, ref_opt = optimizers(run, reference)
    with _counting_dp_syncs() as syncs:
        trained = train(run, reference, spec, ids, steps, opt, ref_opt)
    report = {"loss": abs(trained["losses"][0] - trained["ref_losses"][0]) if run.last else 0.0,
              "grad": trained["grad"], "stages": [m.program.graph_module.code for m in run.stages],
              "bucket_launches_per_step": syncs["bucket"] / steps, "sync_fallbacks": syncs["fallback"],
              "stage_param_bytes": [sum(p.numel() * p.element_size() for p in m.parameters()) for m in run.stages]}
    report["params"] = _worst(run, reference, spec, grads=False)
    report["accumulated"] = _accumulate(run, reference, spec, ids, opt, ref_opt)
    try:
        run.step(ids[:-1], target=torch.zeros(ids.shape[0] - 1))
    except ValueError as err:
        report["uneven_batch_error"] = str(err)
    dist.barrier()
    return report


class _counting_dp_syncs:
    """Counts the bucketed dp gradient all-reduces started (`grad_sync._start_all_reduce`) and the
    synchronous per-parameter sums (`grad_sync._sum`) while the context is open."""

    def __enter__(self) -> dict:
        counts = {"bucket": 0, "fallback": 0}

        def counted(kind, fn):
            def call(*args, **kwargs):
                counts[kind] += 1
                return fn(*args, **kwargs)
            return call
        self._patches = [mock.patch.object(grad_sync, "_start_all_reduce", counted("bucket", grad_sync._start_all_reduce)),
                         mock.patch.object(grad_sync, "_sum", counted("fallback", grad_sync._sum))]
        for patch in self._patches:
            patch.start()
        return counts

    def __exit__(self, *exc) -> None:
        for patch in self._patches:
            patch.stop()


def optimizers(run, reference) -> tuple:
    """AdamW over this rank's stage parameters and over the reference model's (the same settings)."""
    return (torch.optim.AdamW([p for m in run.stages for p in m.parameters()], lr=1e-3, eps=1e-6),
            torch.optim.AdamW(reference.parameters(), lr=1e-3, eps=1e-6))


def train(run, reference, spec, ids, steps: int, opt, ref_opt) -> dict:
    """`steps` optimizer steps of the pipelined run and the reference on the batch `ids`: per step the last
    stage's loss (mean of its microbatch losses; empty on other ranks) and the reference's, and the largest
    gradient difference after the first step."""
    out = {"losses": [], "ref_losses": [], "grad": 0.0}
    for step in range(steps):
        opt.zero_grad()
        ref_opt.zero_grad()
        losses: list = []
        run.step(ids, target=torch.zeros(ids.shape[0]), losses=losses)
        ref_loss = mean_square(reference(ids).logits, None)
        ref_loss.backward()
        if run.last:
            out["losses"].append(torch.stack(losses).mean().item())
        out["ref_losses"].append(ref_loss.item())
        if step == 0:
            out["grad"] = _worst(run, reference, spec, grads=True)
        opt.step()
        ref_opt.step()
    return out


def _accumulate(run, reference, spec, ids, opt, ref_opt) -> float:
    """Two batches accumulated before one optimizer step (pipelined: two `step` calls; eager: two
    backward calls): the largest gradient difference."""
    opt.zero_grad()
    ref_opt.zero_grad()
    for k in (1, 2):
        batch = torch.roll(ids, shifts=k, dims=1)
        run.step(batch, target=torch.zeros(ids.shape[0]))
        mean_square(reference(batch).logits, None).backward()
    return _worst(run, reference, spec, grads=True)


def _worst(run, reference, spec, grads: bool) -> float:
    return stage_diffs(run, reference, spec, None, grads=grads)[0]
