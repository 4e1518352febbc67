"""Issue 12, items 2, 3 and 4: tensors made inside forward (export's lifted constants), non-tensor inputs
(bool, int, float, None, str, nested dicts) and ops naming a device go through trace -> plan ->
ParallelModule with eager's numbers."""
import pytest
import torch

import parallelizer
from parallelizer.errors import PlanMismatchError


@pytest.fixture(autouse=True)
def _no_leftover_process_group():
    """auto_parallelize outside a launcher creates a one-process gloo group; do not leak it to other tests."""
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


class Scaled(torch.nn.Module):
    """The issue's example: a tensor created inside forward."""

    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.l(x) * torch.tensor([1.0, 2.0, 3.0, 4.0])


class FalconPick(torch.nn.Module):
    """Falcon-style list indexing of a fused projection: the index list becomes a lifted int64 constant."""

    def __init__(self):
        super().__init__()
        self.fused = torch.nn.Linear(4, 12)

    def forward(self, x):
        fused = self.fused(x).view(x.shape[0], 3, 4)
        return fused[..., [-2], :].squeeze(1)


@pytest.mark.parametrize("cls", [Scaled, FalconPick])
def test_lifted_constants_are_materialised_per_rank(cls):
    torch.manual_seed(0)
    model, x = cls(), torch.randn(8, 4)
    traced = parallelizer.trace(model, (x,))
    constants = [p for p in traced.parameters.values() if p.is_constant]
    assert len(constants) == 1 and constants[0].is_buffer and constants[0].fqn.startswith("lifted_tensor")
    pm = parallelizer.auto_parallelize(model, (x,))
    torch.testing.assert_close(pm(x), model(x))  # eager on one device
    assert sorted(pm.full_state_dict()) == sorted(model.state_dict())  # constants are not state
    assert constants[0].fqn not in pm.state_dict()
    fresh = cls()
    fresh.load_state_dict(pm.full_state_dict(), strict=True)


class ScaledOnDevice(Scaled):
    def forward(self, x):
        return self.l(x) * torch.tensor([1.0, 2.0, 3.0, 4.0], device=x.device)


def test_a_constant_traced_on_meta_has_no_values_and_says_what_to_do():
    with torch.device("meta"):
        model = ScaledOnDevice()
    with pytest.raises(PlanMismatchError, match=r"'lifted_tensor_0' \(4,\), a tensor created inside forward, was "
                                                r"traced on the meta device.*build the model on CPU"):
        parallelizer.auto_parallelize(model, (torch.randn(8, 4),))
    cpu = ScaledOnDevice()
    torch.testing.assert_close(parallelizer.auto_parallelize(cpu, (torch.ones(8, 4),))(torch.ones(8, 4)),
                               cpu(torch.ones(8, 4)))


class WithScalars(torch.nn.Module):
    """forward(x, scale: float, cfg: {"k": {"m": int}, "mode": str}, opt=None, flag: bool, return_dict: bool)."""

    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(4, 4)

    def forward(self, x, scale=1.0, cfg=None, opt=None, flag=False, return_dict=False):
        y = self.l(x) * scale
        if flag:
            y = y + 1
        if cfg is not None and cfg["mode"] == "times":
            y = y * cfg["k"]["m"]
        if opt is not None:
            y = y - 1
        return {"out": y, "mode": cfg["mode"]} if return_dict else y


SCALARS = {"scale": 0.5, "cfg": {"k": {"m": 3}, "mode": "times"}, "opt": None, "flag": True, "return_dict": True}


def test_non_tensor_inputs_are_traced_constants_everywhere():
    torch.manual_seed(0)
    model, x = WithScalars(), torch.randn(8, 4)
    traced = parallelizer.trace(model, (x,), SCALARS)
    assert traced.input_names == ("x",)
    assert traced.constant_inputs == {"scale": 0.5, "cfg_k_m": 3, "cfg_mode": "times", "opt": None, "flag": True,
                                      "return_dict": True}
    plan = parallelizer.plan(traced, {"dp": 2})  # the KeyError: 0.5 / KeyError: True
    assert plan.model["inputs"] == {"x": [8, 4]}
    pm = parallelizer.auto_parallelize(model, (x,), example_kwargs=SCALARS)
    expected = model(x, **SCALARS)  # eager: (x W^T + b) * 0.5 + 1, times 3
    got = pm(x, **dict(reversed(list(SCALARS.items()))))  # keywords in any order
    torch.testing.assert_close(got["out"], expected["out"])
    assert got["mode"] == "times"
    with pytest.raises(ValueError, match=r"input 'scale' is 0.7 but the graph was traced with 0.5"):
        pm(x, **{**SCALARS, "scale": 0.7})
    with pytest.raises(ValueError, match=r"input 'flag' is 1 but the graph was traced with True"):
        pm(x, **{**SCALARS, "flag": 1})


def test_a_plan_for_other_constants_is_a_mismatch():
    model, x = WithScalars(), torch.randn(8, 4)
    plan = parallelizer.plan(parallelizer.trace(model, (x,), SCALARS), {"dp": 2})
    other = parallelizer.trace(model, (x,), {**SCALARS, "scale": 2.0})
    with pytest.raises(PlanMismatchError, match=r"constant input scale: plan has 0.5, model has 2.0"):
        parallelizer.check_plan(plan, other)
    parallelizer.check_plan(plan, parallelizer.trace(model, (x,), SCALARS))
    parallelizer.Plan.from_json(plan.to_json())  # the constants in the fingerprint validate against the schema


