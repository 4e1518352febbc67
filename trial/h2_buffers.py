"""h2: buffers written in forward from batch-level values (fp8 delayed-scaling amax history, center-loss centers)
after 2 AdamW steps, compared with eager directly (rehearse_many reports buffers=None for non-pipeline plans)."""
import contextlib
import copy
import io
import sys
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402

import parallelizer  # noqa: E402
import h2_models as M  # noqa: E402
from h2_run import plan, MESHES  # noqa: E402
from parallelizer.runtime.launch import spawn, create_groups  # noqa: E402
from parallelizer.rewriter.spec import all_axis_groups  # noqa: E402
from parallelizer.runtime.module import ParallelModule  # noqa: E402


def delayed_small():
    m, a = M.delayed_scaling()
    m.amax_x.fill_(0.01)
    m.amax_w.fill_(0.01)
    return m, a


def run(model, args, steps=2):
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2, eps=1e-3)
    for _ in range(steps):
        opt.zero_grad()
        out = model(*args)
        (out if out.ndim == 0 else out.float().pow(2).mean()).backward()
        opt.step()


def body(rank, world, cases):
    out = []
    for fn, spec in cases:
        create_groups(all_axis_groups(spec.mesh))
        torch.manual_seed(0)
        model, args = fn()
        ref = copy.deepcopy(model)
        with contextlib.redirect_stdout(io.StringIO()):
            traced = parallelizer.trace(copy.deepcopy(model), args)
        pm = ParallelModule(traced, spec, rank, model)
        run(pm, args)
        run(ref, args)
        full = pm.full_state_dict()
        out.append({k: (full[k].float() - b.float()).abs().max().item() for k, b in ref.named_buffers()})
    return out


if __name__ == "__main__":
    for world in (2, 3, 4):
        cases, names = [], []
        for fn in (delayed_small, M.center_loss):
            for mesh, roles in MESHES[world]:
                for costs in ("real", "random"):
                    cases.append((fn, plan(fn, mesh, roles, costs, zlib.crc32(fn.__name__.encode()) % 1000)))
                    names.append(f"{fn.__name__} {mesh} {roles} {costs}")
        res = spawn(body, world, cases, timeout_s=600)
        for i, n in enumerate(names):
            print(n, "buffer |diff| vs eager after 2 steps:", {k: max(r[i][k] for r in res) for k in res[0][i]})
