"""A sum over ranks of float16 / bfloat16 values runs in float32 (round 24, r24b): its steps move 4 bytes per
element, in the one source of collective steps (`core.redistribute`), so the planner prices what the rewriter
emits (DESIGN.md rule 1); the emitted program holds the pending sum in float32 and rounds it once."""
import contextlib
import io
import math

import pytest
import torch
from torch import nn

import parallelizer
from parallelizer.core import Layout, MeshSpec, Partial, Replicate, Shard, edge_steps
from parallelizer.core.redistribute import sum_dtype, sum_itemsize
from parallelizer.config import PlanConfig
from parallelizer.planner.api import build
from parallelizer.planner.plan import NodePlan, derive_edge
from parallelizer.rewriter import collectives
from parallelizer.rewriter.apply import as_sum_dtype, rewrite
from parallelizer.rewriter.spec import spec_from_plan
from parallelizer.rewriter.verify import verify

MESH = MeshSpec(("tp",), (2,))
SHAPE = (6, 10)


# bytes per element a SUM over ranks moves, closed form: float16 / bfloat16 in float32 (one device's accumulation,
# r24b); gloo sums bool, (u)int8, int32, int64, float32, float64 as they are and no other dtype (ProcessGroupGloo's
# GENERATE_ALL_TYPES), so int16 / uint16 / uint32 / uint64 add in int64, float8 in float32 and complex32 in complex64
# (its float16 parts in float32, round 26; `collectives._carried`)
SUM_BYTES = [(torch.float16, 4), (torch.bfloat16, 4), (torch.float32, 4), (torch.float64, 8), (torch.int16, 8),
             (torch.uint16, 8), (torch.int32, 4), (torch.uint32, 8), (torch.int64, 8), (torch.int8, 1),
             (torch.uint8, 1), (torch.float8_e4m3fn, 4), (torch.complex64, 8), (torch.complex32, 8)]


def _runtime_sum_bytes(dtype: torch.dtype) -> int:
    """Bytes per element of the tensor the runtime hands the backend to sum a `dtype` tensor, read off that tensor
    (`collectives._carried(sums=True)` around a recording step; a complex one as its real view)."""
    seen = []
    run = collectives._carried(sums=True)(lambda x: seen.append(x) or x)
    out = run(torch.ones(3, 5).to(dtype))
    assert out.dtype == dtype and len(seen) == 1
    return seen[0].numel() * seen[0].element_size() // 15


@pytest.mark.parametrize("dtype, bytes_", SUM_BYTES)
def test_sum_bytes_per_element_are_the_bytes_the_runtime_sums(dtype, bytes_):
    assert sum_itemsize(dtype) == bytes_ == sum_dtype(dtype).itemsize
    assert _runtime_sum_bytes(dtype) == bytes_


@pytest.fixture(scope="module")
def fp32_traced():
    with contextlib.redirect_stdout(io.StringIO()):
        return parallelizer.trace(RowParallel(), (torch.ones(2, 4),))


@pytest.fixture(scope="module")
def fp32_pricer(fp32_traced):
    return build(fp32_traced, MESH, cluster="h100:1x2", config=PlanConfig(precision="fp32"))[1]


@pytest.mark.parametrize("dtype, bytes_", SUM_BYTES)
def test_the_planner_prices_a_partial_of_any_dtype_at_the_bytes_the_runtime_sums(fp32_pricer, dtype, bytes_):
    # round 25: `Pricer.steps` took every 2-byte tensor for a float summed at 4 B (an int16 Partial priced at 4 B per
    # element where the runtime moves int64's 8), and a float8 or uint32 one at its own itemsize (1, 4 for 4, 8)
    n = math.prod(SHAPE)
    for dst, kind in [(Layout((Replicate(),)), "all_reduce"), (Layout((Shard(0),)), "reduce_scatter")]:
        step, = fp32_pricer.steps(Layout((Partial(),)), dst, SHAPE, dtype, (), False)
        assert step.kind == kind and step.nbytes == n * _runtime_sum_bytes(dtype) == n * bytes_
    gather, = fp32_pricer.steps(Layout((Shard(0),)), Layout((Replicate(),)), SHAPE, dtype, (), False)
    assert gather.nbytes == n * dtype.itemsize  # a move carries the dtype's own bytes


