"""Finding 2 (silent): torch.nn.init.orthogonal_ / xavier_* / kaiming_* / normal_ on pm.parameters() run on the
local shard (its shape, its fans, the same draws on every rank): outputs 4.5 (fsdp) and 9.2 (tp=2) off eager,
which runs the same seeded init on the full tensors. p.div_(p.norm()) is the same class (0.26 / 0.27 off) but
cannot be intercepted (documented; remedy: `with pm.full_model() as m:`).
Fixed: nn.init's shape/random initialisers raise UnsupportedOpError on sharded parameters (runtime/init_check.py)."""
import sys; sys.path.insert(0, __file__.rpartition("/")[0])
import torch
from torch import nn
from _common import main, specs, params_diff


def body(pm, ref, x):
    for m in (pm, ref):
        torch.manual_seed(5)
        for p in m.parameters():
            if p.dim() >= 2:
                nn.init.orthogonal_(p)
    direct = f"orthogonal_ on pm.parameters(): max|out - eager| = {(pm(x) - ref(x)).abs().max().item():.3g}"
    return direct


def body_full(pm, ref, x):
    torch.manual_seed(5)
    with pm.full_model() as m:
        for p in m.parameters():
            if p.dim() >= 2:
                nn.init.orthogonal_(p)
    torch.manual_seed(5)
    for p in ref.parameters():
        if p.dim() >= 2:
            nn.init.orthogonal_(p)
    return f"under pm.full_model(): params off by {params_diff(pm, ref):.3g}"



if __name__ == "__main__":
    main(body, body_full)
