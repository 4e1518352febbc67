"""Pipeline schedules vs published closed forms (benchmarks/RESULTS.md "Schedules vs published closed forms";
pinned in tests/unit/test_simulate.py). Pure simulation, no ranks: prints the markdown tables.

DualPipeV: DeepSeek-V3 report Table 2 / github.com/deepseek-ai/DualPipe README, bubble (PP/2 - 1)(F&B + B - 3W),
activations PP + 1 (PP = 2p stages). `atomic_pairs` schedules DeepSeek's `DualPipeV.step` order (transcribed in
`deepseek_dualpipev`, dualpipe/dualpipev.py @ 3da1bbe) with an independent event scheduler where an overlapped
F&B pair waits for both inputs (DeepSeek's runtime) or each half only for its own (torch's runtime).
ZB-H1 (Qi et al. ICLR 2024 Sec. 3.1): (p - 1)(F + I - W). Interleaved: Korthikanti et al. 2022 Sec. 4.2.3.
BitPipe: the bound (p/2 - 1)(F + B) derived in `planner.schedules.bitpipe_bubble_bound_s` (round 18; the paper's
own bubble table, arXiv 2410.19367, could still not be read here, so this row is derived, not published).
"""
from collections import deque
from torch.distributed.pipelining.schedules import _Action, _ComputationType as T
from parallelizer.planner.action_schedule import ActionSchedule
import os

from parallelizer.planner.schedules import bitpipe_bubble_bound_s
from parallelizer.planner.simulate import StageTimes, simulate, simulate_actions


def deepseek_dualpipev(p, m):
    lists = {}
    for r in range(p):
        st = (r, 2 * p - 1 - r)
        fc, bc, wq, out = [0, 0], [0, 0], deque(), []

        def F(ph):
            out.append(_Action(st[ph], T.FORWARD, fc[ph])); fc[ph] += 1

        def B(ph, zb=False):
            i = bc[ph]; bc[ph] += 1
            if zb:
                out.append(_Action(st[ph], T.BACKWARD_INPUT, i)); wq.append(_Action(st[ph], T.BACKWARD_WEIGHT, i))
            else:
                out.append(_Action(st[ph], T.FULL_BACKWARD, i))

        def Wc():
            out.append(wq.popleft())
        for _ in range((p - r - 1) * 2): F(0)
        for _ in range(r + 1): F(0); F(1)
        for _ in range(p - r - 1): B(1, True); Wc(); F(1)
        for i in range(m - 2 * p + r + 1):
            F(0); B(1)          # i == 0 on the last rank: not overlapped, same order
            F(1); B(0)
        for _ in range(p - r - 1): B(1); F(1); B(0)
        zb = False
        for i in range(r + 1):
            if i == (r + 1) // 2 and r % 2 == 1: zb = True
            B(1, zb)
            if i == (r + 1) // 2 and r % 2 == 0: zb = True
            B(0, zb)
        for _ in range(p - r - 1): Wc(); B(0, True)
        for _ in range(r + 1): Wc()
        assert not wq, r
        lists[r] = tuple(out)
    placement = {s: (s if s < p else 2 * p - 1 - s) for s in range(2 * p)}
    return ActionSchedule("deepseek_dualpipev", lists, placement, 2 * p, m)


def atomic_pairs(p, m, f, i, w, pairs=True):
    """Independent event scheduler on DeepSeek's list where each _forward_backward_chunk (F then B) is ONE
    block that starts only when both inputs are there (DeepSeek's step: recv both, wait, then compute);
    pairs=False: each action waits only its own input (torch's runtime). Returns the makespan - busy."""
    sched = deepseek_dualpipev(p, m)
    dur = {"F": f, "I": i, "W": w, "B": i + w}
    S = 2 * p
    # the pair structure: an F immediately followed by a B (not I) on a rank, inside the main steps
    blocks = {}
    for r, acts in sched.actions.items():
        bl, k = [], 0
        while k < len(acts):
            a = acts[k]
            if pairs and a.computation_type.value == "F" and k + 1 < len(acts) and acts[k + 1].computation_type.value == "B":
                bl.append((a, acts[k + 1])); k += 2
            else:
                bl.append((a,)); k += 1
        blocks[r] = bl
    done, pos, t_rank = {}, {r: 0 for r in blocks}, {r: 0.0 for r in blocks}

    def dep(a):
        x, c, mb = a.stage_index, a.computation_type.value, a.microbatch_index
        if c == "F":
            return [(x - 1, "F", mb)] if x > 0 else []
        if c == "W":
            return [(x, "I", mb)]
        return [(x, "F", mb)] + ([(x + 1, "IB", mb)] if x < S - 1 else [])

    def ready(key):
        x, c, mb = key
        if c == "IB":
            return done.get((x, "I", mb), done.get((x, "B", mb)))
        return done.get(key)
    progress = True
    while progress:
        progress = False
        for r in blocks:
            if pos[r] == len(blocks[r]):
                continue
            blk = blocks[r][pos[r]]
            inside = {(a.stage_index, a.computation_type.value, a.microbatch_index) for a in blk}
            need = [d for a in blk for d in dep(a) if d not in inside]
            times = [ready(d) for d in need]
            if any(t is None for t in times):
                continue
            t = max([t_rank[r]] + times)
            for a in blk:
                t += dur[a.computation_type.value]
                done[(a.stage_index, a.computation_type.value, a.microbatch_index)] = t
            t_rank[r] = t
            pos[r] += 1
            progress = True
    assert all(pos[r] == len(blocks[r]) for r in blocks), "deadlock"
    return max(t_rank.values()) - 2 * m * (f + i + w)


