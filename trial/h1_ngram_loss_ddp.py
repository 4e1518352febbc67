"""Trial h1: ProphetNet's loss flattens (ngram, batch, seq, V) after transpose(0, 1): the batch is not the outer
dim of the merged rows. Under forced ddp the plan is infeasible (typed); is it this view?"""
import torch, torch.nn.functional as F
import parallelizer


class NgramLoss(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(8, 16)

    def forward(self, x, labels):  # x (B, 2, S, 8)
        logits = self.head(x).transpose(0, 1).contiguous()  # (2, B, S, 16)
        return F.cross_entropy(logits.view(-1, 16), labels.transpose(0, 1).reshape(-1))


if __name__ == "__main__":
    x, y = torch.randn(4, 2, 3, 8), torch.randint(0, 16, (4, 2, 3))
    t = parallelizer.trace(NgramLoss(), (x, y))
    try:
        parallelizer.plan(t, {"dp": 2}, axis_roles={"dp": "ddp"}); print("planned under ddp")
    except Exception as e:
        print(type(e).__name__, str(e)[:900])
