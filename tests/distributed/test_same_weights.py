"""Ranks that built different weights are told so (a typed error naming the tensor), instead of each keeping
its own "replica" for the whole run (torch's DDP broadcasts rank 0's weights for the same reason)."""
import copy

import pytest
import torch

from parallelizer.runtime import spawn
from parallelizer.runtime.launch import DistributedError

pytestmark = pytest.mark.distributed


def _build_and_check(rank: int, world_size: int, same: bool) -> str:
    from parallelizer.runtime.replicas import check_same_weights
    torch.manual_seed(0 if same else rank)
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 2))
    check_same_weights(model)
    return "ok"


def test_equal_weights_pass_and_different_weights_are_named():
    assert spawn(_build_and_check, 2, True, timeout_s=120) == ["ok", "ok"]
    with pytest.raises(DistributedError, match=r"PlanMismatchError: the ranks built different weights.*'0\.weight'"):
        spawn(_build_and_check, 2, False, timeout_s=120)


def _python_random_init(rank: int, world_size: int) -> str:
    """torch seeded on every rank, but the construction draws from Python's generator, which each process
    starts elsewhere (lucidrains' hyper-connections: `init_residual_index = randrange(num_residual_streams)`)."""
    import random
    from parallelizer.runtime.replicas import check_same_weights
    torch.manual_seed(0)
    random.seed(rank)  # as two processes' own states differ
    model = torch.nn.Module()
    alpha = torch.zeros(4, 1)
    alpha[random.randrange(4), 0] = 1.0
    model.static_alpha = torch.nn.Parameter(alpha)
    check_same_weights(model)
    return "ok"


def test_weights_drawn_from_pythons_generator_get_the_remedy_that_seeds_it():
    """Trial r16b (x-transformers-style LocalTransformer with hyper-connections): the remedy said only "call
    torch.manual_seed(SEED)", which the model's factory already did."""
    with pytest.raises(DistributedError, match=r"'static_alpha'.*random\.seed\(SEED\)"):
        spawn(_python_random_init, 2, timeout_s=120)


def _complex_imag_differs(rank: int, world_size: int) -> str:
    """A complex parameter (FNO's spectral weights) whose imaginary parts differ between the ranks, real
    parts equal."""
    from parallelizer.runtime.replicas import check_same_weights
    model = torch.nn.Module()
    model.w = torch.nn.Parameter(torch.complex(torch.ones(2, 3), torch.full((2, 3), float(rank))))
    check_same_weights(model)
    return "ok"


def test_complex_weights_differing_in_their_imaginary_parts_are_named():
    """Round 12 (r12b): the digest cast complex tensors with `.double()`, which drops the imaginary parts (a
    ComplexWarning), so ranks whose complex weights differed there passed the check and trained apart."""
    with pytest.raises(DistributedError, match=r"PlanMismatchError: the ranks built different weights.*'w'"):
        spawn(_complex_imag_differs, 2, timeout_s=120)


class _Blocks(torch.nn.Module):
    """Two identical residual blocks and a head (pipeline stages cut between the blocks)."""

    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                                              torch.nn.Linear(16, 8)) for _ in range(2))
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


def _inputs_per_rank(rank: int, world_size: int) -> dict:
    """Each of 2 ranks calls pm with the same global batch (must run), with its own batch (the DDP habit), with
    the batch's rows in another order, and pm.step with its own target; on ddp, tp and pp=2: the outcomes. Each
    case runs on a module within its first calls (`replicas.CHECKED_CALLS`: later calls are not checked, "late
    own batch")."""
    import parallelizer
    from parallelizer.runtime.replicas import CHECKED_CALLS
    out = {}
    torch.manual_seed(0)
    x, y = torch.randn(4, 8), torch.randn(4, 4)
    own = torch.randn(4, 8, generator=torch.Generator().manual_seed(10 + rank))
    mse = torch.nn.functional.mse_loss
    for mesh, roles in (({"dp": 2}, {"dp": "ddp"}), ({"tp": 2}, {"tp": "tp"}), ({"pp": 2}, None)):
        torch.manual_seed(0)
        pm = parallelizer.auto_parallelize(_Blocks(), (x,), mesh=mesh, axis_roles=roles)
        axis = next(iter(mesh))
        calls = {"same": (x, y), "own batch": (own, y), "rows permuted": (x.roll(rank, 0), y),
                 "own target": (x, y + rank)}
        for name, (a, t) in calls.items():
            pm.__dict__["_input_checks"] = 0  # each case as the module's first call
            try:
                if axis == "pp" or name == "own target":
                    pm.step(a, target=t, loss_fn=mse)
                else:
                    pm(a)
                out[f"{axis} {name}"] = "ran"
            except Exception as exc:  # noqa: BLE001 - the outcome is the result
                out[f"{axis} {name}"] = f"{type(exc).__name__}: {exc}"
        if axis == "dp":
            for _ in range(CHECKED_CALLS):
                pm(x)
            pm(own)  # past the first calls: not compared (no collective, no host synchronisation)
            out["dp late own batch"] = "ran"
    return out