def authors_zbv(path, p, m, f, i, w, sc=1000):
    """The ZB authors' own ZB-V list (sail-sg/zero-bubble-pipeline-parallelism,
    megatron/core/pipeline_parallel/zerobubble/scheduler/zbv.py, `PipelineGraph.try_v_schedule`, best of its four
    fill options as `create_schedule` picks; memory as their runtime's 34h / -2h / -32h per F / B / W, 1F1B's
    limit) as an ActionSchedule, and the authors' own bubble estimate (max idle after each rank's first action)."""
    src = "\n".join(line for line in open(path).read().splitlines() if not line.startswith("from megatron"))
    ns = {}
    exec(compile(src, path, "exec"), ns)
    g = ns["PipelineGraph"](p, m, int(f * sc), int(i * sc), int(w * sc), 0, f_mem=34, b_mem=-2, w_mem=-32)
    best = min((g.try_v_schedule(fill_f=ff, fill_b=fb) for fb in (True, False) for ff in (True, False)),
               key=lambda t: t[2])
    lists = {}
    for r in range(p):
        acts = []
        for cat, ch, mb in best[0][r]:
            chunk = ch if cat == 0 else 1 - ch  # their B / W chunk index runs backwards (create_schedule)
            kind = (T.FORWARD, T.BACKWARD_INPUT, T.BACKWARD_WEIGHT)[cat]
            acts.append(_Action(r if chunk == 0 else 2 * p - 1 - r, kind, mb))
        lists[r] = tuple(acts)
    placement = {s: (s if s < p else 2 * p - 1 - s) for s in range(2 * p)}
    return ActionSchedule("authors_zbv", lists, placement, 2 * p, m), best[2] / sc


def after_start(res):
    """Max over ranks of the idle between a rank's first action and its last (the ZB authors' bubble measure)."""
    return max(acts[-1][2] - acts[0][1] - res.busy_s[r] for r, acts in res.timeline().items())


if __name__ == "__main__":
    print("| schedule | p | m | F, I, W | published form | published | simulated (torch's runtime) | DeepSeek runtime (pairs atomic) |")
    print("|---|---|---|---|---|---|---|---|")
    for p, m in ((4, 10), (8, 16)):
        for f, i, w in ((1, 1, 1), (1, 1, 0.5), (1, 2, 1), (2, 1, 1), (1, 0.5, 1.5)):
            t = StageTimes.uniform(2 * p, f, i, w)
            dv, zb = simulate("dualpipev", p, m, t).bubble_s, simulate("zbv", p, m, t).bubble_s
            closed = (p - 1) * ((f + i + w) + (i + w) - 3 * w)
            print(f"| dualpipev | {p} | {m} | {f}, {i}, {w} | (PP/2-1)(F&B+B-3W) | {closed:g} | {dv:g} | {atomic_pairs(p, m, f, i, w):g} |")
            print(f"| zbv | {p} | {m} | {f}, {i}, {w} | ZB-H1 (p-1)(F+I-W) | {(p - 1) * (f + i - w):g} | {zb:g} | - |")
    print()
    print("| schedule | p | m | published activations | published | simulated peak |")
    print("|---|---|---|---|---|---|")
    for p, m in ((2, 4), (4, 8), (8, 16), (16, 32)):
        t = StageTimes.uniform(2 * p, 1, 1, 1)
        dv = simulate("dualpipev", p, m, t).peak_inflight_bytes
        zb = simulate("zbv", p, m, t).inflight_microbatches
        il = simulate("interleaved_1f1b", p, m, t).peak_inflight_bytes[0]
        one = simulate("1f1b", p, m, StageTimes.uniform(p, 1, 1, 1)).inflight_microbatches[0]
        print(f"| dualpipev | {p} | {m} | PP + 1 stage-mb (PP = 2p), every rank | {2 * p + 1} | {min(dv):g}-{max(dv):g} |")
        print(f"| zbv | {p} | {m} | 1x 1F1B (rank-mb, max rank) | {one:g} | {max(zb):g} |")
        print(f"| interleaved_1f1b | {p} | {m} | L(1+(p-1)/(pv)) layer-mb, rank 0, L = 2p | {2 * p * (1 + (p - 1) / (2 * p)):g} | {il:g} |")
    print()
    print("| schedule | p | m | F, B | derived bound (p/2-1)(F+B) (not the paper's table) | simulated bubble |")
    print("|---|---|---|---|---|---|")
    for p, m in ((4, 4), (4, 8), (8, 8), (8, 16)):
        for f, b in ((1, 1), (1, 2), (2, 1)):
            sim = simulate("bitpipe", p, m, StageTimes.uniform(2 * p, f, b / 2, b / 2)).bubble_s
            print(f"| bitpipe | {p} | {m} | {f}, {b} | {bitpipe_bubble_bound_s(p, m, f, b):g} | {sim:g} |")
    zb = os.environ.get("SAIL_ZBV_PY")  # path to the ZB authors' zbv.py (a checkout of their repository)
    if zb:
        print()
        print("| p | m | F, I, W | authors' ZB-V list: step bubble / after-start (their estimate) | torch zbv | dualpipev |")
        print("|---|---|---|---|---|---|")
        for p, m in ((4, 8), (8, 16)):
            for t in ((1, 1, 1), (2, 1, 1), (1, 2, 1), (1, 1, 0.5), (1, 0.5, 1.5)):
                sched, est = authors_zbv(zb, p, m, *t)
                st = StageTimes.uniform(2 * p, *t)
                a, z, d = simulate_actions(sched, st), simulate("zbv", p, m, st), simulate("dualpipev", p, m, st)
                print(f"| {p} | {m} | {t[0]}, {t[1]}, {t[2]} | {a.bubble_s:g} / {after_start(a):g} ({est:g}) | "
                      f"{z.bubble_s:g} / {after_start(z):g} | {d.bubble_s:g} / {after_start(d):g} |")
