"""The configuration packaged with gpupool: a small cluster, pools, queues and priority classes.

Why packaged: ``gpupool serve`` must start from an installed wheel, where the repository's
``examples/`` directory does not exist. A source checkout keeps using ``examples/cluster``.
"""

from __future__ import annotations

from pathlib import Path

DEFAULTS_DIR = Path(__file__).resolve().parent


def default_config_dir(examples: Path) -> Path:
    """``examples/cluster`` when it exists (a source checkout), else the packaged defaults."""
    candidate = examples / "cluster"
    return candidate if candidate.is_dir() else DEFAULTS_DIR
