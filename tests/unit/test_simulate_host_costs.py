"""The action-list simulator's host costs per action (issue 14, rounds 16-20): the runtime's fixed cost per compute
action, send and receive (`StageTimes.action_overhead`), gloo's threads' CPU per P2P op and per byte at both ends of
every cross-rank transfer, BitPipe's exchange packing and its own runner's costs, torch's split backward per
autograd node: each against closed forms or counts taken off the action lists (split from test_simulate.py)."""
import dataclasses

import pytest

from cost_model.hardware import PipelineActionCost
from parallelizer.errors import PipelineError
from parallelizer.planner.sharing import SharedCores
from parallelizer.planner.simulate import StageTimes, action_schedule, simulate


# --- the runtime's fixed cost per action (issue 14, round 16: `StageTimes.action_overhead`) -----------------------

def _with(times: StageTimes, **cost) -> StageTimes:
    return dataclasses.replace(times, action_overhead=PipelineActionCost(**cost))


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(1, 1), (2, 8), (4, 4), (4, 9), (8, 32)])
def test_gpipe_1f1b_with_c_per_compute_action_take_m_plus_p_minus_one_times_f_b_2c(name, p, m):
    """Every F and every B pays c on its rank: the stage time is F + B + 2c, so (m + p - 1)(F + B + 2c)."""
    c = 0.25
    r = simulate(name, p, m, _with(StageTimes.uniform(p, 1.0, 1.5, 0.5), forward_s=c, backward_s=c))
    assert r.makespan_s == (m + p - 1) * (3.0 + 2 * c)
    assert max(r.busy_s) == m * (3.0 + 2 * c)  # the overhead is the rank's own (CPU) work


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("m", [1, 4, 9])
def test_two_ranks_pay_one_send_or_receive_per_action_and_the_step_set_up_once(name, m):
    """p = 2: stage 0's F sends and its B receives, stage 1's F receives and its B sends, so with send = recv = c
    every action pays c once: (m + 1)(F + B + 2c), and the step's set-up s before the first actions: + s."""
    c, s = 0.25, 0.125
    r = simulate(name, 2, m, _with(StageTimes.uniform(2, 1.0, 1.5, 0.5), send_s=c, recv_s=c, step_s=s))
    assert r.makespan_s == s + (m + 1) * (3.0 + 2 * c)


