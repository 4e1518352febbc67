"""r19c: per schedule, per rank, per step: process CPU and main-thread CPU of pm.step and opt.step, main-thread CPU
inside torch's stage compute actions by kind, P2P ops and bytes posted (isend/irecv, every runner), all-reduce bytes.
CPU figures only (time.thread_time / time.process_time): the machine is loaded.
usage: prof.py TAG PROFILE key=val ... (GPT overrides, e.g. n_embd=64 seq_len=32)"""
import json, sys, time, contextlib, io, collections
import torch, torch.distributed as dist
import parallelizer
from parallelizer import zoo
from parallelizer.runtime import spawn
import benchmarks.bench_schedules_runtime as B

ROUNDS = int(__import__("os").environ.get("ROUNDS", "3"))

def rank_fn(rank, world, plans, gpt, rounds):
    torch.set_num_threads(1)
    from torch.distributed.pipelining import stage as st
    acc = collections.defaultdict(lambda: [0.0, 0])  # kind -> [thread cpu s, calls]
    net = collections.defaultdict(lambda: [0, 0])  # isend / irecv -> [ops, bytes]
    on = [False]
    def wrap_stage(name, key):
        real = getattr(st._PipelineStageBase, name)
        def f(self, *a, **k):
            kind = key if name != "backward_one_chunk" else ("B" if k.get("full_backward", True) else "I")
            if not on[0]:
                return real(self, *a, **k)
            on[0] = False
            t0 = time.thread_time()
            try:
                return real(self, *a, **k)
            finally:
                d = acc[kind]; d[0] += time.thread_time() - t0; d[1] += 1; on[0] = True
        setattr(st._PipelineStageBase, name, f)
    wrap_stage("forward_one_chunk", "F"); wrap_stage("backward_one_chunk", "B"); wrap_stage("backward_weight_one_chunk", "W")
    from torch.distributed.pipelining import schedules as sch
    real_batch = sch._batch_p2p
    def batch(ops, *a, **k):
        for op in ops:
            d = net["isend" if op.op is dist.isend else "irecv"]; d[0] += 1; d[1] += op.tensor.numel() * op.tensor.element_size()
        return real_batch(ops, *a, **k)
    sch._batch_p2p = batch
    from parallelizer.runtime import bitpipe as bp
    class _Dist:
        def __getattr__(self, n):
            return getattr(dist, n)
        def isend(self, tensor, *a, **k):
            d = net["isend"]; d[0] += 1; d[1] += tensor.numel() * tensor.element_size(); return dist.isend(tensor, *a, **k)
        def irecv(self, tensor, *a, **k):
            d = net["irecv"]; d[0] += 1; d[1] += tensor.numel() * tensor.element_size(); return dist.irecv(tensor, *a, **k)
    bp.dist = _Dist()
    for name in ("send", "recv", "all_reduce", "broadcast"):
        real = getattr(dist, name)
        def f(tensor, *a, _real=real, _name=name, **k):
            d = net[_name]; d[0] += 1; d[1] += tensor.numel() * tensor.element_size()
            return _real(tensor, *a, **k)
        f.__name__ = name
        setattr(dist, name, f)
    built = {}
    for name in plans:
        torch.manual_seed(0)
        model, (ids,) = zoo.gpt2(**gpt)
        pm = parallelizer.auto_parallelize(model, (ids,), plan=parallelizer.Plan.from_json(plans[name]))
        ps = list(pm.parameters())
        built[name] = (pm, torch.optim.AdamW(ps, lr=1e-4), sum(p.numel() for p in ps))
    labels = torch.roll(ids, -1, dims=1)
    out = {n: [] for n in plans}
    for i in range(1 + rounds):
        for name, (pm, opt, numel) in built.items():
            dist.barrier()
            acc.clear(); net.clear(); on[0] = True
            t0, p0 = time.thread_time(), time.process_time()
            pm.step(ids, target=labels, loss_fn=B._loss)
            t1, p1 = time.thread_time(), time.process_time()
            on[0] = False
            opt.step(); opt.zero_grad(set_to_none=True)
            t2, p2 = time.thread_time(), time.process_time()
            dist.barrier()
            if i >= 1:
                out[name].append(dict(step_main=(t1 - t0) * 1e3, step_proc=(p1 - p0) * 1e3, opt_main=(t2 - t1) * 1e3,
                                      opt_proc=(p2 - p1) * 1e3, numel=numel,
                                      acc={k: [v[0] * 1e3, v[1]] for k, v in acc.items()},
                                      net={k: list(v) for k, v in net.items()}))
    return out

if __name__ == "__main__":
    tag, prof = sys.argv[1], sys.argv[2]
    gpt = dict(B.GPT)
    for kv in sys.argv[3:]:
        k, v = kv.split("="); gpt[k] = int(v)
    B.GPT.update(gpt)
    traced = B._traced()
    with contextlib.redirect_stdout(io.StringIO()):
        plans = {n: parallelizer.plan(traced, {"pp": B.PP}, cluster=prof, schedule=n,
                                      microbatches=B.MICROBATCHES).to_json() for n in B.SCHEDULES}
    print("planned", flush=True)
    res = spawn(rank_fn, B.PP, plans, gpt, ROUNDS, timeout_s=2400)
    json.dump({"gpt": gpt, "res": res}, open(f"prof_{tag}.json", "w"), indent=1)
    import statistics as stt
    for name in B.SCHEDULES:
        tot = collections.defaultdict(float)
        for r, rr in enumerate(res):
            xs = rr[name]
            for k in ("step_main", "step_proc", "opt_main", "opt_proc"):
                tot[k] += stt.median(x[k] for x in xs)
            for k in xs[0]["acc"]:
                tot["act_" + k] += stt.median(x["acc"][k][0] for x in xs); tot["n_" + k] += xs[0]["acc"][k][1]
            for k, v in xs[0]["net"].items():
                tot["ops_" + k] += v[0]; tot["MB_" + k] += v[1] / 1e6
        print(name, {k: round(v, 1) for k, v in tot.items()}, flush=True)
