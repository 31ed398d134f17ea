"""Processes of the local backend: starting a pod, telling whether it still lives, how it ended.

Why pid *and* start time: pids are reused. A restarted backend that found pid 4242 alive would
otherwise adopt whatever process now has that number, report a stranger's exit as the pod's, and
signal it on stop. ``/proc/<pid>/stat`` gives each process's start time in clock ticks since
boot; a pid whose start time differs from the one recorded at start is another process, and the
pod it was is treated as gone (its status then comes from the wrapper's ``exit.json``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RUNNER = str(Path(__file__).with_name("local_runner.py"))

#: the parts of the server's environment a pod inherits; the rest (database URLs, tokens) stays
#: in the server. A pod group's ``env`` adds to these.
PASS_ENV = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "TMPDIR",
    "LD_LIBRARY_PATH",
    "CUDA_HOME",
    "CUDA_PATH",
    "HF_HOME",
)


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks since boot) of a process, None when there is none."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return None
    return (fields[0], int(fields[19])) if len(fields) > 19 else None


def start_ticks(pid: int) -> int | None:
    """The process's start time (clock ticks since boot), None when it is gone."""
    st = _stat(pid)
    return None if st is None else st[1]


def alive(pid: int | None, ticks: int | None) -> bool:
    """Whether ``pid`` is still the process that was started (not a reused number, not a zombie).

    A zombie that is this process's child (a pod started by this very backend process) is
    reaped here, so an exited pod never lingers in the process table."""
    if pid is None or ticks is None:
        return False
    st = _stat(pid)
    if st is None or st[1] != ticks:
        return False
    if st[0] in ("Z", "X"):
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        return False
    return True


def signal_group(pgid: int, sig: int) -> bool:
    """Signal a pod's process group; False when the group no longer exists."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:  # the number now belongs to someone else's group: not ours
        return False
    return True


def free_port() -> int:
    """A TCP port free on the loopback now (the gang's MASTER_PORT)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def base_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: os.environ[k] for k in PASS_ENV if k in os.environ}
    env.update(extra or {})
    return env


@dataclass(frozen=True, slots=True)
class Launch:
    """One pod to start: its command, environment, directory and log."""

    command: Sequence[str]
    env: Mapping[str, str]
    cwd: str | None
    pod_dir: Path
    log: Path
    rlimit_as: int | None = None


def spawn(p: Launch) -> subprocess.Popen[bytes]:
    """Start the wrapper for one pod in a new session (its own process group)."""
    p.pod_dir.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-I", "-S", RUNNER, str(p.pod_dir)]
    if p.rlimit_as:
        argv += ["--rlimit-as", str(p.rlimit_as)]
    argv += ["--", *p.command]
    with open(p.log, "ab") as log:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(p.env),
            cwd=p.cwd,
            start_new_session=True,
            close_fds=True,
        )


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


@dataclass(frozen=True, slots=True)
class Ending:
    """How one pod ended, as the controller's failure policy reads it."""

    succeeded: bool
    message: str
    exit_code: int | None = None
    reason: str = ""


def ending(status: Mapping[str, Any] | None) -> Ending:
    """A pod's ``exit.json`` as an outcome; signal deaths and out-of-memory kills are named.

    Exit codes follow the shells' and Kubernetes' convention: death by signal N is 128+N (137
    for SIGKILL). A SIGKILL while the kernel's out-of-memory kill count went up is reported as
    OOMKilled (without a cgroup per pod this is the best evidence the host gives)."""
    if status is None:
        return Ending(
            False, "the pod ended without recording its exit status (its wrapper was killed)", None, "Lost"
        )
    rc = int(status.get("returncode", 1))
    if rc == 0:
        return Ending(True, "exited with code 0")
    if "error" in status:
        return Ending(False, f"could not start the command: {status['error']}", rc, "StartError")
    if rc < 0 or (rc > 128 and rc - 128 in signal.valid_signals()):
        sig = -rc if rc < 0 else rc - 128
        name = signal.Signals(sig).name if sig in signal.valid_signals() else f"signal {sig}"
        code = 128 + sig
        if sig == signal.SIGKILL and int(status.get("oomKillsDuring", 0)) > 0:
            return Ending(False, f"killed by {name} (exit {code}): out of memory", code, "OOMKilled")
        if sig == signal.SIGKILL:
            why = "the out-of-memory killer or an outside kill -9"
            return Ending(False, f"killed by {name} (exit {code}): {why}", code, "Killed")
        return Ending(False, f"terminated by {name} (exit {code})", code, "Signaled")
    return Ending(False, f"exited with code {rc}", rc, "Error")


def terminate(pgid: int) -> None:
    """First step of a stop: SIGTERM to the group (SIGKILL follows after the grace period)."""
    with contextlib.suppress(OSError):
        signal_group(pgid, signal.SIGTERM)


__all__ = [
    "PASS_ENV",
    "Ending",
    "Launch",
    "alive",
    "base_env",
    "ending",
    "free_port",
    "read_json",
    "signal_group",
    "spawn",
    "start_ticks",
    "terminate",
]
