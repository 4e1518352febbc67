"""When a pipeline stage's dp gradient buckets are ready (round 19, r19h; `planner.stage_sync`): backward produces
a stage's gradients segment by segment in reverse order (head first, embedding last), so a bucket is ready when
the backward has run through the segment that produces its last byte, not at its share of the bytes. An
embedding's dense gradient is produced by the last, cheapest op of the first stage's backward: its all-reduce
cannot overlap that backward (before: 0.471 ms "dp grad sync" on a Llama-3-70B plan whose first stage holds
1.05 GB of embedding gradient per device, whose all-reduce alone takes 18 ms over its dp group)."""
import itertools

import pytest

from benchmarks.published.models import llama_loss_only
import parallelizer
from cost_model.communication import step_collective_s
from cost_model.topology import MeshTopology, get_cluster
from parallelizer.planner.stage_sync import ready_fractions, stage_syncs
from parallelizer.rewriter.grad_sync import DEFAULT_BUCKET_BYTES, bucket_sizes


def test_ready_fractions_follow_backward_seconds_not_bytes():
    # a block of 10 s producing 100 bytes, then an embedding of no seconds producing 100 bytes
    assert ready_fractions([50.0, 100.0, 150.0, 200.0], [(10.0, 100.0), (0.0, 100.0)]) == (0.5, 1.0, 1.0, 1.0)
    # three segments of 1, 2, 1 s with 10, 10, 20 bytes: byte 15 is half-way through the second segment
    assert ready_fractions([15.0, 40.0], [(1.0, 10.0), (2.0, 10.0), (1.0, 20.0)]) == pytest.approx((0.5, 1.0))
    # a head of no seconds first: its bucket is ready at once (floored into (0, 1])
    assert ready_fractions([5.0, 10.0], [(0.0, 5.0), (4.0, 5.0)]) == pytest.approx((1e-12, 1.0))
    # no seconds at all: every bucket at the end of the action
    assert ready_fractions([1.0, 2.0], [(0.0, 2.0)]) == (1.0, 1.0)


def test_without_segments_bytes_are_ready_evenly_as_before():
    topo = MeshTopology(get_cluster("h100:4x1"), (2, 2, 1), ("pp", "dp", "tp"))
    secs, ready = stage_syncs(2, [60e6], topo, True)
    sizes = bucket_sizes(60e6)  # the runtime's buckets: 1 MiB, 25 MiB, 25 MiB, the rest
    assert len(sizes) == 4 and len(secs[0]) == 4
    assert ready[0] == tuple(min(1.0, x / 60e6) for x in itertools.accumulate(sizes))


def test_an_embedding_gradient_all_reduce_is_exposed_after_the_first_stages_last_backward():
    """Llama (4 blocks, hidden 1024, vocab 128256, untied head) on 4 H100 nodes of one GPU, pp=2 x dp=2, 1F1B:
    rank 0 holds the embedding and ends the step (its last backward is the step's last action), and the
    embedding's gradient, 128256 x 1024 fp32 = 525 MB, is produced when that backward ends. So the exposed dp
    sync is at least the all-reduce of the buckets that hold only embedding bytes (all but at most one
    bucket's worth): all_reduce(E - 25 MiB) over dp (affine in bytes, so one call bounds the buckets' sum).
    Before: 8.38 ms < that bound (9.99 ms): the buckets were taken as ready at their share of the bytes."""
    traced = llama_loss_only(4, 1024, 2816, 8, 8, 128256, 2048)
    cluster = get_cluster("h100:4x1")
    plan = parallelizer.plan_pipeline(traced, cluster, global_batch=32, pp=2, tp=1, num_microbatches=4,
                                      schedules=("1f1b",), progress=False)
    assert plan.stages[0].includes_pre and not plan.stages[1].includes_pre
    emb = 128256 * 1024 * 4
    topo = MeshTopology(cluster, (2, 2, 1), ("pp", "dp", "tp"))
    bound = step_collective_s("all_reduce", emb - DEFAULT_BUCKET_BYTES, topo, ("dp",))
    assert cluster.device.comm_overlap == 1.0
    assert plan.step_breakdown_s["dp_grad_sync"] >= bound, (plan.step_breakdown_s, bound)
    # and no more than every bucket of both ranks' gradients exposed
    total = step_collective_s("all_reduce", emb * 2 + 4 * 1024 * 1024 * 50, topo, ("dp",))
    assert plan.step_breakdown_s["dp_grad_sync"] <= total
