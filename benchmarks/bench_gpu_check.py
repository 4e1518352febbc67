"""Benchmark: the GPU presets' prices against one measured GPU (an H200 lent to a session), one device.

Every other runtime figure of this project is gloo on CPU; the GPU presets' prices were compared with published
step times only. This check runs the in-repo GPT (`parallelizer.zoo.gpt.GPT`: SDPA attention, tied lm_head,
loss in the graph) as a single-GPU training step and sets what was measured beside what the cost model prices
for the same model on the `h200:1x1` preset with the plan's bf16 mixed precision and AdamW.

It has two halves, because the GPU machine runs another torch than this project pins (its image's torch with
CUDA; this project's code is not imported there):

* ``predict`` (here, the pinned torch): trace each of `MODELS` on meta tensors, plan it on one H200
  (`{"dp": 1}`, precision "bf16", optimizer "adamw", no memory reserve) and write, per model, the priced forward,
  backward and optimizer seconds (`planner.steptime.estimate_step_time`) and the plan's memory by kind
  (`CostBreakdown.memory_bytes`).
* ``measure`` (on the GPU, torch only): the same model (zoo/gpt.py loaded as a file), fp32 weights under
  ``torch.autocast("cuda", torch.bfloat16)`` (what ``--precision bf16`` runs), ``torch.optim.AdamW`` (torch's
  default implementation on CUDA). `WARMUP` steps, then `STEPS` steps each timed by CUDA events per phase
  (forward, backward, optimizer; medians reported); peak memory is ``torch.cuda.max_memory_allocated`` over one
  step after the warm-up (what the caching allocator handed out: no fragmentation, no CUDA context). Eager, and
  with ``torch.compile`` for the models named in `COMPILED` (the GPU presets price pointwise chains fused, as
  torch.compile fuses them: docs/architecture.md, cost model).
* ``report``: join the two JSON files into the table of benchmarks/RESULTS.md.

Run: ``python -m benchmarks.bench_gpu_check predict OUT.json`` here; ``python3 benchmarks/bench_gpu_check.py
measure OUT.json`` on the GPU machine; ``python -m benchmarks.bench_gpu_check report PRED.json MEAS.json``.
"""
from __future__ import annotations

import importlib.util
import json
import os
import statistics
import sys
import time

import torch

# name -> (GPTConfig fields, batch, sequence length). GPT-2 medium-like, a 1.3B-like (GPT-3 XL widths at 16
# layers) and a wide 4-layer model (hidden 4096: Llama-7B's width), each sized to run in seconds on one H200.
MODELS = {
    "gpt h1024 L24 s1024 b8": (dict(n_embd=1024, n_layer=24, n_head=16, vocab_size=50304, block_size=1024), 8, 1024),
    "gpt h2048 L16 s2048 b4": (dict(n_embd=2048, n_layer=16, n_head=16, vocab_size=50304, block_size=2048), 4, 2048),
    "gpt h4096 L4 s2048 b4": (dict(n_embd=4096, n_layer=4, n_head=32, vocab_size=50304, block_size=2048), 4, 2048),
}
COMPILED = ("gpt h1024 L24 s1024 b8", "gpt h2048 L16 s2048 b4")
WARMUP, STEPS = 3, 10
_GPT_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "parallelizer", "zoo", "gpt.py")