@pytest.mark.parametrize("dtype, bytes_", SUM_BYTES)
def test_a_plans_steps_carry_the_bytes_the_runtime_sums(dtype, bytes_):
    # `plan.derive_edge` (the steps a Plan records, shows and the rewriter emits) gave an int16 Partial's all_reduce
    # 2 B per element and a float8 one 1 B before round 25, where the runtime sums them in int64 / float32
    consumer = NodePlan("aten.relu.default", ("R",), "R")
    edge = derive_edge(MESH, "a", "b", 0, "P", consumer, SHAPE, str(dtype).removeprefix("torch."), False, False)
    (step,) = edge.steps
    assert step.kind == "all_reduce" and step.nbytes == math.prod(SHAPE) * _runtime_sum_bytes(dtype)


def test_a_bf16_value_of_a_bf16_plan_moves_2_bytes_and_sums_4(fp32_traced):
    # under precision "bf16" `Pricer.steps` takes a value's dtype as the autocast recipe runs it
    # (`Pricer.input_dtype`, round 25 r25b): a bf16 one (a matmul's output) moves 2 B and sums in float32 (4 B);
    # an fp32 one (the residual stream, kept fp32 by autocast's promotion) moves and sums 4 B
    pricer = build(fp32_traced, MESH, cluster="h100:1x2", config=PlanConfig(precision="bf16"))[1]
    n = math.prod(SHAPE)
    for dtype, moved in ((torch.bfloat16, 2), (torch.float32, 4)):
        step, = pricer.steps(Layout((Partial(),)), Layout((Replicate(),)), SHAPE, dtype, (), False)
        gather, = pricer.steps(Layout((Shard(0),)), Layout((Replicate(),)), SHAPE, dtype, (), False)
        assert (step.nbytes, gather.nbytes) == (4 * n, moved * n), dtype


@pytest.mark.parametrize("dst, kind", [(Layout((Replicate(),)), "all_reduce"), (Layout((Shard(0),)), "reduce_scatter")])
def test_a_narrow_partial_is_reduced_at_float32_bytes(dst, kind):
    n = math.prod(SHAPE)
    wide, = edge_steps(Layout((Partial(),)), dst, SHAPE, MESH, itemsize=2, sum_bytes=4)
    plain, = edge_steps(Layout((Partial(),)), dst, SHAPE, MESH, itemsize=2)
    assert wide.kind == kind and wide.nbytes == 4 * n and plain.nbytes == 2 * n
    if kind == "reduce_scatter":  # its backward all-gathers the narrow gradient: the use dtype's bytes
        assert wide.bwd_nbytes == plain.bwd_nbytes == 2 * n


@pytest.mark.parametrize("is_parameter", [False, True])
def test_gradient_sums_at_float32_bytes_except_a_parameters(is_parameter):
    # a parameter's gradient sum is priced at the plan's gradient bytes by the planner (`Pricer.step_time_s`)
    n = math.prod(SHAPE)
    rep = Layout((Replicate(),))
    sync, = edge_steps(rep, rep, SHAPE, MESH, itemsize=2, grad_partial_axes=("tp",), is_parameter=is_parameter,
                       sum_bytes=4)
    assert sync.kind == "grad_all_reduce" and sync.bwd_nbytes == (2 if is_parameter else 4) * n
    gather = edge_steps(Layout((Shard(0),)), rep, SHAPE, MESH, itemsize=2, grad_partial_axes=("tp",),
                        is_parameter=is_parameter, sum_bytes=4)[0]
    assert gather.kind == "all_gather" and gather.bwd_kind == "reduce_scatter"
    assert gather.nbytes == 2 * n and gather.bwd_nbytes == (2 if is_parameter else 4) * n


class RowParallel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(4, 8, bias=False), nn.Linear(8, 4, bias=False)

    def forward(self, x):
        return self.fc2(self.fc1(x))


