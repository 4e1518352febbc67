"""Minimal TimeSformer-like model: batch merged with frames/patches and split again."""
import torch, torch.nn as nn
import parallelizer

class Divided(nn.Module):
    def __init__(s, C=32, T=2, P=4):
        super().__init__(); s.T, s.P = T, P
        s.sp = nn.Linear(C, C); s.tm = nn.Linear(C, C); s.head = nn.Linear(C, 5)
    def forward(s, x):                      # x (B, T, P, C)
        B, T, P, C = x.shape
        h = s.sp(x.reshape(B * T, P, C))    # batch merged with frames
        h = h.softmax(dim=1) * h
        h = h.reshape(B, T * P, C)
        h = h.reshape(B, T, P, C).permute(0, 2, 1, 3).reshape(B * P, T, C)  # batch merged with patches
        h = s.tm(h).softmax(dim=1) * h
        h = h.reshape(B, P, T, C).mean(dim=(1, 2))
        return s.head(h)

def build(B=4):
    torch.manual_seed(0)
    return Divided(), (torch.randn(B, 2, 4, 32),)

if __name__ == "__main__":
    import sys
    m, inp = build(int(sys.argv[1]) if len(sys.argv) > 1 else 4)
    tr = parallelizer.trace(m, inp)
    for mesh, roles in [({"dp": 2}, {"dp": "ddp"}), ({"dp": 2}, {"dp": "fsdp"}), ({"dp": 2, "tp": 2}, {"dp": "ddp", "tp": "tp"})]:
        try:
            p = parallelizer.plan(tr, mesh, axis_roles=roles)
            print(mesh, roles, "OK")
        except Exception as e:
            print(mesh, roles, type(e).__name__, str(e)[:600])
