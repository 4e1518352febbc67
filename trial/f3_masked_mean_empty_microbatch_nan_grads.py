"""Finding 3: a model whose own loss is a masked mean `(l * mask).sum() / mask.sum()` (a documented "count"
weighting) on pp=2 x dp=2 with microbatch 0's mask all 0: the microbatch's loss is 0/0 = NaN and backward of
`loss * 0` through the division is NaN in every gradient (before the fix: gradients NaN -> inf ratio), while one
device's loss of the whole batch and its gradients are finite. `python ... both`: the model also returns its
per-token values (as transformers models return logits beside the loss): fixed (MicrobatchLoss sends zeros
through the finite outputs). Without `both` (the model returns the loss only): still NaN, OPEN."""
import contextlib, copy, io, os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch
import parallelizer
from parallelizer.rewriter.spec import spec_from_plan
from parallelizer.runtime.pipeline_rehearsal import stage_diffs


BOTH = "both" in sys.argv


class MaskedMean(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(32, 16)
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(4))
        self.head = torch.nn.Linear(16, 1)

    def forward(self, ids, mask):
        x = self.emb(ids)
        for b in self.blocks:
            x = x + torch.tanh(b(x))
        per = self.head(x).squeeze(-1).pow(2)
        loss = (per * mask).sum() / mask.sum()
        return (loss, per) if BOTH else loss


def worker(rank, world):
    torch.manual_seed(0)
    model = MaskedMean()
    ref = copy.deepcopy(model)
    ids = torch.randint(0, 32, (8, 8), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(8, 8); mask[:4] = 0; mask[6, 3:] = 0
    with contextlib.redirect_stdout(io.StringIO()):
        pm = parallelizer.auto_parallelize(model, (ids, mask), mesh={"pp": 2, "dp": 2}, schedule="1f1b")
    loss = pm.step(ids, mask)
    rl = ref(ids, mask); rl = rl[0] if BOTH else rl; rl.backward()
    d = stage_diffs(pm.run, ref, spec_from_plan(pm.plan), None, grads=True)
    return loss.item(), rl.item(), d


if __name__ == "__main__":
    from parallelizer.runtime import spawn
    for r in spawn(worker, 4, timeout_s=300):
        print("pipeline loss %.6f, one device %.6f, worst grad |diff| %.3g at %s (ratio to bound %.3g)" % (r[0], r[1], *r[2]))
