"""User code that updates a parallel module's local pieces after wrapping (round 26, r26b), against the same code on
the model on one device, in ONE launch of 2 gloo ranks (Conv1d -> Linear; fsdp dp=2, tp=2, ddp dp=2; a tied
4-block GPT-2 on pp=2).

1. Optimizers (`runtime.optimizer_check`). The probe split one (4, 6) tensor along its columns, so three kinds of
   per-tensor update were called per-element and stepped the local shards of fsdp / tp plans silently: a column
   normalisation (a statistic over dim 0: Scion's ColNorm), a norm of biases only, a norm of conv weights only
   (`piece_update_workers.RULES`; 2 SGD steps: up to 0.107, 0.087 and 0.021 off one device). Now each is refused
   on every rank before it touches a shard, naming the kind; under ddp (whole tensors on every rank) they run and
   equal the model on one device, and plain SGD equals it on every plan.
2. torch.Tensor's in-place random fills (`runtime.init_check.TENSOR_FILLS`; HF's `module.weight.data.normal_`):
   torch.nn.init was refused on shards, but `p.data.normal_()` / `p.uniform_()` under no_grad drew each shard's
   numbers from the rank's generator (0.072-0.20 off one device, silently; torchtitan#3106 and OLMo-core#319 report
   the same on FSDP2). Now refused on shards (through `.data` and views too) and on a pipeline's tied copies; exact
   under ddp; a draw of any other tensor is torch's own.
3. Constant writes into PART of a shard (`weight.data[padding_idx].zero_()`, `nn.init.constant_(w[i], c)`): the
   part is chosen by local indices, another part on every rank than on one device along a sharded dim (0.274 off,
   silently). Now refused there; exact (and run) where the part keeps every sharded dim whole or is the whole shard.
4. (round 27, r27g) The other writes of a positional part (`runtime.part_writes`): index assignment
   (`w.data[1] = 0`, `w[1] = c` under no_grad, `w.data[:2] *= 0.5`), `copy_` into a part, `index_fill_`, `scatter_`,
   `fill_diagonal_`, and a diagonal view's `fill_` on fsdp (0.07-1.1 off one device, silently). Refused and run by the same rule as 3.
5. (round 27, r27f, merged onto 4's rule by r27fg) Positional writes (`w.data[padding_idx] = 0`, index_fill_, a
   broadcast masked_fill_, a diagonal, rows of a gradient) and norms of a piece over a sharded dim (`p.div_(p.norm())`,
   `p.grad.norm()`, timm's adaptive gradient clipping, a row normalisation over tp's sharded columns;
   `runtime.piece_norms`), which gave other numbers than one device silently, are refused on the plans that shard
   the dim; where they keep every sharded dim whole, and under ddp, they run and equal one device.
"""
import contextlib
import io

import pytest
import torch

import parallelizer
from parallelizer.rewriter.spec import spec_from_plan
from parallelizer.runtime import spawn
from launch_once import run_each
from piece_update_workers import (FILLS, GRADS, NORMS, PART_WRITES, POSITIONAL, WRITES, conv_head, per_dim_steps,
                                  piece_access, pipeline_fills, random_fills)

pytestmark = pytest.mark.distributed
PLANS = {"fsdp2": ({"dp": 2}, {"dp": "fsdp"}), "tp2": ({"tp": 2}, {"tp": "tp"}), "ddp2": ({"dp": 2}, {"dp": "ddp"})}


@pytest.fixture(scope="module")
def results():
    model, inputs = conv_head()
    traced = parallelizer.trace(model, inputs)
    with contextlib.redirect_stdout(io.StringIO()):  # the solver library prints a banner
        specs = {name: spec_from_plan(parallelizer.plan(traced, mesh, axis_roles=roles))
                 for name, (mesh, roles) in PLANS.items()}
    return spawn(run_each, 2, [(per_dim_steps, (specs,)), (random_fills, (specs,)), (pipeline_fills, ()),
                               (piece_access, (specs,))], timeout_s=600)


