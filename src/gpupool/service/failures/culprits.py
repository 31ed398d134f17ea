"""Isolating the workloads a scheduling cycle fails on, so one bad submission never stops the rest.

Why: the cycle decides for every pending workload at once, so an exception caused by one of them
(a bug the engine has not met yet, a shape no validator foresaw) used to fail every cycle for
every team until that workload was cancelled. The engine is deterministic, so the culprit can be
found by re-running the same decision on parts of the pending set: halves first (a few bad
workloads among thousands cost a few dozen trial cycles), and, when the failure only shows with
several workloads together, by growing a prefix until it appears. The culprits are then held out
of scheduling with the error as their reason; the others are decided as if they had never been
there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from gpupool.model import Workload

T = TypeVar("T")

#: at most this many trial cycles per search: past it the cycle fails as before (and is retried)
MAX_TRIALS = 256


def _describe(exc: BaseException) -> str:
    text = str(exc).splitlines()[0][:300] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class _Trials:
    """Runs trial cycles; after a failed one the caller's ``reset`` rebuilds clean state."""

    def __init__(self, run: Callable[[list[Workload]], object], reset: Callable[[], None]) -> None:
        self.run = run
        self.reset = reset
        self.count = 0

    def fails(self, ws: list[Workload]) -> BaseException | None:
        if self.count >= MAX_TRIALS:
            raise RuntimeError("isolation search exhausted its trial budget")
        self.count += 1
        try:
            self.run(ws)
        except Exception as exc:
            self.reset()
            return exc
        return None


def find_culprits(
    pending: Sequence[Workload],
    run: Callable[[list[Workload]], object],
    reset: Callable[[], None],
) -> dict[str, str]:
    """Names of the workloads whose presence makes ``run`` raise, each with the error text.

    ``pending`` is a set that is known to fail. ``run`` decides for a list of workloads and must
    leave no trace when it succeeds (the engine's cycle rolls back); ``reset`` restores clean
    state after a failed trial. Returns {} when the failure does not depend on the workloads
    (then it is not theirs to carry) or the trial budget runs out.
    """
    trials = _Trials(run, reset)
    bad: dict[str, str] = {}
    stack = [list(pending)]
    try:
        if trials.fails([]) is not None:  # it fails with no workload at all: not theirs
            return {}
        while stack:
            group = stack.pop()
            if len(group) == 1:
                exc = trials.fails(group)
                if exc is not None:
                    bad[group[0].name] = _describe(exc)
                continue
            mid = len(group) // 2
            halves = [h for h in (group[:mid], group[mid:]) if trials.fails(h) is not None]
            if halves:
                stack.extend(halves)
            else:  # it fails only with members of both halves together: grow a prefix
                _prefix_culprit(group, trials, bad)
    except RuntimeError:
        return bad
    return bad


def _prefix_culprit(group: list[Workload], trials: _Trials, bad: dict[str, str]) -> None:
    for i in range(2, len(group) + 1):
        exc = trials.fails(group[:i])
        if exc is not None:
            bad[group[i - 1].name] = _describe(exc)
            return


__all__ = ["MAX_TRIALS", "find_culprits"]
