"""Finding 1 (silent): pm.apply(init_fn) with an isinstance(m, nn.Linear) initialiser did nothing: the
ParallelModule's submodules are state-holding containers (_StateOnly), no nn.Linear among them. Outputs 0.74 off
eager on ddp, fsdp and tp=2. Also: pm.to_empty() + pm.apply(init) (FSDP2's meta recipe) gave NaN outputs.
Fixed: ParallelModule.apply runs fn on the full model (full_model()), to_empty keeps the materialised shards."""
import sys; sys.path.insert(0, __file__.rpartition("/")[0])
import torch
from torch import nn
from _common import main, specs, mlp, pm_of


def init(m):
    if isinstance(m, nn.Linear):
        nn.init.xavier_uniform_(m.weight); nn.init.zeros_(m.bias)


def body(pm, ref, x):
    for m in (pm, ref):
        torch.manual_seed(7); m.apply(init)
    apply_diff = (pm(x) - ref(x)).abs().max().item()
    meta, _ = mlp(device="meta")
    pm2 = pm_of(meta, x, pm.spec)
    pm2.to_empty(device="cpu")
    torch.manual_seed(7); pm2.apply(init)
    return f"pm.apply: max|out - eager| = {apply_diff:.3g}; meta+to_empty+apply: {(pm2(x) - ref(x)).abs().max().item():.3g}"



if __name__ == "__main__":
    main(body)