@pytest.mark.parametrize("p,m", [(3, 5), (4, 8), (6, 6)])
def test_gpipe_middle_stages_pay_a_send_and_a_receive_per_action(p, m):
    """GPipe is a flow shop of m equal jobs, forward then backward: makespan = sum over stages of t_k + (m - 1)
    max t_k per phase. With send = recv = c the end stages' actions pay c, the middle ones' 2c."""
    c = 0.25
    r = simulate("gpipe", p, m, _with(StageTimes.uniform(p, 1.0, 1.5, 0.5), send_s=c, recv_s=c))
    extra = [c if k in (0, p - 1) else 2 * c for k in range(p)]
    fwd, bwd = [1.0 + e for e in extra], [2.0 + e for e in extra]
    assert r.makespan_s == pytest.approx(sum(fwd) + (m - 1) * max(fwd) + sum(bwd) + (m - 1) * max(bwd), rel=1e-12)


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8)])
def test_zbv_with_overheads_that_keep_f_i_w_equal_stays_zb_h1(p, m):
    """torch's ZBV list at F = I = W idles (p - 1) F per rank (ZB-H1): with the overheads F + cF = I + cI =
    W + cW the form holds at the overhead-inclusive time (no transfers priced: c_send = c_recv = 0)."""
    r = simulate("zbv", p, m, _with(StageTimes.uniform(2 * p, 1.0, 1.5, 1.25),
                                    forward_s=0.5, backward_input_s=0.0, backward_weight_s=0.25))
    assert r.bubble_s == (p - 1) * 1.5
    assert max(r.busy_s) == 2 * m * 3 * 1.5


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "interleaved_1f1b", "zbv", "dualpipev", "bitpipe"])
def test_an_overhead_per_compute_action_equals_adding_it_to_the_stage_times(name):
    """Alone (no transfers, no set-up) the per-kind overhead is the same as longer F / I / W, also when the ranks
    share cores (processor sharing: the overhead is CPU work); all zeros change nothing, bit for bit."""
    p, m = 4, 8
    S = (1 if name in ("gpipe", "1f1b") else 2) * p
    base = StageTimes((1.0, 1.25, 0.75, 1.5)[:S] * (S // min(S, 4)), (0.5,) * S, (0.75,) * S, (0.1,) * (S - 1))
    longer = dataclasses.replace(base, fwd_s=tuple(f + 0.2 for f in base.fwd_s),
                                 bwd_input_s=tuple(i + 0.3 for i in base.bwd_input_s),
                                 bwd_weight_s=tuple(w + 0.05 for w in base.bwd_weight_s))
    cost = dict(forward_s=0.2, backward_input_s=0.3, backward_weight_s=0.05, backward_s=0.35)
    for cores in (None, SharedCores.ideal(2, p)):
        assert simulate(name, p, m, _with(base, **cost), cores).makespan_s == pytest.approx(
            simulate(name, p, m, longer, cores).makespan_s, rel=1e-12)
        zero = simulate(name, p, m, _with(base), cores)
        plain = simulate(name, p, m, base, cores)
        assert (zero.makespan_s, zero.busy_s) == (plain.makespan_s, plain.busy_s)


def test_same_rank_hand_offs_pay_no_send_or_receive():
    """The V's tip (zbv: stages p - 1 and p on one rank) hands over locally, so with only sends priced the tip's
    rank sends as few transfers as rank 0 (whose stage 0 sends no gradient and stage 2p - 1 no activation)."""
    p, m = 4, 8
    c = simulate("zbv", p, m, _with(StageTimes.uniform(2 * p, 1.0, 1.0, 1.0), send_s=1e-3))
    plain = simulate("zbv", p, m, StageTimes.uniform(2 * p, 1.0, 1.0, 1.0))
    extra = [a - b for a, b in zip(c.busy_s, plain.busy_s)]
    # rank 0 holds stages 0 and 2p - 1: sends F of stage 0 and I of stage 2p - 1 (2m); rank p - 1 holds the tip
    # (p - 1 -> p local): sends only I of stage p - 1 and F of stage p (2m); middle ranks send 4m
    assert extra == pytest.approx([2 * m * 1e-3] + [4 * m * 1e-3] * (p - 2) + [2 * m * 1e-3], rel=1e-9)


# --- the communication library's own threads (gloo's), per cross-rank P2P op (issue 14, round 18) ---------------

@pytest.mark.parametrize("name", ["gpipe", "1f1b", "interleaved_1f1b", "zbv", "dualpipev", "bitpipe"])
def test_gloo_threads_cpu_is_paid_per_cross_rank_send_and_receive_by_every_runner(name):
    """`PipelineActionCost.comm_thread_s` = c costs exactly what a send and a receive of c each cost (one per
    cross-rank transfer at each end), on torch's runtime and on BitPipe's own runner alike (the library's
    figure, read from the top level even when the own runner's costs are measured), with and without ranks
    sharing cores. Closed form at p = 2 (1f1b / gpipe: every F and B of both stages sends or receives one
    transfer): (m + 1)(F + B + 2c)."""
    p, m, c = (2, 4, 0.125) if name != "bitpipe" else (4, 8, 0.125)
    S = action_schedule(name, p, m).num_stages
    base = StageTimes.uniform(S, 1.0, 0.5, 0.75)
    own = PipelineActionCost()  # a measured own runner without any cost: BitPipe still pays gloo's threads
    for cores in (None, SharedCores.ideal(1, p)):
        comm = simulate(name, p, m, _with(base, comm_thread_s=c, own_runner=own), cores)
        ops = simulate(name, p, m, _with(base, send_s=c, recv_s=c), cores)
        assert comm.makespan_s == pytest.approx(ops.makespan_s, rel=1e-12)
        assert comm.busy_s == pytest.approx(ops.busy_s, rel=1e-12)
        plain = simulate(name, p, m, base, cores)
        assert comm.makespan_s > plain.makespan_s
    if name in ("gpipe", "1f1b"):
        assert simulate(name, 2, m, _with(StageTimes.uniform(2, 1.0, 0.5, 0.75), comm_thread_s=c)).makespan_s == \
            pytest.approx((m + 1) * (1.0 + 1.25 + 2 * c), rel=1e-12)


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8)])
def test_bitpipes_exchange_packing_is_cpu_work_on_each_copys_rank(p, m):
    """`StageTimes.copy_pack_s` (round 18: the host passes over a stage's gradients that BitPipe's twin exchange
    makes, measured 48-58 ms per rank per step at GPT width 512): every rank holds 4 stage copies (2 per pipeline,
    `planner.bitpipe`), so with q per stage each rank's busy time grows by exactly 4 q, on its own core and when
    the ranks share cores; schedules with one copy of each stage ignore it; the price is EXCHANGE_PASSES (7)
    passes of the gradient bytes at the device's memory bandwidth."""
    S, q = 2 * p, 0.125
    base = StageTimes.uniform(S, 1.0, 0.5, 0.75)
    for cores in (None, SharedCores.ideal(p, p)):
        plain = simulate("bitpipe", p, m, base, cores)
        packed = simulate("bitpipe", p, m, dataclasses.replace(base, copy_pack_s=(q,) * S), cores)
        assert [b - a for a, b in zip(plain.busy_s, packed.busy_s)] == pytest.approx([4 * q] * p, rel=1e-12)
        assert packed.makespan_s > plain.makespan_s
    one = StageTimes.uniform(2 * p, 1.0, 0.5, 0.75)
    assert simulate("zbv", p, 2 * m, dataclasses.replace(one, copy_pack_s=(q,) * S)).makespan_s == \
        simulate("zbv", p, 2 * m, one).makespan_s
    with pytest.raises(PipelineError, match="copy_pack_s"):
        simulate("bitpipe", p, m, dataclasses.replace(base, copy_pack_s=(q,) * (S - 1)))
    from cost_model.hardware import A100_80GB
    from cost_model.pipeline_actions import EXCHANGE_PASSES, copy_exchange_pack_s
    assert EXCHANGE_PASSES == 7
    assert copy_exchange_pack_s(52e6, A100_80GB) == pytest.approx(7 * 52e6 / A100_80GB.hbm_bytes_per_s, rel=1e-12)


