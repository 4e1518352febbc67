"""What stays infeasible under forced ddp after the follower fix, and whether diagnose names the right node:
(a) a 1-D score over the merged (batch x frames) dim sliced [:batch] (no other dim to move the shard to);
(b) a Gram matrix over the merged dim (pairs samples)."""
import contextlib, io
import torch, torch.nn as nn
import parallelizer

class Slice1D(nn.Module):
    def __init__(s):
        super().__init__(); s.a = nn.Linear(8, 1)
    def forward(s, x):                      # (B, T, 8)
        B, T, C = x.shape
        score = s.a(x.reshape(B * T, C)).squeeze(-1)      # (B*T,)
        first = score[:B]                                 # rows of sample 0 only: crosses samples
        return first * x.mean(dim=(1, 2))

class GramMerged(nn.Module):
    def __init__(s):
        super().__init__(); s.a = nn.Linear(8, 8)
    def forward(s, x):
        B, T, C = x.shape
        h = s.a(x.reshape(B * T, C))
        return (h @ h.T).reshape(B, T, B * T).mean(dim=(1, 2))

def plan_all():
    for cls in (Slice1D, GramMerged):
        torch.manual_seed(0)
        with contextlib.redirect_stdout(io.StringIO()):
            tr = parallelizer.trace(cls(), (torch.randn(4, 2, 8),))
        for roles in ({"dp": "ddp"}, {"dp": "fsdp"}):
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    parallelizer.plan(tr, {"dp": 2}, axis_roles=roles)
                print(cls.__name__, roles, "planned")
            except Exception as e:
                print(cls.__name__, roles, type(e).__name__, str(e)[:330])


def slice1d():
    torch.manual_seed(0)
    return Slice1D(), (torch.randn(4, 2, 8),)


def gram():
    torch.manual_seed(0)
    return GramMerged(), (torch.randn(4, 2, 8),)


def rehearse_all():
    from parallelizer.runtime.rehearsal import rehearse_many
    cases = []
    for fn in (slice1d, gram):
        m, inp = fn()
        with contextlib.redirect_stdout(io.StringIO()):
            p = parallelizer.plan(parallelizer.trace(m, inp), {"dp": 2}, axis_roles={"dp": "ddp"})
        print(fn.__name__, p.summary())
        cases.append((fn, {}, p))
    for (fn, _, _), r in zip(cases, rehearse_many(cases, steps=2)):
        print("REHEARSE", fn.__name__, "ratio=%.3g" % r.tolerance_ratio, r.collectives)


if __name__ == "__main__":
    plan_all()
    rehearse_all()