@pytest.fixture(scope="module")
def half_plan():
    model = RowParallel().half()
    with contextlib.redirect_stdout(io.StringIO()):
        traced = parallelizer.trace(model, (torch.ones(2, 4, dtype=torch.float16),))
        plan = parallelizer.plan(traced, {"tp": 2}, axis_roles={"tp": "tp"})
    return traced, plan


def test_the_plan_prices_the_float16_row_parallel_sum_as_the_rewriter_emits_it(half_plan):
    traced, plan = half_plan
    assert str(plan.nodes["linear_1"].output) == "P", "the case is a row-parallel Partial"
    edge = next(e for e in plan.edges_into("output"))
    (step,) = [s for s in edge.steps if s.kind == "all_reduce"]
    assert step.nbytes == 2 * 4 * 4  # (2, 4) elements at float32's 4 B, not float16's 2
    program = rewrite(traced, spec_from_plan(plan), rank=0)
    verify(program, traced, spec_from_plan(plan))
    emitted = [n.meta["step"] for n in program.graph_module.graph.nodes if n.meta.get("step") is not None]
    assert step in emitted  # rule 1: the step priced is the step emitted
    nodes = list(program.graph_module.graph.nodes)
    reduce_at = next(i for i, n in enumerate(nodes) if n.name.startswith("all_reduce"))
    assert nodes[reduce_at + 1].target is torch.Tensor.to and nodes[reduce_at + 1].args[1] == torch.float16
    widened = [n for n in nodes if n.target is as_sum_dtype]
    assert widened and all(n.users and next(iter(n.users)).name.startswith("linear") for n in widened)


def test_a_widened_op_is_priced_with_the_float32_copies_it_saves(half_plan):
    # the row-parallel product of a float16 model runs on float32 copies of its (2, 4) input shard and (4, 4)
    # weight shard, and autograd saves those: the activation is priced at 4 B per element (the weight's copy is
    # not priced: parameters are not activations, RESULTS "Round 24 (r24b)"); a Shard output is not widened
    traced, _ = half_plan
    problem, pricer = build(traced, MESH, cluster="h100:1x2", config=PlanConfig())
    info, space = traced.nodes["linear_1"], problem.spaces["linear_1"]
    by = {(tuple(str(x) for x in s.inputs), str(s.output)): s for s in space.strategies}
    row, column = by[(("S(1)", "S(1)"), "P")], by[(("R", "S(0)"), "S(1)")]
    assert pricer.node_cost(traced, info, space, row).saved_bytes == 2 * 4 * 4  # its (2, 4) input shard in float32
    assert pricer.node_cost(traced, info, space, column).saved_bytes == 2 * 8 * 2  # the whole (2, 8) input, float16


def test_a_bfloat16_row_parallel_product_keeps_its_dtype_and_sums_in_float32():
    # bfloat16 cannot overflow (float32's exponent range): its op is not widened, so a GPU runs and the planner
    # prices its matmul at the bf16 rate; only the sum over ranks runs in float32 (4 B per element), rounded by
    # the collective itself (`core.redistribute.WIDENED_FLOATS`)
    model = RowParallel().bfloat16()
    with contextlib.redirect_stdout(io.StringIO()):
        traced = parallelizer.trace(model, (torch.ones(2, 4, dtype=torch.bfloat16),))
        plan = parallelizer.plan(traced, {"tp": 2}, axis_roles={"tp": "tp"})
    assert str(plan.nodes["linear_1"].output) == "P", "the case is a row-parallel Partial"
    (step,) = [s for e in plan.edges_into("output") for s in e.steps if s.kind == "all_reduce"]
    assert step.nbytes == 2 * 4 * 4
    program = rewrite(traced, spec_from_plan(plan), rank=0)
    verify(program, traced, spec_from_plan(plan))
    nodes = list(program.graph_module.graph.nodes)
    assert not [n for n in nodes if n.target is as_sum_dtype or n.target is torch.Tensor.to]
    problem, pricer = build(traced, MESH, cluster="h100:1x2", config=PlanConfig())
    info, space = traced.nodes["linear_1"], problem.spaces["linear_1"]
    row = next(s for s in space.strategies if str(s.output) == "P")
    assert pricer.node_cost(traced, info, space, row).saved_bytes == 2 * 4 * 2  # its (2, 4) input shard in bf16
