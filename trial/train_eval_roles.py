"""train()/eval() contract (Conv-BN-Linear after a training step, dropout MLP, a self.training branch) under
fsdp dp=2 and tp=2 (test_contract runs it under ddp / tp for dropout only). Run: python trial/train_eval_roles.py"""
import contextlib, io, sys, warnings
warnings.filterwarnings("ignore")
sys.path.insert(0, "tests/distributed")
import torch
import parallelizer
from parallelizer.rewriter.spec import spec_from_plan
from parallelizer.runtime.launch import spawn
from contract_workers import branchy, conv_bn, dropout_mlp, train_eval


def spec(fn, mesh, roles):
    m, a = fn()
    with contextlib.redirect_stdout(io.StringIO()):
        return spec_from_plan(parallelizer.plan(parallelizer.trace(m, a), mesh, axis_roles=roles))


if __name__ == "__main__":
    for mesh, roles in (({"dp": 2}, {"dp": "fsdp"}), ({"tp": 2}, {"tp": "tp"})):
        specs = {"conv_bn": spec(conv_bn, mesh, roles), "dropout": spec(dropout_mlp, mesh, roles),
                 "branchy": spec(branchy, mesh, roles)}
        res = spawn(train_eval, 2, specs, timeout_s=600)
        for r in res:
            d = lambda k: (r[k][0] - r[k][1]).abs().max().item()
            print(roles, {"conv_bn_eval": d("conv_bn_eval"), "buffers_vs_eager": r["conv_bn_buffers_vs_eager"],
                          "buffers_kept_in_eval": r["conv_bn_buffers_kept"], "train_again": d("conv_bn_train_again"),
                          "dropout_eval": d("dropout_eval"), "branchy_eval": d("branchy_eval"),
                          "branchy_train": d("branchy_train")})
