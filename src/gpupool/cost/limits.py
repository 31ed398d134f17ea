"""How much history a planning answer needs, and what to say when there is less.

Why one place: ``report tco``, ``plan`` and ``profile`` each rest on a method with a known
appetite for data — a seasonal forecast needs two of its seasons to tell a rhythm from a trend,
a replay or a fitted percentile needs one daily cycle to have seen the daily peak — and on a
young install the history is shorter than that. Each command states the minimum it derives from
its method; ``Limit.check`` refuses (``HistoryTooShort``, a ``ValueError`` the CLI turns into
exit 2) or, when the user forces the answer or the command only warns, returns a warning that
the report carries in its summary and the CLI prints on stderr.
"""

from __future__ import annotations

from dataclasses import dataclass

DAY_S = 86400
WEEK_S = 7 * DAY_S


class HistoryTooShort(ValueError):
    """The history is shorter than the answer needs; the message states the minimum."""


def span(seconds: float) -> str:
    """A duration in the largest unit that keeps it readable (``15 min``, ``36 h``, ``3.5 d``)."""
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 3 * DAY_S:
        return f"{seconds / 3600:.1f} h".replace(".0 h", " h")
    return f"{seconds / DAY_S:.1f} d".replace(".0 d", " d")


@dataclass(frozen=True)
class Limit:
    """What one answer needs: ``minimum_s`` seconds of history, because of ``why``."""

    command: str  # as the user typed it, e.g. "report tco"
    minimum_s: float
    why: str  # the method's need, e.g. "two daily seasons of the Holt-Winters forecast"

    def message(self, have_s: float, since: str) -> str:
        return (
            f"{self.command}: the history covers {span(have_s)} ({since}); the answer needs at least"
            f" {span(self.minimum_s)} ({self.why})"
        )

    def check(self, have_s: float, since: str, force: bool, refuse: bool = True) -> str | None:
        """None when the history suffices; else raise, or (``force`` or not ``refuse``) return
        the warning to show with the answer."""
        if have_s >= self.minimum_s:
            return None
        text = self.message(have_s, since)
        if refuse and not force:
            raise HistoryTooShort(f"{text}; give --force to answer anyway, knowing it is a guess")
        return f"WARNING: {text}; treat the figures as a guess"


__all__ = ["DAY_S", "WEEK_S", "HistoryTooShort", "Limit", "span"]
