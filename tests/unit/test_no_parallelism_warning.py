"""A plan that leaves a mesh axis unused (the ranks along it repeat one another's work) is warned about by
`auto_parallelize` (`NoParallelismWarning`, rank 0) with why and a remedy that applies (trial r9c).

Before, `auto_parallelize` on 2 ranks with its defaults returned an all-Replicate plan for a small MLP and said
nothing (the note existed only in `plan.summary()` / `show`); a batch of 1 was told to force
`axis_roles={'dp': 'ddp'}` (which raises ValueError for that batch), a (dp=1, tp=2) mesh was told to force ddp on
its size-1 'dp' axis, and an unused 'tp' axis of a dp x tp mesh was not noted at all.
"""
import contextlib
import io
import warnings

import pytest
import torch

import parallelizer
from parallelizer import NoParallelismWarning, zoo
from parallelizer.auto_parallel import _warn_idle_axes
from parallelizer.core import Layout
from parallelizer.core.layout import placement_str
from parallelizer.planner import plan


def _plan(tg, mesh, **options):
    with contextlib.redirect_stdout(io.StringIO()):
        return plan(tg, mesh, **options)


def _mlp(batch):
    return parallelizer.trace(*zoo.mlp(depth=1, batch=batch, dim=16, hidden=32, in_features=8, device="meta"))


def _unsharded_axes(p):
    """Axes of more than one device with every layout Replicate on them, read from the layouts directly."""
    layouts = [L for n in p.nodes.values() for L in (*n.inputs, *([n.output] if n.output else []))]
    layouts += [q.stored for q in p.params.values()]
    return [a for i, (a, n) in enumerate(zip(p.mesh.axis_names, p.mesh.shape))
            if n > 1 and all(placement_str(Layout.parse(L).placements[i]) == "R" for L in layouts)]


def _warned(p):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _warn_idle_axes(p)
    return [w for w in caught if issubclass(w.category, NoParallelismWarning)]


def test_an_all_replicate_plan_is_warned_with_the_cost_model_reason_and_the_ddp_remedy():
    p = _plan(_mlp(8), {"dp": 2})
    assert _unsharded_axes(p) == ["dp"] == p.idle_axes()
    (w,) = _warned(p)
    assert w.message.axes == ("dp",)
    text = str(w.message)
    assert "no parallelism" in text and "cost model" in text and "axis_roles={'dp': 'ddp'}" in text, text
    forced = _plan(_mlp(8), {"dp": 2}, axis_roles={"dp": "ddp"})  # the remedy works
    assert _unsharded_axes(forced) == [] and not _warned(forced)


def test_a_plan_priced_on_a_calibration_profile_is_not_told_to_calibrate():
    """Round 13 (r13d): a plan made with `--cluster profile.json` was told to use "cluster='profile.json' from
    `parallelizer calibrate`", the profile it was priced on."""
    import dataclasses
    p = _plan(_mlp(8), {"dp": 2})
    assert "parallelizer calibrate" in p.notes()[0]
    on_profile = dataclasses.replace(p, cluster={**p.cluster, "spec": "/tmp/profile.json"})
    text = on_profile.notes()[0]
    assert "parallelizer calibrate" not in text and "axis_roles={'dp': 'ddp'}" in text, text


def test_a_batch_smaller_than_the_axis_is_named_and_not_told_to_force_ddp():
    p = _plan(_mlp(1), {"dp": 2})
    assert _unsharded_axes(p) == ["dp"]
    (w,) = _warned(p)
    text = str(w.message)
    assert "the batch (1 sample(s)" in text and "a batch of at least 2 samples" in text, text
    assert "axis_roles" not in text, text
    with pytest.raises(ValueError):  # what the note used to suggest
        _plan(_mlp(1), {"dp": 2}, axis_roles={"dp": "ddp"})


def test_a_size_one_axis_is_not_the_remedy():
    p = _plan(_mlp(8), {"dp": 1, "tp": 2})
    assert _unsharded_axes(p) == ["tp"] == p.idle_axes()
    (w,) = _warned(p)
    assert "axis_roles={'tp': 'ddp'}" in str(w.message) and "{'dp': 'ddp'}" not in str(w.message), w.message


def test_one_unused_axis_of_a_two_axis_mesh_is_warned():
    p = _plan(_mlp(8), {"dp": 2, "tp": 2}, axis_roles={"dp": "ddp"})
    assert _unsharded_axes(p) == ["tp"] == p.idle_axes()
    (w,) = _warned(p)
    assert w.message.axes == ("tp",)
    assert "axis tp (2 devices) is unused" in str(w.message) and "{'dp': 4}" in str(w.message), w.message
    assert any(" is unused: " in n for n in p.notes())


def test_a_parallel_plan_and_one_device_are_not_warned():
    assert not _warned(_plan(_mlp(8), {"dp": 2}, axis_roles={"dp": "fsdp"}))
    assert not _warned(_plan(_mlp(8), {"dp": 1}))


def test_a_tp_axis_too_wide_for_the_batch_is_offered_the_tp_role():
    """Trial r14e: `--mesh pp=2,tp=2` on a small Llama searched microbatches of 1 sample and left tp unused; the
    note only said "fewer, larger microbatches" (which would split the batch over tp, i.e. data parallelism), not
    the tensor parallelism a Megatron user asked for, which `--roles tp=tp` gives with any batch."""
    p = _plan(_mlp(1), {"tp": 2})
    assert _unsharded_axes(p) == ["tp"]
    (w,) = _warned(p)
    assert "axis_roles={'tp': 'tp'} (CLI: --roles tp=tp)" in str(w.message), w.message
    forced = _plan(_mlp(1), {"tp": 2}, axis_roles={"tp": "tp"})  # the remedy works on a batch of 1
    assert _unsharded_axes(forced) == [] and not _warned(forced)


def test_an_axis_sharding_only_integer_values_is_idle():
    """Round 16 (r16e): Speech2Text's default plan on dp=2 x tp=4 replicated every op but the label shift's int64
    `new_zeros` (8, 32), laid out S(1)S(1), and `idle_axes` counted that as use, so neither the "no parallelism"
    note nor NoParallelismWarning came. The class: integer / boolean values (token ids, index arithmetic, masks)
    sharded alone divide no work. Here GPT-2 with a batch of 1 on dp=2 (all Replicate) with its int64 token ids
    laid out S(1) over dp (as the ILP may, at no cost): still idle, and warned."""
    import dataclasses
    tg = parallelizer.trace(*zoo.gpt2(n_layer=1, n_embd=16, n_head=2, vocab_size=64, batch=1, seq_len=8,
                                      device="meta"))
    p = _plan(tg, {"dp": 2})
    assert p.idle_axes() == ["dp"]
    ids = tg.input_names[0]
    assert tg.nodes[ids].outputs[0].dtype == torch.int64
    nodes = dict(p.nodes)
    nodes[ids] = dataclasses.replace(nodes[ids], output="S(1)")
    edges = tuple(dataclasses.replace(e, src_layout="S(1)") if e.src == ids else e for e in p.edges)
    assert any(e.src == ids for e in edges)
    shifted = dataclasses.replace(p, nodes=nodes, edges=edges)
    assert shifted.idle_axes() == ["dp"] and shifted.shards_nothing()
    assert "no parallelism" in shifted.notes()[0]
    assert _warned(shifted)
