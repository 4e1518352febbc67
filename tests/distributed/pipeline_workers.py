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


def run_bf16_pipeline(rank: int, world_size: int, model_fn, model_kwargs: dict, spec, pipe: dict,
                      steps: int = 3) -> dict:
    """A pipeline plan with the bf16 recipe (`spec.autocast`) trained `steps` AdamW steps against the eager
    single-device model under the same torch.autocast(bfloat16) over the same microbatches (and the eager model
    without autocast, `exact`, for the recipe bound and to show the rounding is there). Per quantity:
    (largest |diff| against the autocast reference, its ratio to the bound (`_max_diff`: bf16 tolerance or
    `recipe_excess`), largest |diff| against `exact`); the dtypes this rank's stages other than the last send
    to the next stage; the dtypes its stage programs output."""
    from parallelizer.runtime.pipeline_rehearsal import _accumulated_reference, _weighting, pipeline_run
    from parallelizer.runtime.rehearsal import RECIPE_ADAM_EPS, _max_diff

    torch.manual_seed(0)
    model, inputs = model_fn(**model_kwargs)[:2]
    reference, exact = copy.deepcopy(model), copy.deepcopy(model)
    run, traced, flat, _ = pipeline_run(model, inputs, {}, spec, pipe)
    target, count, weights = _weighting(traced, flat, pipe["microbatches"], model)
    out_dtypes: list = []
    for stage in run.stages:
        stage.register_forward_hook(lambda mod, args, out: out_dtypes.append(tuple(t.dtype for t in out)))
    opts = [torch.optim.AdamW(params, lr=1e-3, eps=RECIPE_ADAM_EPS) for params in
            ([p for m in run.stages for p in m.parameters()], reference.parameters(), exact.parameters())]
    bf16 = torch.bfloat16
    worst = {k: (0.0, 0.0, 0.0) for k in ("loss", "grad", "params")}

    def keep(key, against_ref, against_exact):
        a = worst[key]
        worst[key] = (max(a[0], against_ref[0]), max(a[1], against_ref[2]), max(a[2], against_exact[0]))

    for step in range(steps):
        for o in opts:
            o.zero_grad()
        batch_loss = run.step(*flat, target=target, item_count=count)
        ref_loss = _accumulated_reference(reference, inputs, {}, weights, spec.autocast)
        exact_loss = _accumulated_reference(exact, inputs, {}, weights)
        if run.last:
            keep("loss", _max_diff([("loss", batch_loss, ref_loss, exact_loss)], bf16),
                 _max_diff([("loss", batch_loss, exact_loss)], None))
        keep("grad", stage_diffs(run, reference, spec, bf16, grads=True, exact=exact),
             stage_diffs(run, exact, spec, None, grads=True))
        for o in opts:
            o.step()
    keep("params", stage_diffs(run, reference, spec, bf16, exact=exact), stage_diffs(run, exact, spec, None))
    dist.barrier()
    inner = [m for m in run.stages if _stage_index(m) < len(pipe["stages"]) - 1]  # they send to a next stage
    return {**worst, "sent": sorted({str(d) for m in inner for d in m.sent_dtypes}),
            "outputs": sorted({str(d) for dts in out_dtypes for d in dts}), "last": run.last}


def _stage_index(module) -> int:
    """k of a stage module (its graph's note "pipeline stage k of n", `runtime.pipeline.stage_graph`)."""
    return int(module.traced.notes[0].split()[2])


def judged_with_a_wrong_gradient(rank: int, world_size: int, *args, factor: float = 1.001) -> dict:
    """`pipeline_rehearsal._rank_judged` with every step's gradient of blocks.1.linear.weight scaled by `factor`
    after the schedule ran (a wrong program by 0.1% by default): the float64 judge must still flag it."""
    from parallelizer.runtime import pipeline_rehearsal
    from parallelizer.runtime.pipeline import PipelineRun

    step = PipelineRun.step

    def wrong_step(self, *a, **k):
        out = step(self, *a, **k)
        for stage in self.stages:
            for name, p in stage.named_parameters():
                if name == "blocks.1.linear.weight" and p.grad is not None:
                    p.grad.mul_(factor)
        return out

    with mock.patch.object(PipelineRun, "step", wrong_step):
        return pipeline_rehearsal._rank_judged(rank, world_size, *args)
