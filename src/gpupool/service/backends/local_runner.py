"""The local backend's pod wrapper: runs one pod's command and records how it ended.

Usage (by the backend only): ``python -I -S local_runner.py POD_DIR [--rlimit-as BYTES] -- CMD...``

Why a wrapper: a pod must outlive the controller (a kill -9 or an upgrade of ``gpupool serve``
must not stop training), and once the controller is gone nobody can ``wait()`` for the pod: only
a process's parent learns its exit status. The wrapper is that parent. It is the leader of the
pod's process group (the backend starts it with setsid), starts the command in the same group,
and when the command ends writes ``exit.json`` atomically; a restarted backend reads the status
from there. It writes ``pid.json`` first, so a backend killed between starting a pod and saving
its pid still finds it.

Signals: the backend stops a pod by signalling the whole group. The wrapper catches SIGTERM (a
handler, not SIG_IGN: an ignored signal would stay ignored in the command after exec) and keeps
waiting, so the command's own exit status after SIGTERM is recorded. SIGKILL ends both.

It imports nothing from gpupool and starts with ``-I -S`` (no site packages): it runs once per
pod and must start fast and never depend on the environment it passes on.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time


def _write(path: str, data: dict[str, object]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _start_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
        return int(f.read().rpartition(")")[2].split()[19])


def _oom_kills() -> int:
    """The kernel's count of out-of-memory kills since boot (0 where it is not reported)."""
    try:
        with open("/proc/vmstat", encoding="ascii") as f:
            for line in f:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def main(argv: list[str]) -> int:
    pod_dir, rest = argv[1], argv[2:]
    if "--rlimit-as" in rest[: rest.index("--")]:
        limit = int(rest[rest.index("--rlimit-as") + 1])
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    cmd = rest[rest.index("--") + 1 :]
    pid = os.getpid()
    _write(os.path.join(pod_dir, "pid.json"), {"pid": pid, "ticks": _start_ticks(pid)})
    terminated: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: terminated.append(signum))
    signal.signal(signal.SIGINT, lambda signum, frame: terminated.append(signum))
    oom_before = _oom_kills()
    started = time.time()
    try:
        child = subprocess.Popen(cmd)
    except OSError as exc:
        print(f"gpupool: cannot run {cmd[0]!r}: {exc.strerror or exc}", file=sys.stderr, flush=True)
        _write(os.path.join(pod_dir, "exit.json"), {"returncode": 127, "error": str(exc)})
        return 0
    rc = child.wait()  # PEP 475: a SIGTERM runs the handler and the wait goes on
    _write(
        os.path.join(pod_dir, "exit.json"),
        {
            "returncode": rc,
            "terminated": bool(terminated),
            "oomKillsDuring": _oom_kills() - oom_before,
            "startedAt": started,
            "finishedAt": time.time(),
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