class DeviceCasts(torch.nn.Module):
    """`x.to(x.device, dtype)` and friends: ops with device arguments that the cost model runs on meta tensors."""

    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(4, 4)

    def forward(self, x):
        y = self.l(x.to(x.device, torch.float64).to(x.device, torch.float32))
        return y.t().to(x.device, torch.float32).t() + torch.ones(y.shape, device=x.device)


def test_ops_with_device_arguments_are_planned_and_run():
    torch.manual_seed(0)
    model, x = DeviceCasts(), torch.randn(8, 4)
    traced = parallelizer.trace(model, (x,))
    assert any(n.op_name == "aten.to.device" for n in traced.compute_nodes())
    plan = parallelizer.plan(traced, {"dp": 2})  # was NotImplementedError: Cannot copy out of meta tensor
    assert plan.cost.compute_s > 0
    pm = parallelizer.auto_parallelize(model, (x,))
    torch.testing.assert_close(pm(x), model(x))


def test_rehearse_checks_a_plan_before_starting_ranks(monkeypatch):
    """Issue 12 item 13: `rehearse` takes the Plan that `plan()` returns and checks its fingerprint first: a plan
    traced on meta for one width, applied to a CPU model of another width, fails before any rank starts."""
    from parallelizer import zoo
    from parallelizer.runtime import rehearsal

    monkeypatch.setattr(rehearsal, "spawn", lambda *a, **k: pytest.fail("ranks were started"))
    wide = parallelizer.trace(*zoo.gpt2(device="meta", n_embd=64))
    plan = parallelizer.plan(wide, {"dp": 2})
    with pytest.raises(PlanMismatchError, match=r"parameter transformer.h.0.attn.c_attn.weight: plan has shape "
                                                r"\(64, 192\), model has \(32, 96\)"):
        rehearsal.rehearse(zoo.gpt2, {"n_embd": 32}, plan)
    with pytest.raises(TypeError, match="pass the Plan that parallelizer.plan returned"):
        rehearsal.rehearse(zoo.gpt2, {}, plan.to_json())
    assert rehearsal.checked_spec(plan, zoo.gpt2, {"n_embd": 64}).mesh == plan.mesh  # the right model passes


def test_a_call_with_other_shapes_or_keywords_is_a_typed_error_naming_it():
    """A sharded program is made for the traced shapes: another batch size must not reach the graph (a raw
    view error there), and a missing or extra keyword is named."""
    class Kw(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.l = torch.nn.Linear(4, 4)

        def forward(self, x, scale=None):
            return self.l(x) * (1.0 if scale is None else scale)

    pm = parallelizer.auto_parallelize(Kw(), (torch.randn(8, 4),), example_kwargs={"scale": torch.ones(4)})
    with pytest.raises(PlanMismatchError, match=r"input 'x' has shape \(6, 4\) but the graph was traced .*\(8, 4\)"):
        pm(torch.randn(6, 4), scale=torch.ones(4))
    with pytest.raises(TypeError, match=r"missing keyword\(s\) \['scale'\]"):
        pm(torch.randn(8, 4))
    with pytest.raises(TypeError, match=r"unexpected keyword\(s\) \['other'\]"):
        pm(torch.randn(8, 4), scale=torch.ones(4), other=1)
    pm = parallelizer.auto_parallelize(Kw(), (torch.randn(8, 4),), example_kwargs={"scale": None})
    with pytest.raises(ValueError, match=r"input 'scale' is a tensor of shape \(4,\) \(torch.float32\) but the graph "
                       r"was traced with None"):  # named by shape: a batch's repr would fill the message
        pm(torch.randn(8, 4), scale=torch.ones(4))


def test_a_floating_input_of_another_dtype_is_a_typed_error_naming_it():
    """Dtype-reading code is fixed at trace time (Llama's RMSNorm `x.to(input_dtype)`): an fp64 input to a graph
    traced with fp32 ran in fp32 while the eager model raised; integer ids of another width still run."""
    class CastBack(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.l = torch.nn.Linear(4, 4)
            self.e = torch.nn.Embedding(10, 4)

        def forward(self, x, ids):
            return self.l(x.float()).to(x.dtype) + self.e(ids)

    model = CastBack()
    x, ids = torch.randn(8, 4), torch.randint(0, 10, (8,))
    pm = parallelizer.auto_parallelize(model, (x, ids))
    with pytest.raises(PlanMismatchError, match=r"input 'x' has dtype torch.float64 but the graph was traced .*float32"):
        pm(x.double(), ids)
    torch.testing.assert_close(pm(x, ids.int()), model(x, ids.int()))


def test_a_mesh_may_be_given_as_the_cli_string():
    traced = parallelizer.trace(torch.nn.Linear(4, 4), (torch.randn(8, 4),))
    plan = parallelizer.plan(traced, "dp=2")
    assert plan.mesh.axis_names == ("dp",) and plan.mesh.shape == (2,)
    with pytest.raises(ValueError, match="NAME=SIZE"):
        parallelizer.plan(traced, "dp=two")
