"""Finding 3 (silent): torch.optim.LBFGS with its DEFAULT options (max_iter=20) was classified per-element by
runtime/optimizer_check's probe (it converges to the probe's quadratic minimum in its 3 steps whatever it couples)
and stepped fsdp / tp shards: parameters off eager after one step. LBFGS(lr=0.1, max_iter=3), the tested form,
was refused. Fixed: the probe checks again on a linear loss (no minimum) when the quadratic says per-element."""
import sys; sys.path.insert(0, __file__.rpartition("/")[0])
import torch
from _common import main, specs, params_diff


def body(pm, ref, x):
    for m in (pm, ref):
        opt = torch.optim.LBFGS(m.parameters())
        def closure(m=m, opt=opt):
            opt.zero_grad(); loss = m(x).pow(2).mean(); loss.backward(); return loss
        opt.step(closure)
    return f"LBFGS() stepped: params off eager by {params_diff(pm, ref):.3g}"



if __name__ == "__main__":
    main(body)
