"""Which manifests ``gpupool validate`` checks together: the configuration, and each simulator
scenario with the cluster files it names, as sets of their own.

Why separate sets: a Scenario (``gpupool sim``) describes a hypothetical cluster, a what-if
beside the real one, so its cluster files reuse the real queue names on purpose (the same teams,
other hardware). Checked together with ``examples/cluster`` they would be "duplicates"; checked
as their own set, each is what ``gpupool sim`` and ``gpupool apply`` will actually load.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from gpupool.cli.files import STDIN, FileProblem, expand, read_text
from gpupool.manifests import safe_yaml


@dataclass(slots=True)
class ValidationSets:
    """The configuration's files, and per scenario file the cluster files it loads."""

    config: list[Path] = field(default_factory=list)
    scenarios: dict[Path, list[Path]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def _scenario_files(path: Path, text: str) -> list[Path] | None:
    """The cluster files a Scenario document names, or None when ``text`` is no scenario."""
    try:
        raw = next((d for d in safe_yaml.load_all(text) if d is not None), None)
    except yaml.YAMLError:
        return None
    if not isinstance(raw, dict) or raw.get("kind") != "Scenario":
        return None
    files = ((raw.get("spec") or {}).get("cluster") or {}).get("files") or []
    return [(path.parent / str(f)).resolve() for f in files]


def validation_sets(files: Iterable[Path]) -> ValidationSets:
    """Split the files into the configuration and the scenarios (each scenario checked too)."""
    from gpupool.sim.scenario import SimInputError, parse_scenario

    given = list(files)
    out = ValidationSets()
    paths = expand(given)
    texts = {p: read_text(p) for p in paths if str(p) != STDIN}
    for p, text in texts.items():
        named = _scenario_files(p, text)
        if named is None:
            continue
        try:
            parse_scenario(text, str(p), p.resolve().parent)
        except SimInputError as exc:
            out.problems += exc.errors
        out.scenarios[p] = named
    in_scenarios = {f for fs in out.scenarios.values() for f in fs}
    out.config = [p for p in paths if p not in out.scenarios and p.resolve() not in in_scenarios]
    if not out.config and not out.scenarios:
        raise FileProblem("no manifests found in " + ", ".join(map(str, given)))
    return out
