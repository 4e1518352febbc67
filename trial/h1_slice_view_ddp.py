"""Trial h1: minimal form of ProphetNet's ngram head under forced ddp: slice along dim 1 -> view -> linear."""
import torch, torch.nn.functional as F
import parallelizer


class SliceView(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Linear(8, 8)
        self.head = torch.nn.Linear(8, 16)

    def forward(self, x):  # x (B, 24, 8)
        h = self.inp(x)
        ngram = h[:, 8:]                       # (B, 16, 8), not contiguous
        return self.head(ngram.view(x.shape[0], 2, 8, -1)).float().pow(2).mean()


if __name__ == "__main__":
    x = torch.randn(4, 24, 8)
    t = parallelizer.trace(SliceView(), (x,))
    try:
        parallelizer.plan(t, {"dp": 2}, axis_roles={"dp": "ddp"}); print("planned under ddp")
    except Exception as e:
        print(type(e).__name__, str(e)[:400])
