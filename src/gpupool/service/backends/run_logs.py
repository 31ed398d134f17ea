"""Each attempt's output, kept apart: what a backend offers the logs API.

Why per attempt: a workload that failed and was retried has had several runs, and the run that
failed is the one a user needs to read (``kubectl logs --previous``). A backend that keeps
output exposes a ``run_logs`` attribute with the narrow interface ``RunLogs``: which attempts
(numbered 1, 2, ... as the workload's history counts its starts) have logs for which pods, and
each one's bytes as a file. The local backend keeps files (``FileLogs``, one directory per
attempt); the virtual cluster, which runs no processes, has one synthetic line per attempt
(``SyntheticLogs``) so the path can be tried without GPUs.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

#: how much is read from the end at a time when looking for the last lines
_BLOCK = 64 << 10


@dataclass(frozen=True)
class AttemptLog:
    """One attempt of a workload and the pods (ranks) that have output in it."""

    attempt: int
    pods: tuple[int, ...]

    def view(self) -> dict[str, Any]:
        return {"attempt": self.attempt, "pods": list(self.pods)}


class RunLogs(Protocol):
    """What the logs API needs of a backend's logs."""

    def attempts(self, name: str) -> list[AttemptLog]:
        """The workload's attempts that have logs, oldest first."""
        ...

    def open(self, name: str, attempt: int, pod: int) -> IO[bytes]:
        """The output of one pod of one attempt (which ``attempts`` lists), readable from 0."""
        ...


class FileLogs:
    """The local backend's layout: ``ROOT/NAME/ATTEMPT/pod-RANK.log`` (ROOT is ``STATE/runs``).

    The directory of an attempt is written before its processes start and never reused, so
    earlier attempts stay where they were written (the layout is the one the backend always had).
    """

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, name: str, attempt: int, pod: int) -> Path:
        return self.root / name / str(attempt) / f"pod-{pod}.log"

    def attempts(self, name: str) -> list[AttemptLog]:
        base = self.root / name
        if "/" in name or name in ("", ".", "..") or not base.is_dir():
            return []
        found: list[AttemptLog] = []
        for d in base.iterdir():
            if not d.name.isdigit():
                continue
            ranks = [p.stem.removeprefix("pod-") for p in d.glob("pod-*.log")]
            pods = tuple(sorted(int(r) for r in ranks if r.isdigit()))
            if pods:
                found.append(AttemptLog(int(d.name), pods))
        return sorted(found, key=lambda a: a.attempt)

    def open(self, name: str, attempt: int, pod: int) -> IO[bytes]:
        return open(self.path(name, attempt, pod), "rb")


class SyntheticLogs:
    """The virtual cluster's stand-in: one line per attempt, made from what the backend knows.

    ``starts(name)`` is how many times the workload was started; ``line(name, attempt)`` is the
    line of one attempt (the backend says where the latest one runs).
    """

    def __init__(self, starts: Callable[[str], int], line: Callable[[str, int], str]) -> None:
        self._starts = starts
        self._line = line

    def attempts(self, name: str) -> list[AttemptLog]:
        return [AttemptLog(a, (0,)) for a in range(1, self._starts(name) + 1)]

    def open(self, name: str, attempt: int, pod: int) -> IO[bytes]:
        return io.BytesIO((self._line(name, attempt) + "\n").encode())


def last_lines(f: IO[bytes], n: int, max_bytes: int | None = None) -> bytes:
    """The last ``n`` lines of a seekable file (a last line without a newline counts), read
    from the end in blocks, so a log of gigabytes costs what its tail costs; reading stops after
    ``max_bytes`` (then fewer lines come back). Leaves the file at the end it measured, where a
    follow goes on reading."""
    end = f.seek(0, os.SEEK_END)
    pos, buf = end, b""
    while n > 0 and pos > 0 and (max_bytes is None or len(buf) < max_bytes):
        step = min(_BLOCK, pos)
        pos -= step
        f.seek(pos)
        buf = f.read(step) + buf
        # a trailing newline ends the last line; it does not start another one
        if buf.removesuffix(b"\n").count(b"\n") >= n:
            break
    f.seek(end)
    body = buf.removesuffix(b"\n")
    cut = len(body)
    for _ in range(n):
        cut = body.rfind(b"\n", 0, cut)
        if cut < 0:
            return buf if n > 0 else b""
    return buf[cut + 1 :]