def _gpt_module():
    """parallelizer/zoo/gpt.py loaded alone (torch only), so the GPU machine needs nothing of this package."""
    spec = importlib.util.spec_from_file_location("_bench_gpt", _GPT_FILE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def predict(path: str) -> None:
    """Price every model of `MODELS` on one H200 (module docstring) and write {model: {...}} to `path`."""
    import contextlib
    import io

    import parallelizer
    from parallelizer.planner.steptime import estimate_step_time
    gpt = _gpt_module()
    out = {}
    for name, (config, batch, seq) in MODELS.items():
        with torch.device("meta"):
            model = gpt.GPT(gpt.GPTConfig(**config))
        idx = torch.zeros(batch, seq, dtype=torch.long, device="meta")
        traced = parallelizer.trace(model, (idx, idx))
        with contextlib.redirect_stdout(io.StringIO()):  # the solver library prints a banner
            plan = parallelizer.plan(traced, {"dp": 1}, cluster="h200:1x1", precision="bf16", optimizer="adamw",
                                     memory_reserve_bytes=0)
        est = estimate_step_time(traced, plan, cluster="h200:1x1")
        out[name] = {"forward_s": est.forward_compute_s, "backward_s": est.backward_compute_s + est.recompute_s,
                     "optimizer_s": est.optimizer_s, "step_s": est.total_s, "memory_bytes": plan.cost.memory_bytes,
                     "recompute": dict(plan.recompute),
                     "parameters": sum(p.numel() for p in model.parameters())}
        print(name, json.dumps(out[name]), flush=True)
    with open(path, "w") as f:
        json.dump(out, f, indent=1)


def _measure_one(gpt, config: dict, batch: int, seq: int, compiled: bool) -> dict:
    torch.manual_seed(0)
    model = gpt.GPT(gpt.GPTConfig(**config)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    idx = torch.randint(0, config["vocab_size"], (batch, seq), device="cuda")
    targets = torch.roll(idx, -1, dims=1)
    run = torch.compile(model) if compiled else model
    events = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
    phases = {"forward_s": [], "backward_s": [], "optimizer_s": [], "step_s": []}
    start = time.perf_counter()
    for i in range(WARMUP + STEPS):
        if i == WARMUP:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        events[0].record()
        with torch.autocast("cuda", torch.bfloat16):
            loss = run(idx, targets)
        events[1].record()
        loss.backward()
        events[2].record()
        opt.step()
        opt.zero_grad(set_to_none=True)
        events[3].record()
        torch.cuda.synchronize()
        if i == WARMUP:
            peak = torch.cuda.max_memory_allocated()
        if i >= WARMUP:
            t = [events[0].elapsed_time(e) / 1e3 for e in events[1:]]
            phases["forward_s"].append(t[0])
            phases["backward_s"].append(t[1] - t[0])
            phases["optimizer_s"].append(t[2] - t[1])
            phases["step_s"].append(t[2])
    result = {k: statistics.median(v) for k, v in phases.items()}
    result.update(peak_bytes=peak, held_between_steps_bytes=base, loss=float(loss),
                  wall_s=time.perf_counter() - start)
    del model, opt, run, loss
    torch.cuda.empty_cache()
    return result


def measure(path: str) -> None:
    """Measure every model of `MODELS` (eager, and compiled for `COMPILED`) on this machine's GPU; write
    {model: {"eager": {...}, "compiled": {...}}} to `path` after each run (a later failure keeps the earlier)."""
    gpt = _gpt_module()
    torch.backends.cuda.matmul.allow_tf32 = True
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    for mode in ("eager", "compiled"):
        for name, (config, batch, seq) in MODELS.items():
            if mode == "compiled" and name not in COMPILED:
                continue
            try:
                r = _measure_one(gpt, config, batch, seq, mode == "compiled")
            except Exception as e:  # report and go on: one failing mode must not lose the others' figures
                r = {"error": f"{type(e).__name__}: {e}"[:500]}
            out.setdefault(name, {})[mode] = r
            print(name, mode, json.dumps(r), flush=True)
            with open(path, "w") as f:
                json.dump(out, f, indent=1)


def _saved_by_kind(model, run_forward) -> dict:
    """Bytes of the storages autograd keeps for backward during `run_forward()`, each storage once, grouped as
    "weight casts" (bf16 copies of parameters that autocast makes and backward keeps), and the rest by dtype and
    shape (largest groups first); parameter storages themselves are not counted."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    shapes = {tuple(p.shape) for p in model.parameters()}
    seen, groups = set(), {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params and ptr not in seen:
            seen.add(ptr)
            kind = "weight casts" if tuple(t.shape) in shapes and t.dtype in (torch.bfloat16, torch.float16) else \
                f"{str(t.dtype).removeprefix('torch.')} {tuple(t.shape)}"
            n, b = groups.get(kind, (0, 0))
            groups[kind] = (n + 1, b + t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = run_forward()
    return loss, dict(sorted(groups.items(), key=lambda kv: -kv[1][1]))


def _bf16_weights_call(model, idx, targets):
    """One forward in the priced bf16 recipe (bf16 weights and activations, fp32 main weights; no autocast): each
    parameter cast to bf16 at its use (`torch.func.functional_call`; the cast's backward returns fp32 gradients)."""
    weights = {n: p.to(torch.bfloat16) for n, p in model.named_parameters()}
    return torch.func.functional_call(model, weights, (idx, targets))


def memory(path: str) -> None:
    """Per model (eager): bytes held above the training state after forward, kept for backward (`_saved_by_kind`),
    the peaks of forward, backward and the optimizer step, and the optimizer step's seconds, for three recipes:
    bf16 autocast with torch's default AdamW (foreach on CUDA), the same with ``fused=True``, and the priced recipe
    (`_bf16_weights_call`) with the fused AdamW; JSON to `path`."""
    gpt = _gpt_module()
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}

    def autocast_call(model, idx, targets):
        with torch.autocast("cuda", torch.bfloat16):
            return model(idx, targets)
    recipes = {"foreach": (False, autocast_call), "fused": (True, autocast_call),
               "bf16 weights": (True, _bf16_weights_call)}
    for name, (config, batch, seq) in MODELS.items():
        torch.manual_seed(0)
        model = gpt.GPT(gpt.GPTConfig(**config)).cuda()
        idx = torch.randint(0, config["vocab_size"], (batch, seq), device="cuda")
        targets = torch.roll(idx, -1, dims=1)
        r = {}
        for recipe, (fused, call) in recipes.items():
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused or None)
            for _ in range(2):  # warm-up: optimizer state allocated
                call(model, idx, targets).backward()
                opt.step()
            torch.cuda.synchronize()
            times = []
            for _ in range(STEPS):  # the step alone, gradients in place
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                opt.step()
                b.record()
                torch.cuda.synchronize()
                times.append(a.elapsed_time(b) / 1e3)
            opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            loss, saved = _saved_by_kind(model, lambda: call(model, idx, targets))
            torch.cuda.synchronize()
            held = torch.cuda.memory_allocated() - base
            peak_fwd = torch.cuda.max_memory_allocated() - base
            torch.cuda.reset_peak_memory_stats()
            loss.backward()
            torch.cuda.synchronize()
            peak_bwd = torch.cuda.max_memory_allocated() - base
            grads = torch.cuda.memory_allocated() - base
            torch.cuda.reset_peak_memory_stats()
            opt.step()
            torch.cuda.synchronize()
            peak_opt = torch.cuda.max_memory_allocated() - base
            r[recipe] = {
                "optimizer_s": statistics.median(times), "state_bytes": base, "held_after_forward": held,
                "peak_forward": peak_fwd, "peak_backward": peak_bwd, "grads": grads, "peak_optimizer": peak_opt,
                "saved_total": sum(b for _, b in saved.values()), "loss": float(loss.detach()),
                "saved": {k: v for k, v in list(saved.items())[:14]}}
            opt.zero_grad(set_to_none=True)
            del opt, loss
            torch.cuda.empty_cache()
        out[name] = r
        print(name, json.dumps(r), flush=True)
        with open(path, "w") as f:
            json.dump(out, f, indent=1)
        del model
        torch.cuda.empty_cache()


def report(pred_path: str, meas_path: str) -> None:
    """Print the RESULTS.md table: priced vs measured per model and phase (ms), memory (GB)."""
    pred, meas = json.load(open(pred_path)), json.load(open(meas_path))
    print(f"measured on {meas['device']} (torch {meas['torch']}); priced on the h200 preset\n")
    print("| model | params | run | forward ms priced / measured | backward ms | optimizer ms | step ms | step error "
          "| peak GB priced / measured | error |\n|---|---|---|---|---|---|---|---|---|---|")
    for name, p in pred.items():
        for mode, m in meas.get(name, {}).items():
            if "error" in m:
                print(f"| {name} | | {mode} | {m['error']} |||||||")
                continue
            cells = " | ".join(f"{p[k] * 1e3:.1f} / {m[k] * 1e3:.1f}" for k in ("forward_s", "backward_s",
                                                                               "optimizer_s", "step_s"))
            total = p["memory_bytes"]["total"]
            print(f"| {name} | {p['parameters'] / 1e9:.2f} B | {mode} | {cells} | {p['step_s'] / m['step_s'] - 1:+.0%} "
                  f"| {total / 1e9:.2f} / {m['peak_bytes'] / 1e9:.2f} | {total / m['peak_bytes'] - 1:+.1%} |")


if __name__ == "__main__":
    modes = {"predict": predict, "measure": measure, "memory": memory, "report": report}
    if len(sys.argv) < 3 or sys.argv[1] not in modes:
        raise SystemExit(__doc__)
    modes[sys.argv[1]](*sys.argv[2:])