# --- the package's own runner (BitPipe) priced at its own per-action cost (issue 14, round 17) -------------------

def _cross_rank_transfers(name: str, p: int, m: int) -> tuple[list[int], list[int]]:
    """Per rank, (transfers its actions send to another rank, transfers they receive from one), counted off the
    action lists and placement: F of a copy's stage k sends to stage copy x + 1 (k < S - 1) and receives from
    x - 1 (k > 0); I / B sends to x - 1 (k > 0) and receives from x + 1 (k < S - 1)."""
    sched = action_schedule(name, p, m)
    S, where = sched.num_stages, sched.stage_to_rank
    sends, recvs = [0] * p, [0] * p
    for r in range(p):
        for a in sched.actions[r]:
            x, k, kind = a.stage_index, a.stage_index % S, a.computation_type.value
            if kind == "F":
                sends[r] += k < S - 1 and where[x + 1] != r
                recvs[r] += k > 0 and where[x - 1] != r
            elif kind in ("B", "I"):
                sends[r] += k > 0 and where[x - 1] != r
                recvs[r] += k < S - 1 and where[x + 1] != r
    return sends, recvs


def _cross_rank_sends(name: str, p: int, m: int) -> list[int]:
    """Per rank, the transfers its actions send to another rank (`_cross_rank_transfers`)."""
    return _cross_rank_transfers(name, p, m)[0]


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8)])
def test_bitpipe_pays_its_own_runners_costs_and_the_other_schedules_torchs(p, m):
    """`PipelineActionCost.own_runner` is what BitPipe's actions pay (its own runner: F measured 1.1-2.9x
    torch's); every other schedule pays the torch figures beside it. Closed forms: the own runner's per-action
    c on F and B equals F + c, B + c; its send d adds d per cross-rank transfer a rank sends (counted off the action lists);
    its set-up s adds exactly s; torch's figures leave BitPipe unchanged when the own runner's are measured."""
    S = action_schedule("bitpipe", p, m).num_stages
    base = StageTimes.uniform(S, 1.0, 0.5, 0.75)
    c, d, s = 0.2, 1e-3, 0.05
    torch_costs = dict(forward_s=0.7, backward_s=0.9, send_s=0.3, recv_s=0.3, step_s=0.4)
    own = PipelineActionCost(forward_s=c, backward_s=c)
    longer = dataclasses.replace(base, fwd_s=tuple(f + c for f in base.fwd_s),
                                 bwd_input_s=tuple(i + c for i in base.bwd_input_s))
    plain = simulate("bitpipe", p, m, base)
    assert simulate("bitpipe", p, m, _with(base, **torch_costs, own_runner=own)).makespan_s == pytest.approx(
        simulate("bitpipe", p, m, longer).makespan_s, rel=1e-12)
    sends = simulate("bitpipe", p, m, _with(base, **torch_costs, own_runner=PipelineActionCost(send_s=d)))
    assert [a - b for a, b in zip(sends.busy_s, plain.busy_s)] == pytest.approx(
        [d * n for n in _cross_rank_sends("bitpipe", p, m)], rel=1e-9)
    set_up = simulate("bitpipe", p, m, _with(base, **torch_costs, own_runner=PipelineActionCost(step_s=s)))
    assert set_up.makespan_s == pytest.approx(plain.makespan_s + s, rel=1e-12)
    # without the own runner's figures BitPipe pays torch's (as before round 17); other schedules always do
    assert simulate("bitpipe", p, m, _with(base, **torch_costs)).makespan_s > plain.makespan_s + 0.4
    for name in ("1f1b", "zbv"):
        k = (1 if name == "1f1b" else 2) * p
        t = StageTimes.uniform(k, 1.0, 0.5, 0.75)
        assert simulate(name, p, m, _with(t, **torch_costs, own_runner=own)).makespan_s == \
            simulate(name, p, m, _with(t, **torch_costs)).makespan_s