def test_inputs_that_differ_between_ranks_are_named():
    """Round 13 (r13d): every rank must pass the same global batch, but nothing checked it: a DDP habit (each
    rank loading its own batch) ran silently, a ddp rank training on its rows of its own batch and tp=2 ranks
    summing partial products of different samples (the two ranks returned losses 21.68 and 20.32)."""
    for r in spawn(_inputs_per_rank, 2, timeout_s=300):
        for axis in ("dp", "tp", "pp"):
            assert r[f"{axis} same"] == "ran", r
            for name, what in (("own batch", "'x'"), ("rows permuted", "'x'"), ("own target", "'target'")):
                msg = r[f"{axis} {name}"]
                assert msg.startswith("PlanMismatchError: ") and f"input(s) {what} differ between ranks" in msg, (axis, name, msg)
                assert "Remedy: give every rank the same batch" in msg
        assert r["dp late own batch"] == "ran"


class _DropStream(torch.nn.Module):
    """(B, T, 8) -> 0-d: a residual MLP (row-parallel `down` on tp: the stream is Replicate), a dropout(p), a
    LayerNorm and a head; the square mean of the head is the loss. The dropout acts on `where`: "stream" (the
    residual stream), "weight" (DropConnect / AWD-LSTM's WeightDrop on `down`'s weight: a replicated parameter under
    ddp) or "partial" (`down`'s product before its bias: a Partial value on tp, summed after the dropout)."""

    def __init__(self, p: float = 0.5, where: str = "stream"):
        super().__init__()
        self.p, self.where = p, where
        self.up, self.down = torch.nn.Linear(8, 32), torch.nn.Linear(32, 8)
        self.ln, self.head = torch.nn.LayerNorm(8), torch.nn.Linear(8, 4)

    def forward(self, x):
        f, u = torch.nn.functional, torch.relu(self.up(x))
        if self.where == "weight":
            h = x + f.linear(u, f.dropout(self.down.weight, self.p, self.training), self.down.bias)
        elif self.where == "partial":
            h = x + f.dropout(f.linear(u, self.down.weight), self.p, self.training) + self.down.bias
        else:
            h = f.dropout(x + self.down(u), self.p, self.training)
        return self.head(self.ln(h)).pow(2).mean()


_GENERATOR_CASES = {  # name: (dropout p, where, mesh, roles, stream forced Replicate, seedings run in order)
    "tp, replicated stream": (0.5, "stream", {"tp": 2}, {"tp": "tp"}, True, ("same", "per rank")),
    "tp, dropout on the row-parallel Partial": (0.5, "partial", {"tp": 2}, {"tp": "tp"}, False, ("same", "per rank")),
    "ddp, DropConnect": (0.5, "weight", {"dp": 2}, {"dp": "ddp"}, False, ("same", "per rank")),
    "tp, stream sharded by the planner": (0.5, "stream", {"tp": 2}, {"tp": "tp"}, False, ("per rank",)),
    "tp, no dropout": (0.0, "stream", {"tp": 2}, {"tp": "tp"}, True, ("per rank",)),
}


def _generator_specs() -> dict:
    """The plan of each case as a spec (made once, in the parent); "replicated stream": the dropout and the
    LayerNorm forced to Replicate (Megatron's layout without sequence parallelism: every tp rank holds the whole
    stream)."""
    import contextlib
    import dataclasses
    import io
    import parallelizer
    from parallelizer.core.layout import Layout
    from parallelizer.rewriter.spec import NodeSharding, spec_from_plan
    specs = {}
    for case, (p, where, mesh, roles, replicated, _) in _GENERATOR_CASES.items():
        torch.manual_seed(0)
        traced = parallelizer.trace(_DropStream(p, where), (torch.randn(4, 6, 8),))
        with contextlib.redirect_stdout(io.StringIO()):
            plan = parallelizer.plan(traced, mesh, axis_roles=roles)
        spec = spec_from_plan(plan)
        if replicated:
            nodes, r = dict(spec.nodes), Layout.parse("R")
            for name, n in plan.nodes.items():
                if n.op in ("aten.dropout.default", "aten.layer_norm.default"):
                    nodes[name] = NodeSharding((r,) * len(n.inputs), r)
            spec = dataclasses.replace(spec, nodes=nodes)
        specs[case] = spec
    return specs


