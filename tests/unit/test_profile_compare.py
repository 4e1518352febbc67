"""`cost_model.profile_compare.compare_profiles` covers every priced field of a calibration profile (round 22, r22g):
each field of Profile, DeviceSpec, PipelineActionCost and Link is changed in turn, found by iterating the dataclass
fields, and the comparison must show it, unless the module names it as unpriced. A field added later without a
comparison fails here (or raises TypeError in compare_profiles)."""
import dataclasses
import math

import pytest
import torch

from cost_model.calibrate import Profile, compare_profiles
from cost_model.hardware import DeviceSpec, PipelineActionCost
from cost_model.profile_compare import DEVICE_NOT_COMPARED, LINK_NOT_COMPARED, PROFILE_NOT_COMPARED
from cost_model.topology import Link

_ACTION = PipelineActionCost(*(1e-4 * (i + 1) for i in range(len(PipelineActionCost.seconds_fields()))))
DEVICE = DeviceSpec("cpu", {torch.float32: 1e11, torch.bfloat16: 2e11}, 10**10, 1e10, 0.9, 0.8, 2e-6, kind="cpu",
                    optimizer_bytes_per_s=4e9, optimizer_tensor_s=40e-6, comm_overlap=0.5, collective_sync_s=1e-3,
                    pipeline_action=dataclasses.replace(_ACTION, own_runner=_ACTION), op_host_s=7e-6,
                    op_host_bwd_s=8e-6)
# all_reduce size-fitted, all_gather by its per-kind alpha/beta, broadcast by the joint alpha/beta: every Link field
# prices something
LINK = Link("gloo_x4", 1e-4, 1e9, per_kind={"all_gather": (2e-4, 0.5e9)},
            size_fits={"all_reduce": ((1 << 20, 1e-4, 1e9), (1 << 26, 2e-4, 0.8e9))})
PROFILE = Profile(DEVICE, {4: LINK}, contention={4: (2.0, 1.5, 3.0)}, comm_overlap={4: 0.25}, cpu_count=2,
                  collective_sync={4: 2e-3}, collective_cpu={4: {"all_reduce": (1e-4, 1e-9)}})


def _perturbed(value):
    """`value` with every number in it 1.5x (a fraction 0.9x, staying in range), recursing into mappings, tuples and
    dataclasses; None for a type it cannot change (the test then fails naming the field)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return value * 0.9 if 0 < value <= 1 and not isinstance(value, int) else value * 1.5
    if isinstance(value, tuple):
        return tuple(_perturbed(v) for v in value)
    if isinstance(value, dict) or hasattr(value, "items"):
        return {k: _perturbed(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value):
        changed = {f.name: _perturbed(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return dataclasses.replace(value, **{k: v for k, v in changed.items() if v is not None})
    return None


def _fields(cls, skip):
    return [f.name for f in dataclasses.fields(cls) if f.name not in skip]


@pytest.mark.parametrize("name", _fields(Profile, {"device", "links", *PROFILE_NOT_COMPARED}))
def test_every_profile_field_shows_in_the_comparison(name):
    changed = dataclasses.replace(PROFILE, **{name: _perturbed(getattr(PROFILE, name))})
    assert compare_profiles(PROFILE, changed) != compare_profiles(PROFILE, PROFILE), name


@pytest.mark.parametrize("name", _fields(DeviceSpec, DEVICE_NOT_COMPARED))
def test_every_device_field_shows_in_the_comparison(name):
    device = dataclasses.replace(DEVICE, **{name: _perturbed(getattr(DEVICE, name))})
    changed = dataclasses.replace(PROFILE, device=device)
    diffs = compare_profiles(PROFILE, changed)
    assert any(v != 0 for v in diffs.values()), name


@pytest.mark.parametrize("name", [*PipelineActionCost.seconds_fields(), "own_runner"])
def test_every_pipeline_action_field_shows_in_the_comparison(name):
    action = DEVICE.pipeline_action
    changed = dataclasses.replace(PROFILE, device=dataclasses.replace(
        DEVICE, pipeline_action=dataclasses.replace(action, **{name: _perturbed(getattr(action, name))})))
    assert any(v != 0 for v in compare_profiles(PROFILE, changed).values()), name


@pytest.mark.parametrize("name", _fields(Link, LINK_NOT_COMPARED))
def test_every_link_field_shows_in_the_comparison(name):
    link = dataclasses.replace(LINK, **{name: _perturbed(getattr(LINK, name))})
    changed = dataclasses.replace(PROFILE, links={4: link})
    assert any(v != 0 for v in compare_profiles(PROFILE, changed).values()), name


def test_unpriced_names_are_fields_and_the_host_cost_is_compared_in_closed_form():
    for cls, skip in ((DeviceSpec, DEVICE_NOT_COMPARED), (Profile, PROFILE_NOT_COMPARED), (Link, LINK_NOT_COMPARED)):
        assert set(skip) <= {f.name for f in dataclasses.fields(cls)}, cls  # no stale names
    later = dataclasses.replace(PROFILE, device=dataclasses.replace(DEVICE, op_host_s=15.6e-6, op_host_bwd_s=8e-6))
    diffs = compare_profiles(PROFILE, later)
    assert diffs["op_host_s"] == pytest.approx(15.6 / 7 - 1) and diffs["op_host_bwd_s"] == 0
    assert all(v == 0 for v in compare_profiles(PROFILE, PROFILE).values())
    # a quantity one profile lacks is infinitely different, one both lack is not listed (it is not a match)
    gone = dataclasses.replace(PROFILE, device=dataclasses.replace(DEVICE, op_host_s=0.0))
    assert compare_profiles(gone, PROFILE)["op_host_s"] == math.inf
    assert "op_host_s" not in compare_profiles(gone, gone)


def test_a_field_of_unknown_type_raises_instead_of_being_left_out():
    @dataclasses.dataclass(frozen=True)
    class Grown(Profile.__mro__[0]):  # a Profile with one more field, as a later round might add
        new_quantity: float = 1.0
    grown = Grown(DEVICE, {4: LINK})
    with pytest.raises(TypeError, match="new_quantity"):
        compare_profiles(grown, grown)


def test_plans_predicted_step_times_compared_in_closed_form():
    """Round 23 (r23c): what two calibrations mean for a user is how far the same plans' predicted steps move:
    per plan b / a - 1, their median |difference|, the worst plan and the count within 10%."""
    from cost_model.profile_compare import compare_step_predictions
    a = {"ddp": 0.100, "fsdp": 0.200, "tp": 0.050}
    b = {"ddp": 0.105, "fsdp": 0.150, "tp": 0.050}
    got = compare_step_predictions(a, b)
    assert got.differences == pytest.approx({"ddp": 0.05, "fsdp": -0.25, "tp": 0.0})
    assert got.median_abs == pytest.approx(0.05)
    assert got.worst == "fsdp" and got.within_10 == 2
    assert "3 plans" in got.line() and "fsdp -25.0%" in got.line()


@pytest.mark.parametrize("a, b, words", [
    ({"ddp": 0.1}, {"fsdp": 0.1}, "only under A: ['ddp'], only under B: ['fsdp']"),
    ({}, {}, "need the same >= 1 plans"),
    ({"ddp": 0.1}, {"ddp": 0.0}, "plan 'ddp' has step seconds 0.0 under profile B"),
    ({"ddp": math.nan}, {"ddp": 0.1}, "plan 'ddp' has step seconds nan under profile A"),
])
def test_plans_compared_must_be_the_same_with_positive_times(a, b, words):
    from cost_model.profile_compare import compare_step_predictions
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("]", r"\]")):
        compare_step_predictions(a, b)