# --- CPU that grows with size: the communication threads per byte, torch's split backward per node (round 19) ----

@pytest.mark.parametrize("name", ["gpipe", "1f1b", "interleaved_1f1b", "zbv", "dualpipev", "bitpipe"])
def test_comm_threads_per_byte_cpu_is_paid_on_both_ends_of_every_cross_rank_transfer(name):
    """`PipelineActionCost.comm_thread_per_byte_s` = beta with `StageTimes.p2p_bytes` = b: each rank's busy time
    grows by exactly beta b per transfer it sends or receives across ranks (counted off the action lists and the
    placement, not the simulator's DAG), on its own core and sharing cores; BitPipe pays the library's figure
    even with its own runner's costs measured; without bytes nothing changes. Closed form at p = 2 for
    gpipe / 1f1b with forward bytes bf and backward bytes bb: (m + 1)(F + B + beta (bf + bb))."""
    p, m, beta, b = (4, 8, 1e-3, 64.0)
    S = action_schedule(name, p, m).num_stages
    base = StageTimes.uniform(S, 1.0, 0.5, 0.75)
    own = PipelineActionCost()  # BitPipe's own runner, measured at zero cost
    cost = dict(comm_thread_per_byte_s=beta, own_runner=own)
    sends, recvs = _cross_rank_transfers(name, p, m)
    assert sum(sends) == sum(recvs) > 0
    for cores in (None, SharedCores.ideal(p, p)):
        plain = simulate(name, p, m, _with(base, **cost), cores)
        assert plain.makespan_s == simulate(name, p, m, base, cores).makespan_s  # no bytes given: no charge
        sized = simulate(name, p, m, _with(dataclasses.replace(base, p2p_bytes=(b,) * (S - 1)), **cost), cores)
        assert [y - x for x, y in zip(plain.busy_s, sized.busy_s)] == \
            pytest.approx([beta * b * (s + r) for s, r in zip(sends, recvs)], rel=1e-9)
        assert sized.makespan_s > plain.makespan_s
    if name in ("gpipe", "1f1b"):
        bf, bb = 64.0, 32.0
        two = StageTimes.uniform(2, 1.0, 0.5, 0.75)
        r = simulate(name, 2, m, _with(dataclasses.replace(two, p2p_bytes=(bf,), p2p_bwd_bytes=(bb,)),
                                       comm_thread_per_byte_s=beta))
        assert r.makespan_s == pytest.approx((m + 1) * (1.0 + 1.25 + beta * (bf + bb)), rel=1e-12)
    with pytest.raises(PipelineError, match="p2p_bytes"):
        simulate(name, p, m, _with(dataclasses.replace(base, p2p_bytes=(b,) * S), **cost))


@pytest.mark.parametrize("size,cost,unit", [("backward_nodes", "split_backward_per_node_s", 1.0),
                                             ("weight_grad_bytes", "split_backward_per_byte_s", 1e6)])
