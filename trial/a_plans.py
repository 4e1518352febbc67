"""Part (a) without ranks: notes of plans that use no parallelism, or leave an axis unused."""
import warnings
import torch, torch.nn as nn
import parallelizer
from parallelizer import zoo

def show(tag, p):
    print("==", tag, p.mesh, "idle:", p.idle_axes())
    for n in p.notes():
        print("   NOTE", n)

tiny = parallelizer.trace(*zoo.mlp(depth=1, batch=8, dim=16, hidden=32, in_features=8, device="meta"))
show("mlp b8 dp=8", parallelizer.plan(tiny, {"dp": 8}))
one = parallelizer.trace(*zoo.mlp(depth=1, batch=1, dim=16, hidden=32, in_features=8, device="meta"))
show("mlp b1 dp=2", parallelizer.plan(one, {"dp": 2}))
show("mlp b8 dp=1,tp=2", parallelizer.plan(tiny, {"dp": 1, "tp": 2}))
show("mlp b8 dp=2,tp=2 ddp", parallelizer.plan(tiny, {"dp": 2, "tp": 2}, axis_roles={"dp": "ddp"}))
