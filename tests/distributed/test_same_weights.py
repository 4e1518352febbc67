"""Ranks that built different weights are told so (a typed error naming the tensor), instead of each keeping
its own "replica" for the whole run (torch's DDP broadcasts rank 0's weights for the same reason)."""
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
