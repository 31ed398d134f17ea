"""Fragmentation benchmark: the FGD paper's allocation-ratio experiment on the openb traces.

Public API: :func:`run_fragmentation` and :func:`format_table` (the benchmark),
:func:`node_fragmentation` / :func:`node_fragmentation_batch` with
:class:`ShapeDistribution` (the node score; it lives in the engine, ``gpupool.engine.fgd``, and
is re-exported here: the benchmark imports the engine, never the reverse), the CSV loaders and
:class:`FragbenchError`.
"""

from gpupool.engine.fgd import (
    CompiledShapes,
    PodShape,
    ShapeDistribution,
    node_fragmentation,
    node_fragmentation_batch,
)
from gpupool.fragbench.bench import PUBLISHED, format_table, run_fragmentation
from gpupool.fragbench.engine_run import ENGINE_POLICIES
from gpupool.fragbench.sim import POLICIES
from gpupool.fragbench.trace import FragbenchError, Node, Pod, load_nodes, load_pods

__all__ = [
    "ENGINE_POLICIES",
    "POLICIES",
    "PUBLISHED",
    "CompiledShapes",
    "FragbenchError",
    "Node",
    "Pod",
    "PodShape",
    "ShapeDistribution",
    "format_table",
    "load_nodes",
    "load_pods",
    "node_fragmentation",
    "node_fragmentation_batch",
    "run_fragmentation",
]
