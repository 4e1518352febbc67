"""Trial 10c finding: torch's split backward (dI then dW, the zero-bubble schedules zbv /
interleaved_zero_bubble / dualpipev) on a stage where one nn.Linear is applied twice on one path
(x -> sq -> tanh -> sq). Single process, torch only: stage_backward_input + stage_backward_weight vs autograd.
The pipeline (trial/hc_pipe.py "reuse zbv pp2xdp2") raises torch's RuntimeError 'Trying to backward through the
graph a second time' from the W step (an untyped error from deep inside torch)."""
import torch
from torch import nn
from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

torch.manual_seed(0)
sq = nn.Linear(8, 8)
x = torch.randn(4, 8, requires_grad=True)
ref = copy = None
out = sq(torch.tanh(sq(x))).pow(2).sum()
gx_ref, gw_ref, gb_ref = torch.autograd.grad(out, [x, sq.weight, sq.bias])

x2 = x.detach().clone().requires_grad_()
out2 = sq(torch.tanh(sq(x2))).pow(2).sum()
params = list(sq.parameters())
try:
    grads, groups = stage_backward_input([out2], None, [x2], params)
    stage_backward_weight(params, groups)
    print("input grad diff", (grads[0] - gx_ref).abs().max().item())
    print("weight grad diff", (sq.weight.grad - gw_ref).abs().max().item(), "bias", (sq.bias.grad - gb_ref).abs().max().item())
except RuntimeError as e:
    print("RuntimeError:", str(e)[:200])

# the traced form: the weight transposed ONCE (one aten.t node) and the bias added by a separate add, each used twice
w, b = sq.weight, sq.bias
for variant in ("t once", "t twice", "mm only (x @ w @ w)"):
    for p in params:
        p.grad = None
    x3 = x.detach().clone().requires_grad_()
    if variant == "t once":
        wt = w.t()
        o = (torch.tanh(x3 @ wt + b) @ wt + b).pow(2).sum()
    elif variant == "t twice":
        o = (torch.tanh(x3 @ w.t() + b) @ w.t() + b).pow(2).sum()
    else:
        o = (x3 @ w @ w).pow(2).sum()
    ref = torch.autograd.grad(o, [w, b], retain_graph=True, allow_unused=True)
    try:
        grads, groups = stage_backward_input([o], None, [x3], params)
        stage_backward_weight(params, groups)
        print(variant, "weight grad diff", (w.grad - ref[0]).abs().max().item(),
              "bias", None if ref[1] is None else (b.grad - ref[1]).abs().max().item())
    except RuntimeError as e:
        print(variant, "RuntimeError:", str(e)[:120])