@pytest.mark.parametrize("name", ["gpipe", "1f1b", "interleaved_1f1b", "zbv", "dualpipev", "bitpipe"])
def test_torchs_split_backward_pays_per_autograd_node_and_weight_byte_of_its_stage_on_each_w_action(name, size, cost,
                                                                                                   unit):
    """`PipelineActionCost.split_backward_per_node_s` = s with `StageTimes.backward_nodes` = n_k (round 19), and
    `split_backward_per_byte_s` = s / 1e6 with `StageTimes.weight_grad_bytes` = 1e6 n_k (round 26: the fresh weight
    gradients `stage_backward_weight` adds into `.grad`): each W action (torch's `stage_backward_weight` after
    `stage_backward_input`) pays s n_k of its stage on its rank; so each rank's busy grows by s x the sizes of the W
    actions in its list (counted off the action lists: zbv splits every backward, m per stage, dualpipev some, the
    full-backward schedules and BitPipe's own runner none). Closed form for zbv: all ranks together m s sum(n_k)."""
    p, m, s = 4, 8, 1e-3
    sched = action_schedule(name, p, m)
    S = sched.num_stages
    nodes = tuple(float(10 + k) for k in range(S))
    base = StageTimes.uniform(S, 1.0, 0.5, 0.75)
    want = [s * sum(nodes[a.stage_index % S] for a in sched.actions[r] if a.computation_type.value == "W")
            for r in range(p)]
    sized = {size: tuple(n * unit for n in nodes)}
    for cores in (None, SharedCores.ideal(p, p)):
        plain = simulate(name, p, m, _with(base, **{cost: s / unit}), cores)
        walked = simulate(name, p, m, _with(dataclasses.replace(base, **sized), **{cost: s / unit}), cores)
        assert [y - x for x, y in zip(plain.busy_s, walked.busy_s)] == pytest.approx(want, rel=1e-9, abs=1e-12)
    if name == "zbv":
        assert sum(want) == pytest.approx(m * s * sum(nodes), rel=1e-12)
    if name in ("gpipe", "1f1b", "interleaved_1f1b", "bitpipe"):
        assert sum(want) == 0.0
    else:
        assert sum(want) > 0
    with pytest.raises(PipelineError, match=size):
        simulate(name, p, m, _with(dataclasses.replace(base, **{size: sized[size][:-1]}), **{cost: s / unit}))


def test_bitpipes_exchange_bytes_pay_the_comm_threads_per_byte_on_each_copys_rank():
    """`copy_exchange_pack_s` (round 19): the 7 memory passes plus the communication threads' CPU for the rank's
    send of its copy's gradients and its receive of the twin's, 2 x bytes x beta; 0 per byte on the GPU presets."""
    from cost_model.hardware import A100_80GB
    from cost_model.pipeline_actions import CPU_PIPELINE_ACTION, copy_exchange_pack_s
    cpu = dataclasses.replace(A100_80GB, pipeline_action=CPU_PIPELINE_ACTION)
    beta = CPU_PIPELINE_ACTION.comm_thread_per_byte_s
    assert beta > 0 and A100_80GB.pipeline_action.comm_thread_per_byte_s == 0.0
    c = CPU_PIPELINE_ACTION.comm_thread_s
    assert copy_exchange_pack_s(52e6, cpu) == pytest.approx(7 * 52e6 / cpu.hbm_bytes_per_s + 2 * 52e6 * beta + 2 * c,
                                                             rel=1e-12)