def _generators_per_rank(rank: int, world_size: int, specs: dict) -> dict:
    """Each case of `_GENERATOR_CASES` on 2 ranks, one module per case, with torch's generator seeded the same
    on both ranks and/or per rank (`torch.manual_seed(5 + rank)`, the DDP habit), 2 SGD steps each: pm's losses and
    gradients and the eager model's from the same generator state and weights (a dropout on a Replicate value
    draws its whole mask from the generator as is, as eager does; a per-rank run follows the same-seed one, each
    side from its own trained weights), the replicated LayerNorm weight after the steps, or the error (raised
    alike on every rank)."""
    from parallelizer.rewriter.spec import all_axis_groups
    from parallelizer.runtime import create_groups
    from parallelizer.runtime.module import ParallelModule
    from parallelizer.tracer.trace import trace
    out = {}
    for case, (p, where, *_, seedings) in _GENERATOR_CASES.items():
        torch.manual_seed(0)
        model, x = _DropStream(p, where), torch.randn(4, 6, 8)
        reference = copy.deepcopy(model)
        create_groups(all_axis_groups(specs[case].mesh))
        pm = ParallelModule(trace(model, (x,)), specs[case], rank, model)
        for seeds in seedings:  # one module per case: each seeding within its first calls, which are checked
            pm.__dict__["_input_checks"] = 0
            torch.manual_seed(5 + rank if seeds == "per rank" else 5)
            state, runs = torch.get_rng_state(), {}
            try:
                for name, m in (("pm", pm), ("eager", reference)):
                    torch.set_rng_state(state)
                    opt, runs[name], runs[f"{name} grads"] = torch.optim.SGD(m.parameters(), lr=0.5), [], []
                    for _ in range(2):
                        loss = m(x)
                        loss.backward()
                        runs[f"{name} grads"].append(m.get_parameter("down.weight").grad.clone())
                        opt.step()
                        opt.zero_grad()
                        runs[name].append(loss.item())
            except Exception as exc:  # noqa: BLE001 - the outcome is the result
                out[case, seeds] = {"error": f"{type(exc).__name__}: {exc}"}
                continue
            out[case, seeds] = {**runs, "ln": pm.get_parameter("ln.weight").detach().clone(),
                                "layout": str(specs[case].params["down.weight"])}
    return out


def test_ranks_whose_generators_differ_are_refused_where_they_must_draw_alike():
    """Round 24 (r24g; tt-metal#55947, slapo#21, InternLM#405, transformers#31412: dropout seeds across ranks):
    a random op on a Replicate value draws from torch's generator as is on every rank. Ranks seeded apart
    (`torch.manual_seed(seed + rank)`) drew different masks for their copies of one value: on tp=2 with the stream
    replicated, a replicated LayerNorm weight parted silently (0.056 apart after 2 SGD steps); the planner's tp=2 plan
    of a dropout on a row-parallel product (a Partial: each rank masks its summand) gave loss 0.1040 where eager
    gives 0.1177 / 0.1069 under rank 0's / rank 1's generator; under plain ddp a
    DropConnect weight got one mask per rank, so its all-reduced gradient mixed two masks for one batch (0.083
    from the eager model's under either rank's generator). Now a PlanMismatchError on every rank names the dropout
    and the remedy; a dropout the plan shards over tp (each rank draws its own piece) and a model that draws
    nothing run with per-rank seeds, and with the same seed a replicated draw gives eager's numbers."""
    specs = _generator_specs()
    partial = specs["tp, dropout on the row-parallel Partial"]  # the planner's own choice: dropout on the Partial
    assert [str(n.inputs[0]) for name, n in partial.nodes.items() if name.startswith("dropout")] == ["P"]
    ranks = spawn(_generators_per_rank, 2, specs, timeout_s=300)
    for r in ranks:
        for case in ("tp, replicated stream", "tp, dropout on the row-parallel Partial", "ddp, DropConnect"):
            same = r[case, "same"]
            torch.testing.assert_close(torch.tensor(same["pm"]), torch.tensor(same["eager"]), msg=case)
            if same["layout"] == "R":  # gradients of the whole weight (ddp), against the eager model's
                torch.testing.assert_close(same["pm grads"], same["eager grads"], msg=case)
            error = r[case, "per rank"].get("error", "")
            assert error.startswith("PlanMismatchError") and "dropout" in error and "manual_seed" in error, (case, r)
        torch.testing.assert_close(torch.tensor(r["tp, no dropout", "per rank"]["pm"]),
                                   torch.tensor(r["tp, no dropout", "per rank"]["eager"]))
        assert "error" not in r["tp, stream sharded by the planner", "per rank"], r
    for case in (("tp, replicated stream", "same"), ("tp, stream sharded by the planner", "per rank")):
        assert torch.equal(ranks[0][case]["ln"], ranks[1][case]["ln"]), case  # replicas stay equal
