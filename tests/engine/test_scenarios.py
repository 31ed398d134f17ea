"""Scenario tests written as YAML (tests/scenarios/*.yaml)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.scenario_runner import HERE, load_scenario, run_scenario

SCENARIOS = sorted(p for p in HERE.glob("*.yaml") if not p.name.startswith("_"))


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario(path: Path) -> None:
    run_scenario(load_scenario(path))


def test_every_scenario_topic_is_covered() -> None:
    names = {p.stem for p in SCENARIOS}
    assert {
        "borrowing",
        "lending_limit",
        "reclaim",
        "priority_preemption",
        "gang_fragments",
        "fractional",
        "topology",
        "fair_share",
        "fair_share_equal",
        "strict_vs_besteffort",
    } <= names
