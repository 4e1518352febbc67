"""Finding (trial6a): a class-weighted cross-entropy passed as loss_fn= to PipelineModule.step on pp=2 x tp=2
(1f1b, 8 microbatches) trains to other numbers than one device, with no error or warning.

Why: loss_fn's item count is read from its ATen graph by make_fx on META tensors; the class-weight tensor is a
CPU constant, so make_fx fails, and step silently falls back to counting labels != -100 per microbatch. A
class-weighted mean divides by the sum of the targets' weights, not by their count, so the microbatch weights
are wrong. Before the fix: loss off by ~1e-2, gradients by ~1.7e-2. After: StepError naming the weighted
cross-entropy and the remedy (item_count= summing the targets' weights), and with that item_count the
step matches one device.
Run: PYTHONPATH=$PWD python -m trial.weighted_ce_pipeline"""
import contextlib, copy, io

import torch
import torch.nn.functional as F
import torch.distributed as dist

import parallelizer

V, D, B, T = 100, 32, 8, 8
W = torch.linspace(0.5, 1.5, V)


def weighted_ce(out, y):
    return F.cross_entropy(out.flatten(0, 1), y.flatten(), weight=W)


def weight_sum(y):  # the remedy: the items a class-weighted mean averages over are the targets' weights
    y = y.flatten()
    return W[y[y != -100]].sum()


def body(rank, world, use_item_count):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(V, D), *[torch.nn.Sequential(torch.nn.Linear(D, D), torch.nn.Tanh())
                                                              for _ in range(4)], torch.nn.Linear(D, V))
    ref = copy.deepcopy(model)
    ids = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(1))
    y = torch.roll(ids, -1, 1)
    y[:, -1] = -100
    y[0, 1:] = -100
    y[3, 3:] = -100
    with contextlib.redirect_stdout(io.StringIO()):
        pm = parallelizer.auto_parallelize(model, (ids,), mesh={"pp": 2, "tp": 2}, schedule="1f1b", microbatches=8,
                                           axis_roles={"tp": "tp"})
    try:
        extra = {"item_count": weight_sum} if use_item_count else {}
        loss = pm.step(ids, target=y, loss_fn=weighted_ce, **extra)
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {str(e)[:300]}"
    ref_loss = weighted_ce(ref(ids), y)
    return f"loss {loss.item():.6f} vs one device {ref_loss.item():.6f}: diff {abs(loss.item() - ref_loss.item()):.2e}"


if __name__ == "__main__":
    from parallelizer.runtime import spawn
    for use in (False, True):
        print("item_count given" if use else "default", "->", spawn(body, 4, use, timeout_s=300)[0])
