"""Systematic sweep over torch.nn: every float layer class, every loss class (reductions and options) and
torch.linalg / special / fft / distributions ops, each between two nn.Linear layers the planner may shard
(`nn_sweep_models.LAYERS`), traced, planned on 2 ranks (ddp, tp=2, fsdp, and random ILP costs on dp=2 and tp=2,
as `run_fuzz` randomises them) and rehearsed against one device for 2 AdamW steps; `--four` plans a subset on
dp=2 x tp=2 (random costs; fsdp x tp). One JSON line per (case, plan): match / MISMATCH (ratio) / a typed
trace or plan error / UNTYPED_* (a defect). Long: about 300 cases x 5 plans, ~1-2 h on 2 cores; results in
benchmarks/RESULTS.md ("Round 7"). Usage: `python tests/fuzz/nn_sweep.py OUT.jsonl [PREFIX | layers] [--four]`."""
from __future__ import annotations

import contextlib
import io
import json
import sys
import time
import traceback
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import nn_sweep_models  # noqa: E402
import parallelizer  # noqa: E402
from parallelizer.config import PlanConfig  # noqa: E402
from parallelizer.errors import ParallelizerError  # noqa: E402
from parallelizer.planner.api import build as build_problem, to_plan  # noqa: E402
from parallelizer.planner.ilp import solve  # noqa: E402
from parallelizer.rewriter.spec import spec_from_plan  # noqa: E402
from parallelizer.runtime.rehearsal import rehearse_many  # noqa: E402
from run_fuzz import _randomise  # noqa: E402

# name, mesh, axis roles, seed of random ILP costs (None: the real costs)
PLANS = [("ddp2", {"dp": 2}, {"dp": "ddp"}, None), ("tp2", {"tp": 2}, {"tp": "tp"}, None),
         ("fsdp2", {"dp": 2}, {"dp": "fsdp"}, None), ("rand_dp2", {"dp": 2}, {}, 11), ("rand_tp2", {"tp": 2}, {}, 12)]
PLANS_4 = [("rand_dp2tp2", {"dp": 2, "tp": 2}, {}, 13), ("fsdp2xtp2", {"dp": 2, "tp": 2}, {"dp": "fsdp", "tp": "tp"}, None)]
FOUR = ["loss:CrossEntropyLoss_w_ls:mean", "loss:CrossEntropyLoss_ignore_w:mean", "loss:CrossEntropyLoss_soft_ls:mean",
        "loss:NLLLoss_ignore:mean", "loss:MultiMarginLoss_p2_w:mean", "loss:KLDivLoss:mean", "loss:BCEWithLogitsLoss_pw:mean",
        "loss:MultiLabelMarginLoss:mean", "loss:TripletMarginLoss:mean", "loss:CosineEmbeddingLoss:none",
        "loss:PoissonNLLLoss_full:sum", "loss:HingeEmbeddingLoss:mean",
        "op:linalg.det", "op:linalg.inv", "op:linalg.eigh", "op:linalg.svdvals", "op:fft.fft2", "op:fft.irfft",
        "op:cdist", "op:grid_sample", "op:special.logsumexp_dim1", "op:distnv_mvn", "op:distnv_categorical_pg",
        "MHA_kdim_vdim", "TDL_prenorm_gelu_mask", "LSTM_bi_2l", "GroupNorm", "Fold_overlap", "EmbeddingBag_max",
        "AdaptiveLogSoftmaxWithLoss", "Bilinear", "InstanceNorm1d_affine_track", "PixelUnshuffle", "Upsample_bicubic"]


def plan_one(traced, mesh: dict, roles: dict, seed: int | None):
    """The spec of a plan of `traced` on `mesh` with `roles`; with a seed, the ILP's costs randomised first."""
    config = PlanConfig(axis_roles=roles)
    with contextlib.redirect_stdout(io.StringIO()):
        problem, pricer = build_problem(traced, parallelizer.core.MeshSpec(tuple(mesh), tuple(mesh.values())),
                                        config=config)
        if seed is not None:
            _randomise(problem, seed)
        return spec_from_plan(to_plan(traced, problem, pricer, solve(problem, config), config))


def main(names: list[str], out: str, chunk: int = 30, plans=PLANS) -> None:
    """Trace, plan and rehearse every case of `names` on `plans`; append one JSON line per result to `out`."""
    f = open(out, "a")

    def emit(**row):
        f.write(json.dumps(row) + "\n")
        f.flush()

    pending: list[tuple] = []

    def flush():
        if not pending:
            return
        try:
            reports = rehearse_many([(nn_sweep_models.build, {"name": n}, s) for n, _, s in pending], steps=2, eps=1e-3)
            for (n, c, _), r in zip(pending, reports):
                emit(name=n, plan=c, status="match" if r.matches() else "MISMATCH", ratio=r.tolerance_ratio,
                     detail=str(r).split("; collectives")[0][:600])
        except Exception as e:  # noqa: BLE001 - a failing launch: rehearse the cases one by one to find it
            if len(pending) > 1:
                items = list(pending)
                pending.clear()
                for item in items:
                    pending.append(item)
                    flush()
                return
            n, c, _ = pending[0]
            emit(name=n, plan=c, status="rehearse_error", detail=f"{type(e).__name__}: {str(e)[:1500]}")
        pending.clear()

    for name in names:
        t0 = time.time()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                traced = parallelizer.trace(*nn_sweep_models.build(name))
        except Exception as e:  # noqa: BLE001 - recorded: typed errors are refusals, others defects
            emit(name=name, plan="trace", status="trace_error" if isinstance(e, ParallelizerError) else "UNTYPED_trace",
                 detail=f"{type(e).__name__}: {str(e)[:800]}", tb=traceback.format_exc()[-1500:])
            continue
        for plan_name, mesh, roles, seed in plans:
            if name.startswith("loss:") and not name.endswith(":mean") and plan_name not in ("ddp2", "tp2", "rand_tp2"):
                continue
            try:
                spec = plan_one(traced, mesh, roles, seed)
            except Exception as e:  # noqa: BLE001 - as above
                emit(name=name, plan=plan_name, status="plan_error" if isinstance(e, ParallelizerError) else "UNTYPED_plan",
                     detail=f"{type(e).__name__}: {str(e)[:800]}", tb=traceback.format_exc()[-1500:])
                continue
            pending.append((name, plan_name, spec))
        print(f"[sweep] {name} traced and planned in {time.time() - t0:.1f} s", file=sys.stderr, flush=True)
        if len(pending) >= chunk:
            flush()
    flush()


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--four"]
    if "--four" in sys.argv:
        main(FOUR, args[0], chunk=24, plans=PLANS_4)
    else:
        select = args[1] if len(args) > 1 else ""
        names = list(nn_sweep_models.LAYERS)
        if select == "layers":
            names = [n for n in names if ":" not in n]
        elif select:
            names = [n for n in names if n.startswith(select)]
        main(names, args[0])
