"""CLI factories (trial h3): parallelizer plan --model trial.h3_cli:gptneo --mesh pp=2,dp=2 ..."""
import sys, os
sys.path.insert(0, os.path.dirname(__file__))
import h3_models as M


def _f(name):
    def factory(**_):
        return M.build(name)
    return factory


gptneo, ctrl, mpnet, trocr, ernie, roformer = (_f(n) for n in ("gptneo", "ctrl", "mpnet", "trocr", "ernie", "roformer"))
