"""Collectives of parallelizer.rewriter.collectives on real gloo ranks, and the spawn launcher.

One spawn per world size runs every check (spawning costs 3.5-8 s on this machine kind); the checks
themselves live in distributed_workers.py, which spawned ranks import.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import warnings

import pytest
import torch
import torch.fx

import distributed_workers as W
from parallelizer.errors import RankCrashWarning
from parallelizer.rewriter import collectives as C
from parallelizer.runtime import DistributedError, init_from_env, shutdown, spawn

pytestmark = pytest.mark.distributed

LAYOUTS = {
    2: [[[0, 1]]],
    # the world, then the two axes of a 2x2 mesh: rows ("tp") and columns ("dp")
    4: [[[0, 1, 2, 3]], [[0, 1], [2, 3]], [[0, 2], [1, 3]]],
}


@pytest.mark.parametrize("world_size", sorted(LAYOUTS))
def test_collectives_match_single_process_reference(world_size):
    # a deadline, not a speed target: 4 ranks on a loaded 2-core machine (start-up included) may take minutes
    reports = spawn(W.run_all_checks, world_size, LAYOUTS[world_size], timeout_s=300)
    assert [report["rank"] for report in reports] == list(range(world_size))  # results in rank order
    failures = [f for report in reports for f in report["failures"]]
    assert not failures, "\n\n".join(failures)
    expected = 1 + len(W.CHECKS) * len(LAYOUTS[world_size])
    assert all(len(report["passed"]) == expected for report in reports), [r["passed"] for r in reports]


def test_failing_rank_is_named_without_hanging():
    """Rank 0 waits in a barrier rank 1 never reaches: spawn reports rank 1's failure when it happens, not at the
    deadline (the message would then read "timed out after 300 s"). The deadline is generous so that a loaded
    machine's slow start-up cannot reach it; half of it bounds the wall time (a hang would take all of it)."""
    start = time.monotonic()
    with pytest.raises(DistributedError) as info:
        spawn(W.raise_on_rank_one, 2, timeout_s=300)
    elapsed_s = time.monotonic() - start
    assert elapsed_s < 150, f"spawn took {elapsed_s:.1f} s to report a failed rank"
    assert "timed out" not in str(info.value).splitlines()[0], str(info.value)
    assert "failed on rank 1" in str(info.value)
    assert "deliberate failure on rank 1" in str(info.value)  # the rank's traceback is in the message
    assert "RuntimeError" in info.value.failures[1]


def test_rank_past_deadline_is_named_and_killed():
    start = time.monotonic()
    with pytest.raises(DistributedError) as info:
        spawn(W.sleep_on_rank_zero, 2, 600.0, timeout_s=4)
    elapsed_s = time.monotonic() - start
    # the rank would sleep 600 s unless killed at the deadline; the margin above the 4 s is for start-up on a
    # loaded machine (forking the ranks, the first launch's fork server), not a speed target
    assert elapsed_s < 60, f"spawn took {elapsed_s:.1f} s for a 4 s deadline"
    assert "timed out after 4 s" in str(info.value)
    assert 0 in info.value.failures and "timed out" in info.value.failures[0]
    assert "in sleep_on_rank_zero" in info.value.failures[0]  # where it was: faulthandler's stack (SIGUSR1)


def test_crashed_rank_is_named_with_its_signal():
    """A rank that aborts in every run: the launch is re-run once (warned), then fails naming the rank, the signal
    and the rank's Python stack at the abort (faulthandler's, from the rank's stderr)."""
    with pytest.warns(RankCrashWarning, match="rank 1 by SIGABRT") as warned:
        with pytest.raises(DistributedError) as info:
            spawn(W.abort_on_rank_one, 2, timeout_s=120)
    assert len(warned) == 1 and warned[0].message.ranks == {1: "SIGABRT"}
    assert "failed on rank 1: process exited with signal SIGABRT" in str(info.value).splitlines()[0]
    assert "second run" in str(info.value)
    assert "signal SIGABRT" in info.value.failures[1]
    assert "Fatal Python error: Aborted" in info.value.failures[1]
    assert "in abort_on_rank_one" in info.value.failures[1]  # the stack names the function that aborted


def test_rank_aborted_once_is_rerun_and_warned(tmp_path):
    """A rank that dies by SIGABRT without a report while the other only loses its connection: the launch is
    re-run once, with a RankCrashWarning naming the rank, the signal, its stack and the re-run, and returns the
    re-run's results."""
    marker = str(tmp_path / "aborted")
    with pytest.warns(RankCrashWarning) as warned:
        assert spawn(W.abort_on_first_launch, 2, marker, timeout_s=120) == [0, 1]
    text = str(warned[0].message)
    assert len(warned) == 1 and warned[0].message.ranks == {1: "SIGABRT"}, text
    assert "rank 1 by SIGABRT" in text and "re-run once" in text and "in abort_on_first_launch" in text, text
    assert sorted(open(marker + ".launches").read().split()) == ["0", "0", "1", "1"]  # two launches of 2 ranks


