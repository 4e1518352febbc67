"""Ranks that die by a signal: what they wrote before they died, and whether their launch is re-run.

Each rank of `runtime.spawn` writes its stderr (file descriptor 2) to its own file of a per-launch directory, with
`faulthandler` enabled on it: on SIGABRT, SIGSEGV, SIGBUS, SIGFPE or SIGILL the rank writes the Python stack of
every thread there, after whatever C/C++ code wrote (glibc's "malloc(): ...", "terminate called ..."). After the
launch the parent copies every rank's file to its own stderr (nothing a rank printed is lost; under pytest it lands
in the output of the test that launched it), and a rank that died without a report has the file's last lines in
its failure text.

A launch is re-run once (`rerun_reason`) when a rank died by a crash signal without a report and no rank raised
an error of its own: the other ranks only lost their connection to it ("Connection closed by peer", gloo's words)
or were stopped by the parent. A rank that raised is never a reason to re-run, nor a timeout, nor a rank that
exited with a code or was killed (SIGKILL: e.g. out of memory, which a second run repeats).

A rank the parent gives up on while it still runs (past the deadline, or blocked after another rank failed) is
first sent SIGUSR1: faulthandler writes its Python stacks, and its failure text quotes them (where it hung).
"""
from __future__ import annotations

import faulthandler
import os
import shutil
import signal
import sys
import tempfile
import time

# Signals of a crash inside native code; SIGKILL/SIGTERM come from outside (OOM killer, a user) and are not re-run.
RERUN_SIGNALS = (signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS)
# What a rank's collective raises when a peer process died (gloo's transport/tcp/pair.cc and the socket errors).
PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")
# How many of a dead rank's last stderr lines its failure text carries (faulthandler prints ~10 per thread).
TAIL_LINES = 80
# Where the quoted stderr lines start in a failure text (`describe_crash`, `describe_stuck`).
TAIL_HEAD = "\nits last lines on stderr"
STOPPED = "stopped: still running after another rank failed (probably blocked in a collective)"
# A rank still running when the parent gives up on it (deadline, or another rank failed) is sent this signal first;
# faulthandler then writes its Python stacks to its stderr, which its failure text quotes. Seconds to let it write.
STACKS_SIGNAL = signal.SIGUSR1
STACKS_WAIT_S = 1.0


class RankLogs:
    """A directory holding one stderr file per rank of one launch; `close()` removes it."""

    def __init__(self, world_size: int) -> None:
        self.root = tempfile.mkdtemp(prefix="parallelizer-ranks-")
        self.paths = [os.path.join(self.root, f"rank{rank}.stderr") for rank in range(world_size)]

    def tail(self, rank: int) -> str:
        """The last `TAIL_LINES` lines rank `rank` wrote to stderr ("" when none)."""
        try:
            with open(self.paths[rank], errors="replace") as f:
                lines = f.read().splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-TAIL_LINES:])

    def replay(self) -> None:
        """Copy every rank's stderr, in rank order, to this process's stderr."""
        sys.stderr.flush()
        for path in self.paths:
            try:
                with open(path, errors="replace") as f:
                    text = f.read()
            except OSError:
                continue
            if text:
                sys.stderr.write(text if text.endswith("\n") else text + "\n")
        sys.stderr.flush()

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def capture_stderr(path: str) -> None:
    """In a rank: send file descriptor 2 to `path` and enable faulthandler on it (all threads)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    sys.stderr.flush()
    os.dup2(fd, 2)
    os.close(fd)
    faulthandler.enable(file=sys.stderr, all_threads=True)
    faulthandler.register(STACKS_SIGNAL, file=sys.stderr, all_threads=True)


def dump_stacks(procs: list) -> None:
    """Ask each live rank process of `procs` for its Python stacks (`STACKS_SIGNAL`, written to its stderr by
    faulthandler) and give them `STACKS_WAIT_S` to write them."""
    asked = False
    for proc in procs:
        try:
            os.kill(proc.pid, STACKS_SIGNAL)
            asked = True
        except (OSError, TypeError):  # already gone, or never started
            pass
    if asked:
        time.sleep(STACKS_WAIT_S)


def signal_name(exitcode: int | None) -> str | None:
    """'SIGABRT' for a process ended by that signal (multiprocessing's exit code -6); None when it exited."""
    if exitcode is None or exitcode >= 0:
        return None
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"


def describe_crash(how: str, tail: str) -> str:
    """Failure text of a rank that ended `how` ("signal SIGABRT", "exit code 3") without a report."""
    text = f"process exited with {how} without a report"
    if tail.strip():
        text += f"{TAIL_HEAD} (faulthandler's Python stacks after a crash signal):\n{tail.rstrip()}"
    return text


def describe_stuck(failure: str, tail: str) -> str:
    """`failure` ("timed out ...", `STOPPED`) of a rank that was still running, with its last stderr lines."""
    if not tail.strip():
        return failure
    return f"{failure}{TAIL_HEAD} (faulthandler's Python stacks when the parent gave up on it):\n{tail.rstrip()}"


def rerun_reason(crashed: dict[int, str], failures: dict[int, str], timed_out: bool) -> dict[int, str]:
    """The ranks (-> signal name) that justify re-running the launch once (module docstring); {} when none do.

    `crashed`: rank -> signal name of each rank that died by a signal without a report; `failures`: rank -> failure
    text of every failed rank."""
    rerun = {r: name for r, name in crashed.items() if name in {s.name for s in RERUN_SIGNALS}}
    if timed_out or not rerun:
        return {}
    for rank, text in failures.items():
        if rank in rerun or text.startswith(STOPPED) or any(p in text for p in PEER_LOST):
            continue
        return {}  # this rank raised an error of its own, exited with a code or was killed from outside
    return rerun


def crash_warning(function: str, world_size: int, rerun: dict[int, str], failures: dict[int, str]) -> str:
    """Text of the RankCrashWarning of a re-run launch."""
    ranks = ", ".join(f"rank {r} by {name}" for r, name in rerun.items())
    parts = [f"spawn({function}, world_size={world_size}): {ranks} died without a report (no Python exception; "
             "the other ranks only lost their connection to it); the launch is re-run once. A second crash "
             "fails the launch."]
    parts += [f"--- rank {r} ---\n{failures[r].rstrip()}" for r in rerun]
    return "\n".join(parts)
