import contextlib, io, torch
import parallelizer
from parallelizer import zoo

class LossOnly(torch.nn.Module):
    def __init__(self, m):
        super().__init__(); self.m = m
    def forward(self, input_ids, labels):
        return self.m(input_ids=input_ids, labels=labels).loss

model, (ids,), kw = zoo.gpt2(n_layer=1, n_embd=768, n_head=12, vocab_size=50257, batch=8, seq_len=1024, device="meta", labels=True)
tg = parallelizer.trace(LossOnly(model), (ids, kw["labels"]))
with contextlib.redirect_stdout(io.StringIO()):
    p = parallelizer.plan(tg, {"tp": 2}, axis_roles={"tp": "tp"})
print([e.src_layout + "->" + e.dst_layout for e in p.edges if e.dst == "output"], p.notes())
print(max((s.nbytes or 0) for _, s in p.steps()) / 1e6, "MB largest step")
