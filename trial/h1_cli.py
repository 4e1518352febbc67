"""CLI factories (trial h1): parallelizer plan --model trial.h1_cli:exaone4 --mesh pp=2,dp=2 ..."""
import os, sys
sys.path.insert(0, os.path.dirname(__file__))
import torch
import h1_models as M


def _f(name):
    def factory(batch=8, seq_len=8, **_):
        model, args, kwargs = M.build(name)
        torch.manual_seed(1)
        ids = torch.randint(0, M.V, (batch, seq_len))
        return model, (ids,), {"labels": torch.randint(0, M.V, (batch, seq_len))}
    return factory


exaone4, cohere2, biogpt, olmo3, helium, xglm = (_f(n) for n in ("exaone4", "cohere2", "biogpt", "olmo3", "helium", "xglm"))