def _same_state(r: dict, key) -> None:
    for fqn, want in r["reference"].items():
        torch.testing.assert_close(r["state"][fqn], want, msg=lambda m, f=fqn: f"{key} {f}: {m}")


def test_per_tensor_updates_are_refused_on_shards_and_equal_one_device_on_whole_tensors(results):
    """Before (main 5abdc2f): fsdp / tp stepped the shards (tests/unit/test_optimizer_check.py checks the kinds)."""
    for rank, (steps, *_) in enumerate(results):
        for (plan, rule), r in steps.items():
            if plan == "ddp2" or rule == "plain":
                assert r["error"] is None, (rank, plan, rule, r["error"])
                _same_state(r, (rank, plan, rule))
            else:
                assert r["error"] is not None and r["error"][0] == "per-tensor" and r["unchanged"], (rank, plan, rule, r["error"])


def test_random_fills_of_shards_are_refused_and_equal_one_device_on_whole_tensors(results):
    for rank, (_, fills, *_) in enumerate(results):
        for plan in PLANS:
            for fill in FILLS:
                r = fills[(plan, fill)]
                if plan == "ddp2":
                    assert r["error"] == "no error", (rank, fill, r["error"])
                    _same_state(r, (rank, plan, fill))
                else:
                    assert r["error"].startswith("UnsupportedOpError: Tensor.") and "a local shard" in r["error"] \
                        and "pm.apply(init_fn)" in r["error"], (rank, plan, fill, r["error"])
        torch.testing.assert_close(fills["noise"], fills["noise_reference"], rtol=0, atol=0)


def test_a_constant_written_into_part_of_a_shard_is_refused_where_the_part_is_chosen_along_a_sharded_dim(results):
    """`head.weight.data[1].zero_()` (a row: dim 0) is refused on fsdp (dim 0 sharded) and exact on tp=2 (the
    head is S(1): every shard holds the whole row's columns it owns); `nn.init.constant_(conv.weight[1], 0.5)` is
    refused on both (conv.weight S(0)); a write of every parameter whole is exact everywhere. Before (main
    5abdc2f), every one ran: the padding row 0.274 off one device on fsdp / tp (MLP probe), silently."""
    for rank, (_, fills, *_) in enumerate(results):
        for write, (_, refused_on) in WRITES.items():
            for plan in PLANS:
                r = fills[(plan, write)]
                if plan in refused_on:
                    assert r["error"].startswith("UnsupportedOpError: Tensor.") and "on part of" in r["error"], \
                        (rank, plan, write, r["error"])
                else:
                    assert r["error"] == "no error", (rank, plan, write, r["error"])
                    _same_state(r, (rank, plan, write))


def test_index_assignment_copies_and_indexed_writes_into_part_of_a_shard_are_refused_along_a_sharded_dim(results):
    """Round 27 (r27g), `runtime.part_writes`: `head.weight.data[1] = 0` (a row) refused on fsdp, exact on tp=2
    (head S(1)); `head.weight.data[:, 1] = 0` (a column) the other way round; `conv.weight[1] = 0.5` under no_grad,
    `w.data[:2] *= 0.5`, `w.data[:2].copy_(c)` refused on both (conv.weight S(0)); `index_fill_` of a head row and
    `scatter_` into the head's bias refused on fsdp only (both whole on tp=2); `fill_diagonal_` and
    `w.data.diagonal().fill_(1)` (every local row, the local diagonal) refused on both; a mask made from the values
    (`w[w < 0] = 0`) and `p.data[:] = c` exact everywhere, and every write exact under ddp. Before (main 45468d0)
    every one ran: 0.07-1.1 off one device after the write on fsdp / tp (2-rank probe), silently."""
    for rank, (_, fills, *_) in enumerate(results):
        for write, (_, refused_on) in PART_WRITES.items():
            for plan in PLANS:
                r = fills[(plan, write)]
                if plan in refused_on:
                    assert r["error"].startswith("UnsupportedOpError: Tensor.") and "on part of" in r["error"] \
                        and "a local shard" in r["error"], (rank, plan, write, r["error"])
                else:
                    assert r["error"] == "no error", (rank, plan, write, r["error"])
                    _same_state(r, (rank, plan, write))