def test_rank_that_raised_is_never_rerun(tmp_path):
    """A rank that raised a Python exception fails the launch at once: no re-run, no RankCrashWarning."""
    marker = str(tmp_path / "raised")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RankCrashWarning)
        with pytest.raises(DistributedError, match="deliberate failure on rank 1"):
            spawn(W.raise_on_rank_one_counted, 2, marker, timeout_s=120)
    assert sorted(open(marker + ".launches").read().split()) == ["0", "1"]  # one launch


def test_taken_rendezvous_port_is_retried(monkeypatch):
    """Another process binding the chosen port before rank 0 does must not fail the run."""
    from parallelizer.runtime import launch

    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        ports = [squatter.getsockname()[1]]
        real_free_port = launch._free_port
        monkeypatch.setattr(launch, "_free_port", lambda: ports.pop() if ports else real_free_port())
        assert spawn(W.sleep_on_rank_zero, 1, 0.0, timeout_s=120) == [0]
        assert not ports  # the taken port was really tried first


def test_ranks_take_the_environment_of_their_launch(monkeypatch):
    """Ranks are forks of a server started at the first launch (`runtime.launch`); each launch still hands its
    ranks the caller's environment as it is then: a variable set or removed after the server started."""
    monkeypatch.setenv("PARALLELIZER_TEST_VAR", "first")
    assert spawn(W.read_environ, 2, "PARALLELIZER_TEST_VAR", timeout_s=120) == ["first", "first"]
    monkeypatch.setenv("PARALLELIZER_TEST_VAR", "second")
    assert spawn(W.read_environ, 2, "PARALLELIZER_TEST_VAR", timeout_s=120) == ["second", "second"]
    monkeypatch.delenv("PARALLELIZER_TEST_VAR")
    assert spawn(W.read_environ, 1, "PARALLELIZER_TEST_VAR", timeout_s=120) == [None]


def test_ranks_leak_no_semaphores():
    """A rank that ran an fx Interpreter (tqdm's multiprocessing lock) exits without the resource tracker
    reporting "leaked semaphore objects" when the launching process ends."""
    script = "import distributed_workers as W\nfrom parallelizer.runtime import spawn\n" \
             "if __name__ == '__main__':\n    print(spawn(W.run_fx_interpreter, 2, timeout_s=120))\n"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(W.__file__), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0 and done.stdout.strip() == "[0, 1]", done.stderr
    assert "leaked semaphore" not in done.stderr, done.stderr


def test_graph_module_code_shows_collectives():
    """Codegen and recompile of a GraphModule whose nodes call the collectives (no process group needed)."""
    ranks = [0, 1]
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    steps = [
        (C.local_slice, (0, ranks)), (C.all_gather, (0, ranks)), (C.all_gather_rs, (1, ranks)),
        (C.reduce_scatter, (1, ranks)), (C.all_reduce, (ranks,)), (C.grad_all_reduce, (ranks,)),
        (C.all_to_all, (0, 1, ranks)),
    ]
    node = x
    for fn, args in steps:
        node = graph.call_function(fn, (node, *args))
    graph.output(node)
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    gm.recompile()
    code = gm.code
    for fn, args in steps:
        assert f"parallelizer_rewriter_collectives_{fn.__name__}(" in code, code
    assert "parallelizer_rewriter_collectives_all_to_all(grad_all_reduce, 0, 1, [0, 1])" in code, code
    assert [n.target for n in gm.graph.nodes if n.op == "call_function"] == [fn for fn, _ in steps]
    traced = torch.fx.symbolic_trace(W.MegatronMLP(ranks))
    targets = [n.target for n in traced.graph.nodes if n.op == "call_function"]
    assert C.grad_all_reduce in targets and C.all_reduce in targets


def test_collectives_need_a_process_group():
    with pytest.raises(DistributedError, match="not initialised"):
        C.all_reduce(torch.zeros(2), [0, 1])


def test_init_from_env_single_rank(monkeypatch):
    """torchrun-style start in this process with a world of one; the collectives work on it."""
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}.items():
        monkeypatch.setenv(name, value)
    try:
        for attempt in range(3):  # the free port can be taken by another process before we bind it
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                monkeypatch.setenv("MASTER_PORT", str(sock.getsockname()[1]))
            try:
                info = init_from_env(timeout_s=30)
                break
            except torch.distributed.DistNetworkError:
                if attempt == 2:
                    raise
        assert (info.rank, info.world_size, info.backend) == (0, 1, "gloo")
        x = torch.arange(4.0, requires_grad=True)
        y = C.all_gather(C.all_reduce(x, [0]), 0, [0])
        y.sum().backward()
        assert torch.equal(y, torch.arange(4.0)) and torch.equal(x.grad, torch.ones(4))
    finally:
        shutdown()
    shutdown()  # a second call is a no-op


def test_init_from_env_names_missing_variables(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(DistributedError, match="RANK.*torchrun"):
        init_from_env()
