"""Rank bodies of tests/distributed/test_narrow_sums.py (importable by spawned ranks): sums split over ranks of
float16 / bfloat16 values, against one device, which accumulates them in float32 and rounds once (round 24, r24b).

Values are chosen so that rounding each rank's summand, or each partial sum of the ranks' summands, in the narrow
dtype gives another number than one rounding of the whole sum: float16 summands beyond 65504 (inf, then NaN), and
a cancellation (big + s + s - big = 2s, but big + s rounds to big, so 0)."""
from __future__ import annotations

import contextlib
import copy
import io
import json
import warnings

import torch
import torch.nn.functional as F
from torch import nn

import parallelizer
from parallelizer.planner import Plan
from parallelizer.rewriter import collectives
from parallelizer.rewriter.grad_sync import grad_all_reduce_bucketed
from parallelizer.rewriter.localize import sharded_cross_entropy
from parallelizer.rewriter.state import gather_tensor

NARROW = (torch.float16, torch.bfloat16)
SUMMED_WIDER = (*NARROW, torch.complex32)
"""The dtypes whose sums run wider (`core.redistribute.sum_dtype`): complex32 as complex64 (round 26; gloo summed
its float16 parts in float16 before)."""
RMS_HIDDEN, RMS_BATCH = 1024, 64


def summands(rank: int, world_size: int, dtype: torch.dtype) -> torch.Tensor:
    """This rank's summand (2 * world_size elements): element j holds a cancellation with its big value on rank j
    (big, s, ..., -big around the ring: exact sum (world_size - 2) * s, where big + s rounds to big in `dtype`),
    element world_size + j an overflow in float16: 0.6 * 65504 on ranks j and j + 1, -0.45 * 65504 on the others
    (exact sum 0.3 * 65504 on 4 ranks, finite, while 0.6 * 65504 + 0.6 * 65504 is inf; bfloat16 has float32's
    range: a plain sum there)."""
    if dtype.is_complex:  # float16 parts: the real part's summands, and the imaginary part's in reverse order
        real = summands(rank, world_size, torch.float16)
        return torch.complex(real.float(), real.flip(0).float()).to(dtype)
    big = {torch.float16: 2048.0, torch.bfloat16: 256.0}[dtype]
    top = torch.finfo(torch.float16).max
    out = []
    for j in range(world_size):
        k = (rank - j) % world_size  # position of this rank in the ring starting at rank j
        out.append(big if k == 0 else -big if k == world_size - 1 else 1.0)
    for j in range(world_size):
        k = (rank - j) % world_size
        out.append(0.6 * top if k in (0, 1) else -0.45 * top)
    return torch.tensor(out, dtype=dtype)


def one_device_sum(world_size: int, dtype: torch.dtype) -> torch.Tensor:
    """The sum over ranks as one device computes it: torch.sum of the stacked summands in `dtype` (float32
    accumulation inside the kernel, one rounding; complex32, which no CPU sum kernel takes, in complex64, rounded
    once)."""
    stacked = torch.stack([summands(r, world_size, dtype) for r in range(world_size)])
    return stacked.to(torch.complex64).sum(0).to(dtype) if dtype.is_complex else stacked.sum(0)


def collective_sums(rank: int, world_size: int) -> list[dict]:
    """Every summing collective of the emitted program on `summands`, per narrow dtype: the forward all_reduce and
    reduce_scatter of a Partial, the backward sums of grad_all_reduce (Megatron's f, DDP's synchronous sync),
    all_gather_rs (FSDP) and the bucketed DDP gradient sync, each beside one device's sum."""
    ranks = list(range(world_size))
    out = []
    for dtype in SUMMED_WIDER:
        mine, eager = summands(rank, world_size, dtype), one_device_sum(world_size, dtype)
        got = {"all_reduce": collectives.all_reduce(mine, ranks),
               "reduce_scatter": collectives.reduce_scatter(mine, 0, ranks)}
        want = {"all_reduce": eager, "reduce_scatter": eager.chunk(world_size)[rank]}
        n = mine.numel()
        for name, use in (("grad_all_reduce", lambda p: collectives.grad_all_reduce(p, ranks)),
                          ("all_gather_rs", lambda p: collectives.all_gather_rs(p, 0, ranks)),
                          ("grad_all_reduce_bucketed", lambda p: grad_all_reduce_bucketed(p, ranks, 2**20))):
            shard = n // world_size if name == "all_gather_rs" else n
            p = nn.Parameter(torch.zeros(shard, dtype=dtype))
            use(p).backward(mine)  # this rank's gradient of the use is `mine`: the gradient sum is the ranks' sum
            got[name] = p.grad
            want[name] = eager.chunk(world_size)[rank] if name == "all_gather_rs" else eager
        if dtype.is_complex:  # complex32 does not pickle (torch 2.13.0): sent as complex64, exact, its dtype named
            assert all(t.dtype == dtype for t in (*got.values(), *want.values())), got
            got, want = ({k: t.to(torch.complex64) for k, t in d.items()} for d in (got, want))
        out.append({"dtype": str(dtype), "got": got, "want": want})
    return out


