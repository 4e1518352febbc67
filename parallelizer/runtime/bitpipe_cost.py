"""The per-action host cost of the package's own BitPipe runner (`runtime.bitpipe`), for the calibration profile.

`cost_model` is a leaf package and cannot import the runtime, so the calibration measures torch's pipelining
runtime itself (`cost_model.pipeline_actions`) and this module registers a benchmark of our runner with it
(`register`, called by the `parallelizer calibrate` CLI); the profile records the result as
`PipelineActionCost.own_runner`, which `planner.simulate` charges BitPipe's actions (issue 14, round 17).

What is measured (`measure_bitpipe_actions`): 2 spawned gloo ranks, the model `_Tiny` (4 blocks of one
`Linear(8, 8)`: near-zero compute) planned as pp=2 BitPipe with 2 virtual stages and 8 microbatches, `steps`
steps after 2 warm-up steps. Per action of `BitPipeRunner.step`'s list its per-thread CPU time
(`time.thread_time`, as `cost_model.pipeline_actions`), less the cross-rank sends / receives it made (timed
apart: `BitPipeRunner._send` / `_receive`, only those whose peer is another rank, since the simulator charges
same-rank hand-offs nothing; a receive's sample includes its share of posting the step's receives at its start) and less the stage program's own compute (its fx forward alone, a backward
through it: what the cost model prices). Step = the step's CPU less its actions'. Medians over both ranks.
"""
from __future__ import annotations

import contextlib
import io
import time
from collections import defaultdict

import torch

from cost_model.hardware import PipelineActionCost
from cost_model.pipeline_actions import action_cost_from_samples, register_own_runner_benchmark

_MICROBATCHES, _WIDTH, _BLOCKS = 8, 8, 4


class _Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(_WIDTH, _WIDTH) for _ in range(_BLOCKS))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def _loss(out, target):
    return torch.nn.functional.mse_loss(out[0] if isinstance(out, (tuple, list)) else out, target)


def _timed_runner(runner, cpu: dict) -> None:
    """Wrap this runner's `_send` / `_receive` (cross-rank ones timed as "send" / "recv") and its action list
    (each action's CPU less the sends / receives inside it, as "F" / "B"). The runner posts every cross-rank
    receive at the step's start (`BitPipeRunner._post_receives`, round 25): that posting's CPU, shared equally
    over the receives it posted, is added to each of their "recv" samples (the simulator charges it per receive)."""
    send, receive, post, actions = runner._send, runner._receive, runner._post_receives, runner.actions
    to_rank, me = runner.schedule.stage_to_rank, runner.pp_rank
    share = [0.0]  # this step's posting CPU per posted receive

    def timed(kind, fn, cross):
        def call(*a, **k):
            crosses, start = cross(*a), time.thread_time()
            try:
                return fn(*a, **k)
            finally:
                if crosses:
                    cpu[kind].append(time.thread_time() - start)
                    if kind == "recv":
                        cpu["recv posting"].append(share[0])
        return call

    def posting():
        start = time.thread_time()
        posted = post()
        share[0] = (time.thread_time() - start) / max(1, len(posted))
        return posted
    runner._send = timed("send", send, lambda sends, box, kind, to_x, *rest: to_rank[to_x] != me)
    runner._receive = timed("recv", receive, lambda posted, box, kind, x, j, examples: (kind, x, j) in posted)
    runner._post_receives = posting

    class Timed:
        def __iter__(self):
            for a in actions:
                n = len(cpu["send"]), len(cpu["recv"])
                start = time.thread_time()
                yield a
                io_s = sum(cpu["send"][n[0]:]) + sum(cpu["recv"][n[1]:])
                cpu[a.computation_type.value].append(time.thread_time() - start - io_s)

        def __len__(self):
            return len(actions)
    runner.actions = Timed()


def _bare(run, repeats: int) -> dict[str, list[float]]:
    """Per-thread CPU seconds of each stage's fx program alone: forward; a backward through it."""
    out: dict[str, list[float]] = defaultdict(list)
    for stage in run.stages:
        gm = stage.program.graph_module
        shapes = [tuple(stage.traced.node(n).outputs[0].shape) for n in stage.traced.input_names]
        for r in range(repeats + 2):
            ins = [torch.randn(s, requires_grad=True) for s in shapes]
            start = time.thread_time()
            outs = gm(*stage._state(), *ins)
            f = time.thread_time() - start
            outs = [t for t in (outs if isinstance(outs, (tuple, list)) else [outs]) if t.requires_grad]
            start = time.thread_time()
            torch.autograd.backward(outs, [torch.ones_like(t) for t in outs])
            if r >= 2:
                out["F"].append(f)
                out["B"].append(time.thread_time() - start)
    return dict(out)


def _rank(rank: int, world: int, steps: int) -> tuple[dict, dict]:
    import parallelizer
    torch.set_num_threads(1)
    torch.manual_seed(0)
    x = torch.randn(_MICROBATCHES, _WIDTH, generator=torch.Generator().manual_seed(1))
    y = torch.randn(_MICROBATCHES, _WIDTH, generator=torch.Generator().manual_seed(2))
    with contextlib.redirect_stdout(io.StringIO()):
        pm = parallelizer.auto_parallelize(_Tiny(), (x,), mesh={"pp": 2}, schedule="bitpipe",
                                           microbatches=_MICROBATCHES, virtual_stages=2)
    cpu: dict[str, list[float]] = defaultdict(list)
    for i in range(steps + 2):
        if i == 2:  # after 2 warm-up steps
            _timed_runner(pm.run.schedule, cpu)
        start = time.thread_time()
        inside = sum(map(sum, cpu.values()))
        pm.step(x, target=y, loss_fn=_loss)
        if i >= 2:
            cpu["step loop"].append(time.thread_time() - start - (sum(map(sum, cpu.values())) - inside))
        for p in pm.parameters():
            p.grad = None
    cpu["send action"] = cpu.pop("send", [])
    cpu["recv action"] = [r + s for r, s in zip(cpu.pop("recv", []), cpu.pop("recv posting", []))]
    return dict(cpu), _bare(pm.run, steps)


def measure_bitpipe_actions(steps: int = 10, timeout_s: float = 300.0) -> PipelineActionCost:
    """The BitPipe runner's `PipelineActionCost` on this machine (module docstring; F, B, send, recv, step; no
    I / W: BitPipe runs full backwards), ~20-40 s on 2 cores.

    Raises:
        DistributedError: a rank failed or timed out (`runtime.launch.spawn`).
    """
    from .launch import spawn
    got = spawn(_rank, 2, steps, timeout_s=timeout_s)
    samples: dict[str, list[float]] = defaultdict(list)
    bare: dict[str, list[float]] = defaultdict(list)
    for cpu, b in got:
        for k, v in cpu.items():
            samples[k] += v
        for k, v in b.items():
            bare[k] += v
    return action_cost_from_samples(dict(samples), dict(bare))


def register() -> None:
    """Make `cost_model.pipeline_actions.measure_pipeline_actions(own_runner=True)` measure this runner too."""
    register_own_runner_benchmark(measure_bitpipe_actions)
