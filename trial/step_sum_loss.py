"""pm.step on pp=2 x dp=2 with a SUM cross-entropy loss_fn and padded targets: the returned batch loss and the
loss after one AdamW step against eager (whole batch, same loss_fn). Run: PYTHONPATH=. python trial/step_sum_loss.py"""
import copy
import torch
import torch.nn.functional as F

import parallelizer
from parallelizer.runtime.launch import spawn
from parallelizer.zoo.hf import gpt2


def loss_fn(out, y):
    return F.cross_entropy(out.logits.flatten(0, 1), y.flatten(), reduction="sum", ignore_index=-100)


def rank(r, ws):
    torch.manual_seed(0)
    model, (ids,) = gpt2(batch=8, seq_len=8, n_layer=4, n_embd=32, n_head=4, vocab_size=64)[:2]
    y = ids.clone()
    y[:3, 2:] = -100
    ref = copy.deepcopy(model)
    pm = parallelizer.auto_parallelize(model, (ids,), mesh={"pp": 2, "dp": 2})
    opt = torch.optim.AdamW(pm.parameters(), lr=1e-2)
    ropt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    got = [float(pm.step(ids, target=y, loss_fn=loss_fn))]
    want = [loss_fn(ref(ids), y)]
    want[0].backward()
    want[0] = float(want[0])
    opt.step(); ropt.step(); opt.zero_grad(); ropt.zero_grad()
    got.append(float(pm.step(ids, target=y, loss_fn=loss_fn)))
    want.append(float(loss_fn(ref(ids), y)))
    return got, want


if __name__ == "__main__":
    for r, (got, want) in enumerate(spawn(rank, 4, timeout_s=500)):
        print(f"rank {r}: pipeline losses {got}  eager {want}")
