"""Tracer, continued: the graph normalisations (`tracer/normalize.py`: no-grad regions, in-place writes of fresh
values and their out-of-place overloads, out= variants, as_strided), what `tracer/watch.py` notes (numpy
draws), repeated-group names, and user inputs named like Python builtins."""
import inspect

import pytest
import torch

import parallelizer
from parallelizer import TraceError
from parallelizer.runtime.rehearsal import random_ops
from parallelizer.tracer.normalize import ALIASES


class _EmaBlock(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.register_buffer("ema", torch.zeros(8))

    def forward(self, x):
        with torch.no_grad():
            self.ema.mul_(0.9).add_(0.1 * x.mean(0))
        return x + torch.tanh(self.fc(x))


def test_no_grad_region_input_detach_belongs_to_the_block_that_opened_the_region():
    """The detach the tracer puts on a no-grad region's input (so that a buffer written from it carries no
    history) is recorded in the block that opened the region: the 4 blocks stay alike and form one group (when
    it took the producer's module, the previous block got an extra node and the last block fell out)."""
    model = torch.nn.Sequential(*[_EmaBlock() for _ in range(4)])
    traced = parallelizer.trace(model, (torch.randn(4, 8),))
    assert [b.members for b in traced.blocks] == [("0", "1", "2", "3")]


class _AuxLossInPlace(torch.nn.Module):
    """transformers' MoE causal LMs: `loss += coef * aux_loss` on the cross-entropy (and a ReLU(inplace=True)
    on a fresh activation)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb, self.router, self.head = torch.nn.Embedding(32, 16), torch.nn.Linear(16, 4), torch.nn.Linear(16, 32)

    def forward(self, ids, labels):
        h = torch.nn.functional.relu(self.emb(ids) * 2.0, inplace=True)
        loss = torch.nn.functional.cross_entropy(self.head(h).flatten(0, 1), labels.flatten())
        aux = self.router(h).softmax(-1).mean((0, 1)).pow(2).sum()
        loss += 0.1 * aux
        return loss


def test_in_place_write_of_a_fresh_activation_is_written_out_of_place_and_plans_under_ddp():
    """`loss += aux` wrote the cross-entropy (a Partial over a sharded batch) in place; the planner never
    redistributes a value written in place, so {"dp": 2} with role ddp raised InfeasiblePlanError on
    cross_entropy_loss (Mixtral and Qwen2-MoE with output_router_logits=True). The tracer now writes such ops
    out of place (same values on one device); a buffer's in-place EMA stays in place."""
    torch.manual_seed(0)
    model = _AuxLossInPlace()
    g = torch.Generator().manual_seed(1)
    inputs = (torch.randint(0, 32, (4, 8), generator=g), torch.randint(0, 32, (4, 8), generator=g))
    traced = parallelizer.trace(model, inputs)
    ops = [t.op_name for t in traced.nodes.values()]
    assert "aten.add_.Tensor" not in ops and "aten.relu_.default" not in ops, ops
    assert any("out of place" in n for n in traced.notes), traced.notes
    # the traced program (out-of-place relu/add, export's ops) against the module: two op graphs, so torch.testing's
    # float32 tolerance, not bitwise; dropping the aux term (0.1 * aux, about 0.03 here) would be far outside it
    torch.testing.assert_close(traced.exported.module()(*inputs), model(*inputs))
    plan = parallelizer.plan(traced, {"dp": 2}, axis_roles={"dp": "ddp"})
    assert plan.mesh.world_size == 2
    ema = parallelizer.trace(torch.nn.Sequential(_EmaBlock()), (torch.randn(4, 8),))
    assert ema.mutated_buffers() == {"0.ema": "mul_"}


class _NumpyMask(torch.nn.Module):
    """SpecAugment-style: a mask drawn with numpy inside forward (Wav2Vec2's _compute_mask_indices)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.embed = torch.nn.Parameter(torch.zeros(8))

    def forward(self, x):
        import numpy as np

        h = self.a(x)
        h[torch.tensor(np.random.rand(*h.shape[:2]) < 0.5)] = self.embed
        return h


def test_randomness_drawn_with_numpy_in_forward_is_noted_and_warned():
    """export runs forward once and lifts what numpy drew as a constant: the traced program repeats that mask
    at every step while eager draws a new one per call (Wav2Vec2 with its default mask_time_prob: rehearse
    found outputs 4.5 apart, nothing said why). The tracer now notes and warns; a torch-only model does not."""
    model, x = _NumpyMask(), torch.randn(4, 6, 8)
    with pytest.warns(UserWarning, match="numpy's or Python's generator"):  # in training mode: an opt-in (r20h)
        traced = parallelizer.trace(model, (x,), allow_frozen_host_random=True)
    assert any("froze the values" in n for n in traced.notes)
    # the note names the draw and its line; the rehearsal's list of random sources carries it
    line = inspect.getsourcelines(_NumpyMask.forward)[1] + 4
    assert any(f"numpy.random.rand in forward at {__file__}:{line}" in n for n in traced.notes), traced.notes
    assert f"FROZEN at trace time (numpy.random.rand in forward at {__file__}:{line}" in random_ops(traced)
    program = traced.exported.module()
    assert torch.equal(program(x), program(x)) and not torch.equal(model(x), model(x))  # the frozen mask
    quiet = parallelizer.trace(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.1)), (x,))
    assert not any("froze the values" in n for n in quiet.notes)


class _SpectralNormed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.utils.spectral_norm(torch.nn.Linear(6, 6))

    def forward(self, x):
        return self.lin(x)


def test_out_variants_become_functional_op_plus_copy_into_the_out_tensor():
    """`nn.utils.spectral_norm` writes its u / v buffers with `F.normalize(..., out=u)` (aten.div.out under
    no_grad). The traced graph has no `out=` op left: div.Tensor, then copy_ into the buffer itself (not a
    detached alias), so planning works (before: a bare IndexError in strategy enumeration) and the program
    updates the buffers as eager does."""
    torch.manual_seed(0)
    tg = parallelizer.trace(_SpectralNormed(), (torch.randn(3, 6),))
    ops = [n for n in tg.graph_module.graph.nodes if n.op == "call_function"]
    assert not [n for n in ops if any(a.kwarg_only and a.alias_info is not None and a.alias_info.is_write
                                      for a in getattr(getattr(n.target, "_schema", None), "arguments", ()))]
    copies = [n for n in ops if n.target is torch.ops.aten.copy_.default]
    assert sorted(c.args[0].name for c in copies) == ["b_lin_weight_u", "b_lin_weight_v"]
    assert any("out=" in note for note in tg.notes)
    plan = parallelizer.plan(tg, {"tp": 2}, axis_roles={"tp": "tp"})
    assert plan.mesh.world_size == 2  # the run on ranks: tests/distributed/test_trial_findings.py


def test_repeated_groups_whose_names_fold_alike_get_distinct_names_and_the_plan_json_round_trips():
    """A cross-attention with root-level q, k, v, o: q/o run on x and k/v on the longer y, so they form two
    groups whose common name is "*" for both. Block names are unique now ("*" and "{k,v}"), and the plan's JSON
    reads back to the same plan; before, decoding raised PlanValidationError ("['*', 0] names no block member,
    or one placed twice"), so `auto_parallelize` failed on every mesh while broadcasting its plan."""
    class Cross(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v, self.o = (torch.nn.Linear(8, 8) for _ in range(4))

        def forward(self, x, y):
            a = (self.q(x) @ self.k(y).transpose(1, 2)).softmax(-1) @ self.v(y)
            return self.o(a)

    torch.manual_seed(0)
    tg = parallelizer.trace(Cross(), (torch.randn(2, 3, 8), torch.randn(2, 5, 8)))
    names = [b.name for b in tg.blocks]
    assert len(names) == 2 and len(set(names)) == 2, names
    plan = parallelizer.plan(tg, {"tp": 2}, axis_roles={"tp": "tp"})
    assert parallelizer.Plan.from_json(plan.to_json()).to_json() == plan.to_json()


def test_as_strided_reading_memory_outside_its_input_is_a_trace_error():
    """`h[:, 1:].as_strided(..., storage_offset=0)` reads elements of h (its row 0) that are not in the slice (the
    memory around it): the sharded program holds the slice's values only, so this is refused with a
    TraceError naming the op and a remedy (before: torch's setStorage RuntimeError on every rank). Reading
    within the input's own elements is rewritten to a layout-free form (test_trial_findings)."""
    class OffsetStrided(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.a(x)[:, 1:].as_strided((2, 2, 4), (24, 8, 1), 0)  # reads row 0, not in the slice

    with pytest.raises(TraceError, match="as_strided") as info:
        parallelizer.trace(OffsetStrided(), (torch.randn(2, 6, 4),))
    assert info.value.remedy and "contiguous" in info.value.remedy


def test_inputs_named_like_python_builtins_keep_their_names_in_rank_programs_and_pipeline_stages():
    """nn.Sequential (and nn.Linear, and any forward(self, input)) names its input `input`; export keeps that
    name, but fx renames a placeholder that shadows a builtin when it builds a graph anew (`input` ->
    `input_1`), so each rank's program and each pipeline stage failed to find its input in the trace
    (UnknownNodeError on every mesh; a plain nn.Sequential could not run). The tracer renames such inputs once;
    a call by keyword still uses the forward's own argument name."""
    from parallelizer.rewriter.apply import rewrite
    from parallelizer.rewriter.spec import spec_from_plan
    from parallelizer.rewriter.verify import verify
    from parallelizer.runtime.pipeline import cut_stages, stage_graph

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, input, type=None):  # noqa: A002 - the builtin names under test
            return input + torch.tanh(self.lin(input))

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), *[Block() for _ in range(4)])
    traced = parallelizer.trace(model, (torch.randn(4, 8),))
    assert traced.input_names == ("input_1",) and any("input -> input_1" in n for n in traced.notes)
    by_keyword = parallelizer.trace(model, (), {"input": torch.randn(4, 8)})
    assert by_keyword.input_names == ("input_1",)
    assert by_keyword.tensor_inputs((), {"input": torch.ones(4, 8)})[0].sum() == 32
    for mesh, role in (({"tp": 2}, "tp"), ({"dp": 2}, "fsdp")):
        spec = spec_from_plan(parallelizer.plan(traced, mesh, axis_roles={next(iter(mesh)): role}))
        for rank in range(2):
            program = rewrite(traced, spec, rank)
            verify(program, traced, spec)
            assert program.input_names == ("input_1",)
    cut = cut_stages(traced, 2)
    assert [stage_graph(traced, cut, k).input_names[:1] for k in range(2)][0] == ("input_1",)


class _InPlaceRandomFills(torch.nn.Module):
    """Noise and masks drawn in place into fresh tensors: `empty_like(h).normal_()`, `.bernoulli_(p)`,
    `.exponential_()` (Gumbel noise), `h ** e` written with `pow_`."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 8)

    def forward(self, x):
        h = self.a(x)
        noise = torch.empty_like(h).normal_(0.0, 0.1)
        keep = torch.empty_like(h).bernoulli_(0.5)
        gumbel = -torch.empty_like(h).exponential_().log()
        return ((h + noise) * keep + gumbel).pow_(torch.full_like(h, 2.0)).sum()


def test_in_place_ops_whose_out_of_place_form_has_another_overload_name_are_written_out_of_place():
    """`normal_` has no `aten.normal.default` (its out-of-place form is `normal_functional`), `bernoulli_.float`
    pairs with `bernoulli.p` and `pow_.Tensor` with `pow.Tensor_Tensor`: looked up by overload name only, they
    stayed in place, and a value written in place is never redistributed, so noise drawn into
    `empty_like(h)` of a batch-sharded h was unplannable under ddp (InfeasiblePlanError). Matched by argument
    names and types now; the same seed draws the same values as the model."""
    model = _InPlaceRandomFills()
    x = torch.randn(4, 8)
    traced = parallelizer.trace(model, (x,))
    ops = {t.op_name for t in traced.nodes.values()}
    assert {"aten.normal_functional.default", "aten.bernoulli.p", "aten.pow.Tensor_Tensor"} <= ops, ops
    assert not {"aten.normal_.default", "aten.bernoulli_.float", "aten.pow_.Tensor"} & ops, ops
    torch.manual_seed(3)
    traced_value = traced.exported.module()(x)
    torch.manual_seed(3)
    torch.testing.assert_close(traced_value, model(x))
    for role in ("ddp", "fsdp"):
        assert parallelizer.plan(traced, {"dp": 2}, axis_roles={"dp": role}).mesh.world_size == 2


class _PooledInPlaceDropout(torch.nn.Module):
    """MobileNetV2's head: conv -> global pooling -> flatten (a view) -> Dropout(inplace=True) -> Linear."""

    def __init__(self):
        super().__init__()
        self.conv, self.drop, self.head = torch.nn.Conv2d(3, 8, 3), torch.nn.Dropout(0.2, inplace=True), \
            torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.head(self.drop(torch.nn.functional.adaptive_avg_pool2d(self.conv(x), 1).flatten(1)))


def test_an_in_place_op_on_a_view_only_it_reads_is_written_out_of_place():
    """`dropout_` on `pooled.flatten(1)`: the view is the pooled value's only reader, so the write is rewritten
    as `dropout` (which has a rule). Before, dropout_ kept no rule (run replicated, a fallback) and its written
    view could not be redistributed, so forced data parallelism was infeasible (MobileNetV2 under ddp)."""
    import contextlib
    import io

    traced = parallelizer.trace(_PooledInPlaceDropout(), (torch.randn(4, 3, 6, 6),))
    targets = [str(n.target) for n in traced.graph_module.graph.nodes]
    assert "aten.dropout.default" in targets and "aten.dropout_.default" not in targets, targets
    with contextlib.redirect_stdout(io.StringIO()):
        plan = parallelizer.plan(traced, {"dp": 2}, axis_roles={"dp": "ddp"})
    assert not plan.fallbacks


class _CacheLike(torch.nn.Module):
    """What a key/value cache adds to a forward (an empty constant cat'ed with k, a scratch buffer filled in
    place and never read), next to a buffer write and a random draw whose results reach no output."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.register_buffer("count", torch.zeros(()))

    def forward(self, x):
        k = torch.cat([torch.tensor([]), self.fc(x)], dim=-2)  # a fresh cache layer's first update
        scratch = torch.zeros(4, 8)
        scratch[:, :4].copy_(k[:, :4])  # written, never read: dead
        self.count.add_(1)  # a buffer write: kept
        torch.rand(3)  # drawn, unused: kept (removing it would shift later draws)
        return k.relu()


def test_empty_cat_operands_and_dead_writes_are_removed_buffer_writes_and_draws_kept():
    """Normalisation 8: cat([empty, k]) is k, the unread scratch buffer and its write are gone, the lifted empty
    constant leaves the program's signature; the buffer write and the random draw stay; values unchanged."""
    model, x = _CacheLike(), torch.randn(4, 8)
    traced = parallelizer.trace(model, (x,))
    targets = [n.target for n in traced.graph_module.graph.nodes if n.op == "call_function"]
    aten = torch.ops.aten
    assert aten.cat.default not in targets and aten.zeros.default not in targets and aten.copy_.default not in targets
    assert aten.add_.Tensor in targets and aten.rand.default in targets
    assert not traced.exported.constants and not [p for p in traced.parameters.values() if p.is_constant]
    torch.testing.assert_close(traced.exported.module()(x), torch.relu(model.fc(x)))


class _Twins(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(6, 6), torch.nn.Linear(12, 4)

    def forward(self, x):
        h = self.a(x)
        g = h.reshape(x.shape[0], 3, 2).reshape_as(h)
        return self.b(torch.concat([g, torch.concatenate([h], 1)], 1))


def test_concat_and_reshape_as_become_cat_and_reshape_and_plan_data_parallel():
    """`torch.concat` / `torch.concatenate` (aliases of cat) and `reshape_as` had no rule: GOT-OCR2, LeViT and
    ZoeDepth ran them replicated and under ddp gathered the batch (round 9). They are written as the ops with
    rules; the graph computes the model's values and the ddp plan has no fallback."""
    torch.manual_seed(0)
    model, x = _Twins(), torch.randn(4, 6)
    tg = parallelizer.trace(model, (x,))
    ops = [n.target for n in tg.graph_module.graph.nodes if n.op == "call_function"]
    aten = torch.ops.aten
    assert ops.count(aten.cat.default) == 2 and ops.count(aten.reshape.default) == 2, ops
    assert not {aten.concat.default, aten.concatenate.default, aten.reshape_as.default} & set(ops)
    torch.testing.assert_close(tg.graph_module(*model.parameters(), x)[0], model(x))
    assert not parallelizer.plan(tg, {"dp": 2}, axis_roles={"dp": "ddp"}).fallbacks


class _ShapeAndDtypeReaders(torch.nn.Module):
    """PegasusX's sinusoidal positions (`arange(...).type_as(inputs_embeds)`) and a `view_as`: both read only the
    shape or dtype of a batch-sharded operand."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(6, 6), torch.nn.Linear(6, 4)

    def forward(self, x):
        h = self.a(x)                                                     # (B, 6)
        freq = torch.exp(torch.arange(6).type_as(h) * -0.5)               # (6,), dtype of h
        g = (h * freq).reshape(x.shape[0], 3, 2).view_as(h)               # (B, 6)
        return self.b(g)


def test_type_as_and_view_as_read_no_values_so_ddp_keeps_the_batch_sharded():
    """Round 10a: under ddp PegasusX all-gathered its batch-sharded embeddings for `type_as` (whose rule took the
    operand whose dtype it reads as an elementwise input), and `view_as` had no rule (replicated, the batch
    gathered). Now written as to(dtype) / reshape: same values, no fallback, no gather over dp."""
    torch.manual_seed(0)
    model, x = _ShapeAndDtypeReaders(), torch.randn(4, 6)
    tg = parallelizer.trace(model, (x,))
    aten = torch.ops.aten
    ops = [n.target for n in tg.graph_module.graph.nodes if n.op == "call_function"]
    assert not {aten.type_as.default, aten.view_as.default} & set(ops) and aten.to.dtype in ops, ops
    torch.testing.assert_close(tg.graph_module(*model.parameters(), x)[0], model(x))
    plan = parallelizer.plan(tg, {"dp": 2}, axis_roles={"dp": "ddp"})
    assert not plan.fallbacks and not plan.notes(), plan.notes()


class _Aliases(torch.nn.Module):
    """torch's aliases that torch.export keeps under their own names (LayoutLMv3 clips its relative positions with
    `torch.clip`)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(6, 6), torch.nn.Linear(6, 4)

    def forward(self, x):
        h = self.a(x)                                                                   # (B, 6)
        g = torch.clip(h, -1.0, 1.0) + torch.multiply(h, 2.0) - torch.divide(h, torch.absolute(h) + 1)
        g = torch.subtract(g, torch.negative(torch.arctan(h))) * torch.special.expit(h)
        g = g + torch.greater(h, 0).float() + torch.fix(h * 3) + torch.true_divide(h, 2)
        g = torch.swapaxes(g.unsqueeze(2), 1, 2).squeeze(1) + torch.moveaxis(h.unsqueeze(0), 0, 1).squeeze(1)
        g.clip_(-5.0, 5.0)
        return self.b(g)


def test_aliases_become_the_ops_they_alias_and_ddp_plans_without_fallbacks():
    """Round 10a: 13 of torch's aliases kept by export had no rule (LayoutLMv3's `aten.clip` ran replicated and,
    under ddp, gathered the batch). They become the aliased ops: same values as the model, no fallback, no gather."""
    torch.manual_seed(0)
    model, x = _Aliases(), torch.randn(4, 6)
    tg = parallelizer.trace(model, (x,))
    names = {str(n.target.overloadpacket).replace("aten.", "") for n in tg.graph_module.graph.nodes
             if n.op == "call_function" and hasattr(n.target, "overloadpacket")}
    assert not names & {*ALIASES, *(a + "_" for a in ALIASES)}, names
    torch.testing.assert_close(tg.graph_module(*model.parameters(), x)[0], model(x))
    plan = parallelizer.plan(tg, {"dp": 2}, axis_roles={"dp": "ddp"})
    assert not plan.fallbacks and not plan.notes(), plan.notes()


class _AutocastOn(torch.nn.Module):
    """A Linear inside `torch.autocast(device_type)`, traced with CPU tensors."""

    def __init__(self, device_type: str) -> None:
        super().__init__()
        self.lin, self.device_type = torch.nn.Linear(4, 4), device_type

    def forward(self, x):
        with torch.autocast(self.device_type, dtype=torch.bfloat16):
            return self.lin(x).float().sum()


def test_an_autocast_region_that_cannot_be_traced_names_a_checked_cause():
    """Round 16 (r16e): the TraceError of an autocast region whose op could not run on fake tensors of its device
    type said "trace on a machine with <type> devices" without checking (fake CUDA tensors are made on a machine
    without CUDA), and an op the region's device type met on CPU tensors (xpu) raised a raw AssertionError. Each
    cause now comes from a checked fact: a backend module this torch build lacks (hpu), tensors on another device
    than the region's (xpu around CPU tensors), a device type torch does not know, or else the op's own error."""
    import parallelizer
    from parallelizer.errors import TraceError
    from parallelizer.tracer.normalize import autocast_failure

    assert getattr(torch, "hpu", None) is None and getattr(torch, "xpu", None) is not None  # the facts used below
    with pytest.raises(TraceError) as hpu:
        parallelizer.trace(_AutocastOn("hpu"), (torch.randn(2, 4),))
    assert "no torch.hpu backend module" in str(hpu.value) and "machine with" not in str(hpu.value)
    with pytest.raises(TraceError) as xpu:
        parallelizer.trace(_AutocastOn("xpu"), (torch.randn(2, 4),))
    assert "the op's tensors are on cpu, not xpu" in str(xpu.value), str(xpu.value)
    cause, _ = autocast_failure("foo", [], RuntimeError("boom"))
    assert "'foo' is not a device type torch knows" in cause
    cause, remedy = autocast_failure("cpu", [torch.zeros(2)], RuntimeError("boom"))
    assert cause.startswith("the op raised") and "RuntimeError: boom" in cause and "eagerly" in remedy
