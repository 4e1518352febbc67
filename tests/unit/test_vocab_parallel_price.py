"""The vocab-parallel cross-entropy is priced as it runs (`planner.costs._vocab_parallel_saved_bytes`,
`rewriter.vocab_parallel`: the local softmax alone, as Megatron-LM's VocabParallelCrossEntropy keeps), so a
memory-bound plan of a large vocabulary keeps the loss vocab-parallel instead of moving the logits to batch shards
by an all-to-all (RESULTS.md, Round 21 (g) finding 2: Llama-3-8B, vocab 128256, fsdp x tp)."""
import contextlib
import io

import pytest

import parallelizer
from parallelizer import zoo
from parallelizer.planner.api import explain

# Llama of reduced width with Llama-3's vocabulary: the (2048, 128256) float32 logits (1002 MiB) dominate
LLAMA = dict(hidden_size=128, intermediate_size=352, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=128256, batch=8, seq_len=256, labels=True, returns="loss", device="meta")
ROWS = LLAMA["batch"] * LLAMA["seq_len"]


@pytest.fixture(scope="module")
def traced():
    return parallelizer.trace(*zoo.llama(**LLAMA))


@pytest.mark.parametrize("mesh, roles, vocab_parallel, all_to_all", [
    ({"tp": 2}, {"tp": "tp"}, "S(1) R -> R", "S(0) S(0) -> P"),
    ({"dp": 2, "tp": 2}, {"dp": "fsdp", "tp": "tp"}, "S(0)S(1) S(0)R -> PR", "S(0)S(0) S(0)S(0) -> PP")],
    ids=["tp2", "fsdp2xtp2"])
def test_a_memory_bound_plan_keeps_the_loss_vocab_parallel(traced, mesh, roles, vocab_parallel, all_to_all):
    """Free, the planner takes the vocab-parallel loss (no all-to-all of the logits). Its priced memory is the
    all-to-all form's plus 5 bytes per row on tp=2 (closed form: both keep one local logits-sized tensor, (rows,
    V/tp) vs (rows/tp, V); the vocab-parallel node an int64 index of every row where the all-to-all form keeps the
    int64 targets of its 1/tp of the rows, and a bool flag per row; the all-to-all form's 0-d total_weight).
    So under
    a budget that admits the all-to-all form with 1 MiB to spare (since round 26 on the step peak) it stays
    vocab-parallel (before round 22 it was
    priced one local logits tensor larger, 501 MiB on tp=2, and the budget moved it to the all-to-all)."""
    cluster = f"h100:1x{len(mesh) * 2}"
    opts = dict(axis_roles=roles, cluster=cluster, precision="fp32", progress=False, recompute="none")
    with contextlib.redirect_stdout(io.StringIO()):  # the solver library prints a banner
        free = parallelizer.plan(traced, mesh, **opts)
        ce = next(k for k, n in free.nodes.items() if n.op == "aten.cross_entropy_loss.default")
        assert free.nodes[ce].strategy == vocab_parallel
        alts = {a[0]: a for a in explain(traced, free, ce, cluster=cluster).alternatives}
        rows, tp = ROWS // mesh.get("dp", 1), mesh["tp"]  # the rows of a dp shard
        # a bool per row, and the int64 target (index) of every row where the all-to-all form keeps 1/tp of them;
        # the all-to-all form's nll_loss also keeps its 0-d fp32 total_weight (4 B, priced since round 23, r23e)
        assert alts[vocab_parallel][2] - alts[all_to_all][2] == rows + rows * 8 - rows // tp * 8 - 4, \
            (alts[vocab_parallel], alts[all_to_all])
        assert alts[vocab_parallel][1] < alts[all_to_all][1]  # and it is faster (no all-to-all of the logits)
        # the budget binds on the step peak (round 26, r26d): the free plan's peak less the bytes the vocab-parallel
        # node keeps more than the all-to-all form (the closed form above), with 1 MiB to spare
        extra = alts[vocab_parallel][2] - alts[all_to_all][2]
        tight = parallelizer.plan(traced, mesh, memory_budget_bytes=free.cost.memory_bytes["peak"] - extra + 2**20,
                                  memory_reserve_bytes=0, **opts)
    assert tight.nodes[ce].strategy == vocab_parallel, tight.nodes[ce]
