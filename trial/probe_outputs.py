"""Round 10a probe: output structures and non-tensor / non-contiguous inputs on 2 ranks (ddp, tp, fsdp).
Run: PYTHONPATH=$PWD:$PWD/trial python trial/probe_outputs.py ddp"""
import dataclasses
import sys

import torch
from torch import nn

import probe_inputs
from probe_inputs import run_case


@dataclasses.dataclass
class Out:
    y: torch.Tensor
    aux: tuple


torch.utils._pytree.register_dataclass(Out)  # what the TraceError asks for a user dataclass output


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 8)

    def forward(self, img, temperature=1.0, flag=False, extra=None):
        h = self.conv(img).mean((2, 3))
        h = self.b(torch.relu(self.a(h))) / temperature
        if flag:
            h = h * 2
        if extra is not None:
            h = h + extra
        return {"out": Out(h, (h.sum(-1), (img[:, 0, 0, :4], h[:, :2]))), "view_of_input": img[:, :1].transpose(2, 3)}


def net():
    torch.manual_seed(0)
    return Net()


def img(cl=False):
    x = torch.randn(6, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    return x.contiguous(memory_format=torch.channels_last) if cl else x


def cases():
    x = img()
    e = torch.randn(6, 8)
    return {
        "dict_dataclass_nested": (net, (x,), dict(temperature=0.5, flag=True, extra=e),
                                  [("train", (x,), dict(temperature=0.5, flag=True, extra=e),
                                    "['out'].aux[1][1].pow(2).mean() + out['out'].aux[0].mean()", True)]),
        "view_of_input_out": (net, (x,), {}, [("train", (x,), {}, "['view_of_input']", False)]),
        "channels_last": (net, (x,), {}, [("train", (img(True),), {}, "['out'].y.pow(2).mean()", True)]),
        "temperature_changed": (net, (x,), dict(temperature=0.5), [("train", (x,), dict(temperature=0.7), "['out'].y.mean()", True)]),
        "extra_none_then_tensor": (net, (x,), dict(extra=None), [("train", (x,), dict(extra=e), "['out'].y.mean()", True)]),
        "eval_batch5_channels_last": (net, (x,), {}, [("eval", (img(True)[:5],), {}, "['out'].y", False)]),
    }


if __name__ == "__main__":
    from parallelizer.runtime.launch import spawn
    which = sys.argv[1] if len(sys.argv) > 1 else "ddp"
    mesh, roles = {"ddp": ({"dp": 2}, {"dp": "ddp"}), "fsdp": ({"dp": 2}, {"dp": "fsdp"}),
                   "tp": ({"tp": 2}, {"tp": "tp"})}[which]
    res = spawn(probe_inputs.rank_fn, 2, mesh, roles, None, "probe_outputs", timeout_s=900)
    for name in res[0]:
        print(f"[{which}] {name}: {res[0][name]}")
        if any(r[name] != res[0][name] for r in res[1:]):
            print(f"    other ranks differ: {[r[name] for r in res[1:]]}")
