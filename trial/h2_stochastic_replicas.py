"""h2: stochastic rounding (rand_like in forward) cannot match one device; check that REPLICAS stay replicas:
after 2 AdamW steps every parameter's full value is equal on all ranks (tp=2, ddp, fsdp; tp=3; dp2 x tp2)."""
import contextlib
import io
import sys
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import parallelizer  # noqa: E402
import h2_models as M  # noqa: E402
from h2_run import plan, MESHES  # noqa: E402
from parallelizer.runtime.launch import spawn  # noqa: E402
from parallelizer.runtime.module import ParallelModule  # noqa: E402
from parallelizer.runtime.launch import create_groups  # noqa: E402
from parallelizer.rewriter.spec import all_axis_groups  # noqa: E402


def body(rank, world, specs):
    out = []
    for spec in specs:
        create_groups(all_axis_groups(spec.mesh))
        torch.manual_seed(0)
        model, args = M.stochastic_round()
        with contextlib.redirect_stdout(io.StringIO()):
            traced = parallelizer.trace(model, args)
        pm = ParallelModule(traced, spec, rank, model)
        opt = torch.optim.AdamW(pm.parameters(), lr=1e-2, eps=1e-3)
        torch.manual_seed(100 + rank * 0)  # same user seed on every rank
        for _ in range(2):
            opt.zero_grad()
            pm(*args).float().pow(2).mean().backward()
            opt.step()
        full = pm.full_state_dict() if hasattr(pm, "full_state_dict") else pm.state_dict()
        spread = 0.0
        for k, v in full.items():
            v = v.detach().float().contiguous()
            g = [torch.empty_like(v) for _ in range(world)]
            dist.all_gather(g, v)
            spread = max(spread, max((x - g[0]).abs().max().item() for x in g))
        out.append(spread)
    return out


if __name__ == "__main__":
    for world in (2, 3, 4):
        specs, names = [], []
        for mesh, roles in MESHES[world]:
            for costs in ("real", "random"):
                specs.append(plan(M.stochastic_round, mesh, roles, costs, zlib.crc32(b"stochastic_round") % 1000))
                names.append(f"{mesh} {roles} {costs}")
        res = spawn(body, world, specs, timeout_s=600)
        for i, n in enumerate(names):
            print(n, "max spread of a parameter across ranks:", max(r[i] for r in res))
