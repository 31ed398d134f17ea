"""The "first bind N s after process start" line is this replica's own (issue 23: a standby
logged a first bind the leader made)."""

from __future__ import annotations

from typing import Any

from gpupool.kube.wiring import FirstBind


def _bound(name: str) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ml", "name": name, "annotations": {"gpupool.io/workload": "w"}},
        "spec": {"nodeName": "n0"},
    }


def test_a_standby_never_takes_the_leaders_bind_for_its_own() -> None:
    leading = [False]
    fb = FirstBind(leading=lambda: leading[0])
    fb.mark_synced([_bound("before")])
    fb.on_pod("MODIFIED", _bound("by-the-leader"))
    assert fb.seconds is None
    leading[0] = True
    fb.on_pod("MODIFIED", _bound("before"))  # bound before this process led: not its bind
    assert fb.seconds is None
    fb.on_pod("MODIFIED", _bound("mine"))
    assert fb.seconds is not None


def test_the_bench_reads_only_the_restarted_servers_own_line(tmp_path: Any) -> None:
    from gpupool.bench.kube import _first_bind_logged

    log = tmp_path / "serve.log"
    log.write_text("first bind 3.10 s after process start (ml/a)\n")
    offset = log.stat().st_size
    assert _first_bind_logged(log, offset) is None  # the new server has not logged yet
    with log.open("a") as f:
        f.write("kubernetes: connecting\nfirst bind 7.25 s after process start (ml/b)\n")
    assert _first_bind_logged(log, offset) == 7.25
    assert _first_bind_logged(log) == 7.25