class Mlp(nn.Module):
    """x (B, 4) -> fc1 (4 -> 8) -> fc2 (8 -> 4), no biases; on tp=2 the planner makes fc1 column-parallel and
    fc2 row-parallel: fc2's product is a Partial of the two halves of the hidden dim."""

    def __init__(self, head: str = "linear", hidden: int = 8) -> None:
        super().__init__()
        self.head = head
        self.fc1, self.fc2 = nn.Linear(4, hidden, bias=False), nn.Linear(hidden, 4, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)  # (B, 8)
        if self.head == "sum":  # a sum over the sharded hidden dim (fc2's weight is 0 in this case)
            return self.fc2(h) + h.sum(-1, keepdim=True)
        if self.head == "rms":  # an RMS statistic over the sharded hidden dim (a mean of squares)
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True))
        return self.fc2(h)


def mlp_case(head: str, dtype: torch.dtype) -> tuple[nn.Module, torch.Tensor]:
    """The model in `dtype` and its input (module docstring's values).
    float16: the hidden vector is x repeated twice (1000 each); fc2's row i weighs hidden i by 80 and hidden 4 + i
    by -72: the halves' products 80000 and -72000 overflow float16, their sum 8000 does not. "sum": hidden
    (20000 x 4 | -18000 x 4), fc2 = 0: the halves of the sum over the hidden dim are 80000 and -72000. "rms":
    x = 200, so the squares are 40000 and each half's sum 160000, the mean 40000.
    bfloat16: hidden all ones, fc2's row i = (128, 128, 1, 0 | -128, -127, 0, 0): halves 257 (rounds to 256) and
    -255, sum 2; "sum": hidden (64, 64, 0.25, 0 | -64, -63.75, 0, 0): halves 128.25 and -127.75, sum 0.5."""
    if head == "rms":  # wide enough that the planner keeps the hidden dim sharded through the statistic
        model = Mlp(head, RMS_HIDDEN)
        with torch.no_grad():
            model.fc1.weight.copy_(torch.eye(4).repeat(RMS_HIDDEN // 4, 1))
            model.fc2.weight.fill_(0.01)
        x = torch.full((RMS_BATCH, 4), 200.0 if dtype == torch.float16 else 3.0)
        return model.to(dtype), x.to(dtype)
    model = Mlp(head)
    with torch.no_grad():
        if dtype == torch.float16:
            rows = torch.cat([torch.full((4, 4), 5.0), torch.full((4, 4), -4.5)]) if head == "sum" \
                else torch.cat([torch.eye(4), torch.eye(4)])
            w = torch.zeros(4, 8)
            w[:, :4], w[:, 4:] = torch.eye(4) * 80.0, torch.eye(4) * -72.0
            x = torch.full((2, 4), 200.0 if head == "rms" else 1000.0)
        else:
            rows = torch.tensor([[64.0] * 4, [64.0] * 4, [0.25] * 4, [0.0] * 4,
                                 [-64.0] * 4, [-63.75] * 4, [0.0] * 4, [0.0] * 4]) / 4 if head == "sum" \
                else torch.full((8, 4), 0.25)
            w = torch.tensor([[128.0, 128.0, 1.0, 0.0, -128.0, -127.0, 0.0, 0.0]]).repeat(4, 1)
            x = torch.ones(2, 4)
        model.fc1.weight.copy_(rows)
        model.fc2.weight.copy_(w * 0.0 if head == "sum" else w)
    return model.to(dtype), x.to(dtype)


RMS_EDIT = {"pow_1": "S(1) -> S(1)", "mean": "S(1) -> P", "mul": "S(1) R -> S(1)"}
"""The "rms" case's statistic over the sharded hidden dim, hand-edited into the plan (the planner gathers the
(64, 1024) hidden tensor there instead: a layout any rule allows, README "hand-edit layouts")."""


def _edited_plan(model: nn.Module, x: torch.Tensor, mesh: dict, roles: dict, edit: dict):
    """The planner's plan for `model` with the strategies of `edit` (node -> "inputs -> output") written into its
    JSON (`Plan.from_json` checks them against the rules)."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        doc = parallelizer.plan(parallelizer.trace(model, (x,)), mesh, axis_roles=roles).to_dict()
    for row in doc["graph"]:
        row[2] = edit.get(row[0], row[2])
    return Plan.from_json(json.dumps(doc))


def edited_plans(cases: list[tuple[str, str]], world_size: int) -> dict[tuple[str, str], str]:
    """(head, dtype name) -> the JSON of the "rms" cases' plans with `RMS_EDIT` on tp=world_size, made once in the
    launching process (round 27, r27a: every rank traced and planned them again before its own trace)."""
    return {(head, name): _edited_plan(*mlp_case(head, getattr(torch, name)), {"tp": world_size}, {"tp": "tp"},
                                       RMS_EDIT).to_json() for head, name in cases if head == "rms"}


def planned_sums(rank: int, world_size: int, cases: list[tuple[str, str]],
                 plans: dict[tuple[str, str], str]) -> list[dict]:
    """Each (head, dtype name) of `mlp_case` on tp=world_size (the "rms" cases apply their `edited_plans` JSON from
    `plans`): pm's output and gradients beside the model's on one device, and the nodes whose output is a Partial
    (so the test knows which split sums it exercised)."""
    out = []
    for head, dtype_name in cases:
        dtype = getattr(torch, dtype_name)
        model, x = mlp_case(head, dtype)
        reference = copy.deepcopy(model)
        mesh, roles = {"tp": world_size}, {"tp": "tp"}
        plan = Plan.from_json(plans[(head, dtype_name)]) if head == "rms" else None
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            pm = parallelizer.auto_parallelize(model, (x,), mesh=mesh, axis_roles=roles, plan=plan)
        got = pm(x)
        got.float().sum().backward()
        eager = reference(x)
        eager.float().sum().backward()
        grads = {fqn: (gather_tensor(p.grad, pm.spec.params[fqn], pm.spec.mesh, pm.groups,
                                     tuple(pm.traced.parameters[fqn].shape), pm.coords),
                       reference.get_parameter(fqn).grad) for fqn, p in pm.named_parameters()}
        out.append({"case": (head, dtype_name), "out": (got.detach(), eager.detach()), "grads": grads,
                    "partials": sorted(n for n, s in pm.spec.nodes.items() if "P" in str(s.output))})
    return out


def vocab_parallel_loss(rank: int, world_size: int) -> list[dict]:
    """The vocab-parallel cross-entropy (`localize.sharded_cross_entropy`, classes split over the world) of float16
    logits over 80000 classes (each rank's sum of exponentials below 65504, their total beyond it) and of bfloat16
    logits, reductions none / sum / mean, beside F.cross_entropy on the whole logits. The logits are (1, C, 3),
    classes on dim 1 with a trailing dim: torch's CPU log_softmax over a LAST dim holds its float16 sum in float16
    (inf for 80000 classes: F.cross_entropy of (3, 80000) float16 logits is inf on one CPU, 11.29 in float32 and
    on CUDA), over another dim in float32, as one device's accumulation should be."""
    out = []
    classes = 80000
    for dtype in NARROW:
        gen = torch.Generator().manual_seed(0)
        logits = (torch.randn(1, classes, 3, generator=gen) * 0.01).to(dtype)  # (N, C, d)
        target = torch.tensor([[5, classes - 3, 40000]])  # (N, d)
        start = rank * classes // world_size
        mine = logits[:, start:(rank + 1) * classes // world_size]
        for reduction, name in ((0, "none"), (2, "sum"), (1, "mean")):
            got = sharded_cross_entropy(mine, target, None, reduction, -100, 0.0, [], [list(range(world_size))],
                                        start, classes)
            out.append({"case": (str(dtype), name), "got": got,
                        "want": F.cross_entropy(logits, target, reduction=name)})
    return out


def two_rank_cases(rank: int, world_size: int, cases: list[tuple[str, str]],
                   plans: dict[tuple[str, str], str]) -> dict:
    """`planned_sums` and `vocab_parallel_loss` in one launch."""
    return {"planned": planned_sums(rank, world_size, cases, plans), "vocab": vocab_parallel_loss(rank, world_size)}
