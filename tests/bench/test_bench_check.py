"""bench/check.py (``make bench-check``): how today's CPU-time ratios are judged against the
committed baseline. The measuring itself is a benchmark, not a test; only the judging is here."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def _check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_check", REPO / "bench" / "check.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_check", mod)
    spec.loader.exec_module(mod)
    return mod


check = _check()


def test_a_ratio_beyond_the_tolerance_above_its_baseline_fails_and_says_by_how_much() -> None:
    lines, worse = check.compare({"a": 2.0, "b": 1.0}, {"a": 2.7, "b": 1.2}, 0.3)
    assert worse == ["a"]
    assert lines[0] == "a: 2.000 -> 2.700 (+35.0%, WORSE by more than 30%)"
    assert lines[1] == "b: 1.000 -> 1.200 (+20.0%, within tolerance)"


def test_a_ratio_well_below_its_baseline_passes_and_asks_for_a_new_baseline() -> None:
    lines, worse = check.compare({"a": 2.0}, {"a": 1.0}, 0.3)
    assert worse == []
    assert "-50.0%" in lines[0] and "--update" in lines[0]


def test_a_ratio_not_measured_or_not_in_the_baseline_is_said_not_failed() -> None:
    # the replay is skipped where ../shared/data is absent; a new ratio has no baseline yet
    lines, worse = check.compare({"replay": 3.0}, {"cli": 9.0}, 0.3)
    assert worse == []
    assert lines == ["cli: 9.000 (not in the baseline)", "replay: not measured this run (baseline 3.000)"]


def test_changed_decisions_are_named() -> None:
    said = check.changed_facts({"fp": "aa", "n": 5, "only_base": 1}, {"fp": "bb", "n": 5})
    assert said == ["fp: aa -> bb (decisions differ from the baseline's run)"]


def test_the_committed_baseline_holds_every_ratio_the_check_measures() -> None:
    base = json.loads((REPO / "bench" / "baseline.json").read_text())
    assert 0 < base["tolerance"] < 1
    names = {
        "engine_cycle_vs_first_fit",
        "replay_gpupool_vs_fifo",
        "replay_gpupool_vs_calibration",
        "cli_version_vs_python_start",
        "cli_get_refused_vs_python_start",
    }
    assert set(base["ratios"]) == names
    assert all(v > 0 for v in base["ratios"].values())
    assert base["taken"]["load_average"] and base["taken"]["commit"]


def test_a_missing_trace_is_a_clean_skip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = tmp_path / "examples" / "sim" / "philly.yaml"
    scenario.parent.mkdir(parents=True)
    text = (REPO / "examples" / "sim" / "philly.yaml").read_text()
    scenario.write_text(text)  # its relative path to the trace now leads nowhere
    monkeypatch.setattr(check, "PHILLY", scenario)
    assert check.prefix_scenario(100, tmp_path) is None
    assert "replay: skipped:" in capsys.readouterr().out
    assert check.measure_replay(100, 1.0) == ({}, {}, {})


def test_bench_check_is_a_make_target_outside_make_test() -> None:
    text = (REPO / "Makefile").read_text()
    assert "\nbench-check:" in text and "bench/check.py" in text
    test_recipe = text.split("\ntest:", 1)[1].split("\n\n", 1)[0]
    assert "bench" not in test_recipe
