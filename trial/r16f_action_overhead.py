"""Per-action CPU overhead of the pipeline runtimes (issue 14, trial r16f): torch's pipelining schedules and
our BitPipe runner on 2 gloo ranks, stages of one Linear(8, 8) (near-zero compute), 8 microbatches.

Per rank, every action's per-thread CPU time (`time.thread_time`: holds under load, excludes the time a
blocking receive sleeps) and wall time, by kind: F (forward_one_chunk + the loss on the last stage), B (full
backward_one_chunk), I (backward_one_chunk(full_backward=False)), W (backward_weight_one_chunk), send (the
send ops built and posted: `get_*_send_ops` + `_batch_p2p`), recv (the receive ops built and posted + their
wait). BitPipe: its per-action loop (`BitPipeRunner.step`'s action list) timed per action, its `_send` /
`_receive` separately. "bare": the stage's fx program alone (forward; backward through it), the compute
the cost model prices. Overhead of a compute action = its CPU time - the bare program's.

    PYTHONPATH=. OMP_NUM_THREADS=1 python trial/r16f_action_overhead.py [STEPS]
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from collections import defaultdict

import torch
from torch import nn

SCHEDULES = ("1f1b", "gpipe", "interleaved_1f1b", "zbv", "bitpipe")
M = 8


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return self.lin(x)


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(4))

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


def _loss(out, target):
    out = out[0] if isinstance(out, (tuple, list)) else out
    return torch.nn.functional.mse_loss(out, target)


class _Rec:
    def __init__(self) -> None:
        self.cpu, self.wall = defaultdict(list), defaultdict(list)
        self.depth = 0

    def add(self, kind, cpu, wall):
        self.cpu[kind].append(cpu)
        self.wall[kind].append(wall)


def _timed(rec: _Rec, kind_of, fn):
    def wrapper(*a, **k):
        kind = kind_of(*a, **k)
        if kind is None or rec.depth:
            return fn(*a, **k)
        rec.depth += 1
        c, w = time.thread_time(), time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            rec.depth -= 1
            rec.add(kind, time.thread_time() - c, time.perf_counter() - w)
    return wrapper


def _instrument(rec: _Rec) -> None:
    from torch.distributed.pipelining import schedules as S
    from torch.distributed.pipelining import stage as st
    base = st._PipelineStageBase
    base.forward_one_chunk = _timed(rec, lambda *a, **k: "F", base.forward_one_chunk)
    base.backward_one_chunk = _timed(rec, lambda *a, **k: "B" if k.get("full_backward", True) else "I",
                                     base.backward_one_chunk)
    base.backward_weight_one_chunk = _timed(rec, lambda *a, **k: "W", base.backward_weight_one_chunk)
    for name in ("get_fwd_send_ops", "get_bwd_send_ops"):
        setattr(base, name, _timed(rec, lambda *a, **k: "send_build", getattr(base, name)))
    for name in ("get_fwd_recv_ops", "get_bwd_recv_ops"):
        setattr(base, name, _timed(rec, lambda *a, **k: "recv_build", getattr(base, name)))
    loss = S._PipelineSchedule._maybe_compute_loss
    S._PipelineSchedule._maybe_compute_loss = _timed(rec, lambda *a, **k: "loss", loss)

    def batch_kind(ops, *a, **k):
        kinds = {op.op.__name__ for op in ops}
        if not ops:
            return None
        return "send_post" if kinds == {"isend"} else "recv_post" if kinds == {"irecv"} else "mixed_post"
    S._batch_p2p = _timed(rec, batch_kind, S._batch_p2p)
    S._wait_batch_p2p = _timed(rec, lambda work: "wait" if work else None, S._wait_batch_p2p)


def _instrument_bitpipe(rec: _Rec, runner) -> None:
    runner._send = _timed(rec, lambda *a, **k: "send", runner._send)
    runner._receive = _timed(rec, lambda *a, **k: "recv", runner._receive)
    actions = runner.actions

    class Timed:
        def __iter__(self):
            prev = None
            for a in actions:
                c, w = time.thread_time(), time.perf_counter()
                n_send, n_recv = len(rec.cpu["send"]), len(rec.cpu["recv"])
                yield a
                io = sum(rec.cpu["send"][n_send:]) + sum(rec.cpu["recv"][n_recv:])
                iow = sum(rec.wall["send"][n_send:]) + sum(rec.wall["recv"][n_recv:])
                rec.add("bp_" + a.computation_type.value, time.thread_time() - c - io, time.perf_counter() - w - iow)

        def __len__(self):
            return len(actions)
    runner.actions = Timed()


def rank_fn(rank: int, world: int, steps: int) -> dict:
    import parallelizer
    torch.set_num_threads(1)
    results = {}
    x, y = torch.randn(M, 8, generator=torch.Generator().manual_seed(1)), torch.randn(M, 8)
    for name in SCHEDULES:
        torch.manual_seed(0)
        model = Tiny()
        opts = dict(mesh={"pp": 2}, schedule=name, microbatches=M)
        if name in ("interleaved_1f1b", "zbv", "bitpipe"):
            opts["virtual_stages"] = 2
        import contextlib
        import io
        with contextlib.redirect_stdout(io.StringIO()):
            pm = parallelizer.auto_parallelize(model, (x,), **opts)
        rec = _Rec()
        for i in range(steps + 2):
            if i == 2:  # after 2 warm-up steps
                if name == "bitpipe":
                    _instrument_bitpipe(rec, _runner(pm))
                else:
                    _instrument(rec)
                rec.cpu.clear(), rec.wall.clear()
            c, w, pc = time.thread_time(), time.perf_counter(), time.process_time()
            pm.step(x, target=y, loss_fn=_loss)
            if i >= 2:
                rec.add("step", time.thread_time() - c, time.perf_counter() - w)
                rec.add("step_process", time.process_time() - pc, 0.0)  # all threads (gloo's too)
            for p in pm.parameters():
                p.grad = None
        if name != "bitpipe":
            _uninstrument()
        results[name] = {"cpu": dict(rec.cpu), "wall": dict(rec.wall), "bare": _bare_times(pm)}
    return results


_ORIG = {}


def _save_orig():
    from torch.distributed.pipelining import schedules as S
    from torch.distributed.pipelining import stage as st
    base = st._PipelineStageBase
    for n in ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk", "get_fwd_send_ops",
              "get_bwd_send_ops", "get_fwd_recv_ops", "get_bwd_recv_ops"):
        _ORIG[(base, n)] = getattr(base, n)
    _ORIG[(S._PipelineSchedule, "_maybe_compute_loss")] = S._PipelineSchedule._maybe_compute_loss
    _ORIG[(S, "_batch_p2p")] = S._batch_p2p
    _ORIG[(S, "_wait_batch_p2p")] = S._wait_batch_p2p


def _uninstrument():
    for (obj, n), f in _ORIG.items():
        setattr(obj, n, f)


def _runner(pm):
    for attr in ("run", "_run", "pipeline"):
        r = getattr(pm, attr, None)
        if r is not None and hasattr(r, "schedule"):
            return r.schedule
    raise RuntimeError(f"no runner on {type(pm)}: {list(vars(pm))[:20]}")


def _bare_times(pm) -> dict:
    """Per stage module of this rank: per-thread CPU seconds of its fx program's forward alone and of a
    backward through it (median of 20), on inputs of the stage's traced shapes."""
    r = None
    for attr in ("run", "_run", "pipeline"):
        r = getattr(pm, attr, None)
        if r is not None and hasattr(r, "stages"):
            break
    out = []
    for stage in r.stages:
        gm = stage.program.graph_module
        shapes = [tuple(stage.traced.node(n).outputs[0].shape) for n in stage.traced.input_names]
        fwd, bwd = [], []
        for _ in range(22):
            ins = [torch.randn(s, requires_grad=True) for s in shapes]
            c = time.thread_time()
            o = gm(*stage._state(), *ins)
            fwd.append(time.thread_time() - c)
            o = [t for t in (o if isinstance(o, (tuple, list)) else [o]) if t.requires_grad]
            c = time.thread_time()
            torch.autograd.backward(o, [torch.ones_like(t) for t in o])
            bwd.append(time.thread_time() - c)
        out.append({"F": statistics.median(fwd[2:]), "B": statistics.median(bwd[2:])})
    return out


def main() -> None:
    from parallelizer.runtime import spawn
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    import os
    load0 = os.getloadavg()[0]
    got = spawn(_entry, 2, steps, timeout_s=600)
    print(json.dumps({"load": [load0, os.getloadavg()[0]], "ranks": got}))


def _entry(rank, world, steps):
    _save_orig()
    return rank_fn(rank, world, steps)


if __name__ == "__main__":
    main()
