"""Models whose forward runs an op that returns views of its input without declaring them (unsafe_chunk,
unsafe_split, unsafe_split_with_sizes) or adds size-1 dims (atleast_1d / 2d / 3d) on a batch-sharded activation,
and one that writes in place through unsafe_chunk (r18h: refused under ddp / fsdp, no rule kept the batch sharded);
importable by spawned ranks. (6, 16) -> Linear -> op -> Linear -> outputs."""
from __future__ import annotations

import torch
from torch import nn

WHICH = ("unsafe_chunk", "unsafe_split", "unsafe_split_with_sizes", "atleast_1d", "atleast_2d", "atleast_3d",
         "unsafe_chunk_write")
OP = {"unsafe_chunk_write": "unsafe_chunk"}  # the aten op each model runs


class AliasOp(nn.Module):
    def __init__(self, which: str) -> None:
        super().__init__()
        self.which = which
        self.up, self.down = nn.Linear(8, 16), nn.Linear(16, 5)
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 3))

    def forward(self, x):
        h = self.up(x)  # (B, 16)
        w = self.which
        if w == "unsafe_chunk":
            a, b = torch.unsafe_chunk(h, 2, -1)
            h = torch.cat([a * torch.sigmoid(b), b], -1)
        elif w == "unsafe_split":
            a, b = torch.unsafe_split(h, 8, -1)
            h = torch.cat([torch.tanh(a), a * b], -1)
        elif w == "unsafe_split_with_sizes":
            a, b = torch.unsafe_split_with_sizes(h, [6, 10], -1)
            h = torch.cat([b, a.relu()], -1)
        elif w == "atleast_1d":
            h = h * torch.atleast_1d(h.sum(-1)).unsqueeze(-1)  # (B,): the input itself
        elif w == "atleast_2d":
            s = torch.atleast_2d(torch.tanh(h.sum(-1)))  # (B,) -> (1, B): the batch moves to dim 1
            h = h * s.t()
        elif w == "atleast_3d":
            h = (torch.atleast_3d(h) * self.scale).mean(-1)  # (B, 16) -> (B, 16, 1)
        elif w == "unsafe_chunk_write":
            torch.unsafe_chunk(h, 2, -1)[0].mul_(2.0)  # writes h's first half in place
        else:
            raise KeyError(w)
        return self.down(h)


def alias_op(which: str):
    torch.manual_seed(0)
    return AliasOp(which), (torch.randn(6, 8, generator=torch.Generator().manual_seed(1)),)


def data_role_plans(model: nn.Module, inputs: tuple, op: str):
    """For the ddp and fsdp roles on dp=2: (role, plan, name of the one traced node whose op starts with
    `aten.<op>.`, the activation all-gathers / all-to-alls its plan moves (parameters' gathers aside)); shared by
    the unit tests of the alias-op and reduction / dropout rules."""
    import contextlib
    import io

    import parallelizer
    traced = parallelizer.trace(model, inputs)
    (name,) = [n for n, info in traced.nodes.items() if info.op_name.startswith(f"aten.{op}.")]
    for role in ("ddp", "fsdp"):
        with contextlib.redirect_stdout(io.StringIO()):
            plan = parallelizer.plan(traced, {"dp": 2}, axis_roles={"dp": role})
        moved = [(e.src, e.dst, s.kind) for e, s in plan.steps() if e.dst != "output"
                 and s.kind in ("all_gather", "all_to_all") and not e.src.startswith("p_")]
        yield role, plan, name, moved