def test_a_random_fill_of_a_pipelines_tied_copy_is_refused(results):
    """The tied wte / lm_head copy on both stages: each copy would draw its own values (nn.init was refused there
    already); a parameter held once fills as on one device (no error)."""
    for rank, (_, _, fills, _) in enumerate(results):
        assert fills["copied"] == ["transformer.wte.weight"], fills["copied"]
        for fqn, error in fills.items():
            if fqn == "transformer.wte.weight":
                assert error.startswith("UnsupportedOpError: Tensor.normal_ on 'transformer.wte.weight', one of the copies"), error
            elif fqn != "copied":
                assert error == "no error", (rank, fqn, error)


def _refused_or_equal(results, table: dict, error_start: str) -> None:
    for rank, (*_, access) in enumerate(results):
        for key, (_, refused_on) in table.items():
            for plan in PLANS:
                r = access[(plan, key)]
                if plan in refused_on:
                    assert r["error"].startswith(error_start) and "a local shard" in r["error"] \
                        and "pm.full_model()" in r["error"], (rank, plan, key, r["error"])
                else:
                    assert r["error"] == "no error", (rank, plan, key, r["error"])
                    if "state" in r:
                        _same_state(r, (rank, plan, key))


def test_positional_writes_into_part_of_a_shard_are_refused_where_chosen_along_a_sharded_dim(results):
    """Before (main 45468d0) every one ran: the padding row (`w.data[1] = 0`), a column on tp, a conv filter,
    index_fill_ and a broadcast masked_fill_ silently gave other numbers than one device; `diagonal().zero_()` on
    fsdp passed r26b's check (its index set along dim 0 was whole). Writes by value (`w[w.abs() < eps] = 0`) and of
    the whole piece run and equal one device on every plan."""
    _refused_or_equal(results, POSITIONAL, "UnsupportedOpError: ")


def test_norms_of_a_piece_over_a_sharded_dim_are_refused_and_exact_elsewhere(results):
    """`p.div_(p.norm())`, `torch.linalg.matrix_norm`, F.normalize over tp's sharded columns, `renorm_` over a
    sharded dim (r27fg): before (main 45468d0) each ran on the piece, silently; per-row norms of fsdp's row shards
    and renorm_ over the dims a plan keeps whole run and equal one device."""
    _refused_or_equal(results, NORMS, "UnsupportedOpError: torch.")


def test_gradient_statistics_and_positional_gradient_writes_are_refused_on_shards(results):
    """`p.grad.norm()` for logging, timm's adaptive gradient clipping, `grad[:2] = 0` (frozen rows): refused on
    fsdp / tp, where they read or wrote this rank's piece; under ddp they equal one device (values and gradients).
    The remedy the error names, `torch.nn.utils.get_total_norm([p.grad])`, gives one device's `p.grad.norm()` on
    every plan."""
    _refused_or_equal(results, GRADS, "UnsupportedOpError: ")
    for rank, (*_, access) in enumerate(results):
        for plan in PLANS:
            for key in GRADS:
                r = access[(plan, key)]
                if r["error"] == "no error":
                    for fqn, want in r["reference"].items():
                        torch.testing.assert_close(r["grads"][fqn], want, msg=lambda m, f=fqn: f"{plan} {key} {f}: {m}")
                    if r["values"].get("pm") is not None:
                        torch.testing.assert_close(r["values"]["pm"], r["values"]["reference"])
            totals, want = access[(plan, "total_norms")]
            torch.testing.assert_close(totals, want, msg=lambda m: f"{rank} {plan}: {m}")
