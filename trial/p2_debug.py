import copy, torch, torch.nn as nn, torch.nn.functional as F, warnings
import parallelizer
from parallelizer.runtime import spawn
sys_path = __import__("sys").path.insert(0, "trial")
from p2_models import SkipConvNet, _conv_data, ratio


def body(rank, world, variant):
    warnings.simplefilter("ignore")
    torch.manual_seed(0); m = SkipConvNet()
    if variant == "nobuf":
        m.forward = None
    ref = copy.deepcopy(m)
    x, y = _conv_data(6)
    pm = parallelizer.auto_parallelize(m, (x,), axis_roles={"dp": "ddp"})
    o, ro = pm(x), ref(x)
    F.cross_entropy(o, y).backward(); F.cross_entropy(ro, y).backward()
    res = {"out": ratio(o.detach(), ro.detach())}
    full = {n: p for n, p in pm.named_parameters()}
    for n, p in ref.named_parameters():
        res[n] = ratio(full[n].grad, p.grad)
    for n, b in ref.named_buffers():
        res["buf " + n] = ratio(pm.state_dict()[n].float(), b.float())
    return res


if __name__ == "__main__":
    r = spawn(body, 2, "plain")
    for k, v in r[0].items():
        print(k, f"{v:.3g}")
