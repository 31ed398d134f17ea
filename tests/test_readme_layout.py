"""The README's layout table stays true: every path it names exists, and every package and module
directly under ``src/gpupool/`` has a row.

Why a test: the table is where a newcomer starts, and it went stale twice as packages were
added (``cost/``, ``discovery/``) and flat modules became folders (``cli/client/``); a table that
names a missing path, or leaves a package out, now fails here instead of misleading a reader.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src" / "gpupool"


def layout_paths(readme: str) -> list[str]:
    """The backticked paths of the first column of the table under ``## Layout``."""
    section = readme.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    assert rows, "no layout table under ## Layout"
    return [p for row in rows for p in re.findall(r"`([^`]+)`", row.split("|")[1])]


def resolve(path: str) -> list[Path]:
    """Where a named path may be: a repository path as written, or one inside ``src/gpupool/``
    (a row's later paths are short: ``src/gpupool/store/``, ``migrations/``)."""
    return [REPO / path] if path.startswith("src/") else [SRC / path, REPO / path]


def test_every_path_in_the_layout_table_exists() -> None:
    missing = [
        p for p in layout_paths((REPO / "README.md").read_text()) if not any(c.exists() for c in resolve(p))
    ]
    assert missing == [], f"README's layout table names paths that do not exist: {missing}"


def test_every_top_level_package_and_module_has_a_row() -> None:
    named = {
        c.resolve() for p in layout_paths((REPO / "README.md").read_text()) for c in resolve(p) if c.exists()
    }
    top = [p for p in SRC.iterdir() if (p / "__init__.py").exists()]
    top += [p for p in SRC.glob("*.py") if p.name != "__init__.py"]
    absent = sorted(p.name for p in top if p.resolve() not in named)
    assert absent == [], f"README's layout table leaves out src/gpupool/{absent}"


def test_the_table_reader_finds_each_kind_of_path() -> None:
    sample = "x\n## Layout\n\n| path | what |\n|---|---|\n| `src/a.py`, `b/` | `not` a path |\n\n## Next\n"
    assert layout_paths(sample) == ["src/a.py", "b/"]
    assert resolve("b/") == [SRC / "b/", REPO / "b/"]


@pytest.mark.parametrize("package", ["kube", "kube/adapters", "kube/runtime", "kube/translate"])
def test_the_kube_package_maps_name_each_of_their_modules(package: str) -> None:
    """``gpupool.kube``'s docstring maps its modules and subpackages, and each subpackage but the
    fake server (whose map names resources too) maps its own modules: each named, none missing."""
    doc = importlib.import_module("gpupool." + package.replace("/", ".")).__doc__ or ""
    named = {n for n in re.findall(r"``([a-z_]+)``", doc)}
    here = SRC / package
    modules = {p.stem for p in here.glob("*.py") if p.name != "__init__.py"}
    modules |= {p.name for p in here.iterdir() if (p / "__init__.py").exists()}
    assert sorted(modules - named) == [], f"gpupool.{package}'s map leaves these out"
    assert sorted(named - modules) == [], f"gpupool.{package}'s map names modules that do not exist"
