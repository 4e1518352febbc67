"""Which failed launches of `runtime.spawn` are re-run once (`runtime.rank_crash.rerun_reason`), without ranks."""
from parallelizer.runtime.rank_crash import STOPPED, describe_crash, describe_stuck, rerun_reason, signal_name

PEER = "Traceback ...\nRuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:5031."
ABORTED = describe_crash("signal SIGABRT", "Fatal Python error: Aborted")


def test_crash_signal_with_peers_that_lost_it_is_rerun():
    failures = {0: ABORTED, 1: PEER, 2: describe_stuck(STOPPED, "  File \"x.py\", line 3 in body"), 3: PEER}
    assert rerun_reason({0: "SIGABRT"}, failures, timed_out=False) == {0: "SIGABRT"}
    assert rerun_reason({1: "SIGSEGV"}, {1: ABORTED, 0: PEER}, timed_out=False) == {1: "SIGSEGV"}


def test_a_rank_that_raised_its_own_error_is_never_rerun():
    failures = {0: ABORTED, 1: "Traceback ...\nValueError: shapes (3,) and (4,) differ"}
    assert rerun_reason({0: "SIGABRT"}, failures, timed_out=False) == {}


def test_no_rerun_for_timeouts_exit_codes_or_kills_from_outside():
    assert rerun_reason({0: "SIGABRT"}, {0: ABORTED, 1: "timed out: no report"}, timed_out=True) == {}
    assert rerun_reason({}, {0: describe_crash("exit code 3", ""), 1: PEER}, timed_out=False) == {}
    assert rerun_reason({0: "SIGKILL"}, {0: describe_crash("signal SIGKILL", ""), 1: PEER}, timed_out=False) == {}
    # a crash signal on one rank, an exit code on another: not only a lost connection, so not re-run
    failures = {0: ABORTED, 1: describe_crash("exit code 1", "")}
    assert rerun_reason({0: "SIGABRT"}, failures, timed_out=False) == {}


def test_signal_names():
    assert signal_name(-6) == "SIGABRT" and signal_name(-11) == "SIGSEGV"
    assert signal_name(0) is None and signal_name(1) is None and signal_name(None) is None


def test_summary_line_of_a_crashed_rank_is_its_exit_not_its_quoted_stderr():
    """The one-line summary of a rank that died names the signal, not the last line of the stderr it quotes
    (faulthandler ends with "Extension modules: ...")."""
    from parallelizer.runtime.launch import _failure_message

    crashed = describe_crash("signal SIGABRT", "Fatal Python error: Aborted\n  File \"w.py\", line 3 in body\n"
                             "Extension modules: numpy, torch._C (total: 2)")
    text = _failure_message(print, 2, 10.0, {1: crashed, 0: PEER}, False)
    assert text.splitlines()[0].startswith("spawn(print, world_size=2) failed on rank 1: process exited with signal "
                                           "SIGABRT without a report"), text
    assert "Extension modules" not in text.splitlines()[0] and "Extension modules" in text  # quoted below
