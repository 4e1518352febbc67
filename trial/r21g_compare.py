"""Compare two r21g_train.py runs: per-step loss / grad norm / eval loss and the final full state dict.

    python trial/r21g_compare.py REF.json RUN.json [--dtype bf16] [--from-step N]

Bound per element: torch.testing's default for the dtype (float32: atol 1e-5, rtol 1.3e-6; bfloat16: atol 1e-5,
rtol 1.6e-2): bound = atol + rtol * |ref|. Prints worst |diff| and worst |diff| / bound per quantity.
"""
from __future__ import annotations

import argparse
import json

import torch

TOL = {"fp32": (1e-5, 1.3e-6), "bf16": (1e-5, 1.6e-2)}


def ratio(a: torch.Tensor, b: torch.Tensor, atol: float, rtol: float) -> tuple[float, float]:
    d = (a.double() - b.double()).abs()
    return float(d.max()), float((d / (atol + rtol * b.double().abs())).max())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("ref")
    ap.add_argument("run")
    ap.add_argument("--dtype", default="fp32", choices=list(TOL))
    ap.add_argument("--from-step", type=int, default=0)
    args = ap.parse_args()
    atol, rtol = TOL[args.dtype]
    ref, run = json.load(open(args.ref)), json.load(open(args.run))
    worst = 0.0
    for key in ("loss", "grad_norm", "lr"):
        steps = [s for s in run["steps"] if int(s) >= args.from_step]
        a = torch.tensor([run["steps"][s][key] for s in steps])
        b = torch.tensor([ref["steps"][s][key] for s in steps])
        d, r = ratio(a, b, atol, rtol)
        worst = max(worst, r)
        print(f"{key:9s} steps {steps[0]}-{steps[-1]}: worst |diff| {d:.3e}  ratio {r:.3f}")
    ev = [s for s in run["evals"] if int(s) >= args.from_step]
    if ev:
        d, r = ratio(torch.tensor([run["evals"][s] for s in ev]), torch.tensor([ref["evals"][s] for s in ev]), atol, rtol)
        worst = max(worst, r)
        print(f"eval      after {ev}: worst |diff| {d:.3e}  ratio {r:.3f}")
    if run.get("eval_errors"):
        print("eval errors:", run["eval_errors"][0][:300])
    sa, sb = torch.load(args.run.replace(".json", ".pt")), torch.load(args.ref.replace(".json", ".pt"))
    if set(sa) != set(sb):
        print("state-dict keys differ:", sorted(set(sa) ^ set(sb))[:6])
    pd, pr, pk = 0.0, 0.0, sorted(sa)[0]
    for k in sorted(set(sa) & set(sb)):
        d, r = ratio(sa[k], sb[k], atol, rtol)
        if r > pr or (r == pr and d > pd):
            pd, pr, pk = d, r, k
    worst = max(worst, pr)
    print(f"params    worst |diff| {pd:.3e}  ratio {pr:.3f} ({pk})")
    print(f"groups {run['groups']} vs ref {ref['groups']}; WORST RATIO {worst:.3f} -> {'MATCH' if worst <= 1 else 'DIFFER'}")


if __name__ == "__main__":
    main()