def _cross_rank_ops(name: str, p: int, m: int, fwd_ops: tuple, bwd_ops: tuple) -> list[float]:
    """Per rank, the P2P ops its actions post at both ends of its cross-rank transfers, counted off the action lists
    and placement (as `_cross_rank_transfers`): a transfer across boundary k -> k+1 posts fwd_ops[k] ops on its
    sender and on its receiver, its gradient bwd_ops[k]."""
    sched = action_schedule(name, p, m)
    S, where = sched.num_stages, sched.stage_to_rank
    ops = [0.0] * p
    for r in range(p):
        for a in sched.actions[r]:
            x, k, kind = a.stage_index, a.stage_index % S, a.computation_type.value
            up = k < S - 1 and where[x + 1] != r  # a transfer with stage copy x + 1 (boundary k)
            down = k > 0 and where[x - 1] != r  # with x - 1 (boundary k - 1)
            if kind == "F":
                ops[r] += (fwd_ops[k] if up else 0.0) + (fwd_ops[k - 1] if down else 0.0)
            elif kind in ("B", "I"):
                ops[r] += (bwd_ops[k - 1] if down else 0.0) + (bwd_ops[k] if up else 0.0)
    return ops


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "interleaved_1f1b", "zbv", "dualpipev", "bitpipe"])
def test_comm_threads_pay_per_p2p_op_so_a_transfer_of_several_tensors_pays_each(name):
    """Round 20: `comm_thread_s` = c is gloo's threads' CPU per P2P op (calibrated per op), and a transfer of n
    tensors is n ops at each end (a GPT-2 cut carries the hidden states and the attention mask: 2 isends and 2
    irecvs per transfer, counted on both runners). With `StageTimes.p2p_ops` / `p2p_bwd_ops` each rank's busy
    time grows by exactly c x (its ops - its transfers) over one op per transfer (ops counted off the action
    lists, not the simulator's DAG), on its own core and sharing cores; BitPipe pays the library's figure with its
    own runner's costs. Closed form at p = 2 for gpipe / 1f1b with n_f and n_b ops: (m + 1)(F + B + c (n_f + n_b))."""
    p, m, c = 4, 8, 1e-3
    S = action_schedule(name, p, m).num_stages
    fwd, bwd = tuple(float(2 + k % 3) for k in range(S - 1)), tuple(float(1 + k % 2) for k in range(S - 1))
    base = StageTimes.uniform(S, 1.0, 0.5, 0.75)
    cost = dict(comm_thread_s=c, own_runner=PipelineActionCost())
    ones = _cross_rank_ops(name, p, m, (1.0,) * (S - 1), (1.0,) * (S - 1))
    assert ones == [float(s + r) for s, r in zip(*_cross_rank_transfers(name, p, m))]
    want = [c * (n - o) for n, o in zip(_cross_rank_ops(name, p, m, fwd, bwd), ones)]
    assert all(w > 0 for w in want)
    for cores in (None, SharedCores.ideal(p, p)):
        plain = simulate(name, p, m, _with(base, **cost), cores)
        assert plain.busy_s == simulate(name, p, m, _with(dataclasses.replace(
            base, p2p_ops=(1.0,) * (S - 1)), **cost), cores).busy_s  # one op per transfer: as before
        many = simulate(name, p, m, _with(dataclasses.replace(base, p2p_ops=fwd, p2p_bwd_ops=bwd), **cost), cores)
        assert [y - x for x, y in zip(plain.busy_s, many.busy_s)] == pytest.approx(want, rel=1e-9)
        assert many.makespan_s > plain.makespan_s
    if name in ("gpipe", "1f1b"):
        nf, nb = 2.0, 3.0
        two = StageTimes.uniform(2, 1.0, 0.5, 0.75)
        r = simulate(name, 2, m, _with(dataclasses.replace(two, p2p_ops=(nf,), p2p_bwd_ops=(nb,)), comm_thread_s=c))
        assert r.makespan_s == pytest.approx((m + 1) * (1.0 + 1.25 + c * (nf + nb)), rel=1e-12)
    for bad in ((2.0,) * S, (0.0,) * (S - 1)):
        with pytest.raises(PipelineError, match="p2p_ops"):
            simulate(name, p, m, _with(dataclasses.replace(base, p2p_ops=bad), **cost))


def test_bitpipes_exchange_pays_the_comm_threads_per_op_of_its_two_p2p_ops_and_nothing_without_gradients():
    """Round 20: the twin exchange is one isend and one irecv on each copy's rank (`runtime.bitpipe._start_exchange`),
    so `copy_exchange_pack_s` charges 2 x `comm_thread_s` beyond its bytes' cost (0 on the GPU presets); a copy
    without private gradients posts nothing and costs 0."""
    from cost_model.hardware import A100_80GB
    from cost_model.pipeline_actions import CPU_PIPELINE_ACTION, copy_exchange_pack_s
    cpu = dataclasses.replace(A100_80GB, pipeline_action=CPU_PIPELINE_ACTION)
    no_ops = dataclasses.replace(cpu, pipeline_action=dataclasses.replace(CPU_PIPELINE_ACTION, comm_thread_s=0.0))
    for nbytes in (8.0, 52e6):
        assert copy_exchange_pack_s(nbytes, cpu) - copy_exchange_pack_s(nbytes, no_ops) == pytest.approx(
            2 * CPU_PIPELINE_ACTION.comm_thread_s, rel=1e-9)
    assert copy_exchange_pack_s(0.0, cpu) == 0.0
    assert copy_exchange_pack_s(52e6, A100_80GB) == pytest.approx(7 * 52e6 / A100_80GB.hbm_bytes_per_s, rel=1e-12)
