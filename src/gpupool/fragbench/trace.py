"""Loading of the Alibaba openb node and pod CSVs.

The loaders are strict on purpose: a benchmark figure computed from a silently
half-parsed trace is worse than no figure, so a malformed row stops the run with
a :class:`FragbenchError` naming the file and line.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

MILLI = 1000  # milli-GPU per physical GPU

__all__ = ["MILLI", "FragbenchError", "Node", "Pod", "load_nodes", "load_pods"]


class FragbenchError(ValueError):
    """A trace file is missing, malformed or unusable (message names file and line)."""


@dataclass(frozen=True, slots=True)
class Node:
    """One machine of the cluster; every GPU of a node is the same ``model``."""

    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    model: str


@dataclass(frozen=True, slots=True)
class Pod:
    """One task of the trace.

    ``gpu_milli`` is per GPU: a fractional pod has ``num_gpu == 1`` and
    ``gpu_milli < 1000``; a multi-GPU pod takes ``num_gpu`` whole GPUs.
    ``gpu_spec`` is the set of acceptable GPU models (empty: any model).
    """

    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: frozenset[str] = frozenset()

    @property
    def gpu_request(self) -> int:
        """Total GPU request in milli-GPUs (what the arrival counter adds up)."""
        return self.num_gpu * self.gpu_milli


_NODE_COLS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
_POD_COLS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")


def _open_rows(path: Path, required: tuple[str, ...]) -> tuple[list[str], list[tuple[int, list[str]]]]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise FragbenchError(f"{path}: cannot read trace file: {exc}") from exc
    reader = csv.reader(text.splitlines())
    try:
        header = [h.strip() for h in next(reader)]
    except StopIteration:
        raise FragbenchError(f"{path}:1: empty file, expected header {','.join(required)}") from None
    missing = [c for c in required if c not in header]
    if missing:
        raise FragbenchError(f"{path}:1: header lacks column(s) {', '.join(missing)}")
    rows: list[tuple[int, list[str]]] = []
    for row in reader:
        if not row or all(not cell.strip() for cell in row):
            continue
        if len(row) != len(header):
            raise FragbenchError(
                f"{path}:{reader.line_num}: expected {len(header)} fields, got {len(row)}: {','.join(row)!r}"
            )
        rows.append((reader.line_num, [cell.strip() for cell in row]))
    return header, rows


def _int(path: Path, line: int, col: str, value: str, *, lo: int = 0, hi: int | None = None) -> int:
    try:
        out = int(value)
    except ValueError:
        raise FragbenchError(f"{path}:{line}: column {col!r} is not an integer: {value!r}") from None
    if out < lo or (hi is not None and out > hi):
        bound = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise FragbenchError(f"{path}:{line}: column {col!r} = {out} out of range {bound}")
    return out


def load_nodes(path: Path) -> list[Node]:
    """Read a node list (``sn,cpu_milli,memory_mib,gpu,model``)."""
    path = Path(path)
    header, rows = _open_rows(path, _NODE_COLS)
    ix = {c: header.index(c) for c in _NODE_COLS}
    nodes: list[Node] = []
    for line, row in rows:
        num_gpu = _int(path, line, "gpu", row[ix["gpu"]], hi=64)
        model = row[ix["model"]]
        if num_gpu > 0 and not model:
            raise FragbenchError(f"{path}:{line}: node with {num_gpu} GPU(s) has no GPU model")
        nodes.append(
            Node(
                name=row[ix["sn"]],
                cpu_milli=_int(path, line, "cpu_milli", row[ix["cpu_milli"]]),
                memory_mib=_int(path, line, "memory_mib", row[ix["memory_mib"]]),
                num_gpu=num_gpu,
                model=model if num_gpu > 0 else "",
            )
        )
    if not nodes:
        raise FragbenchError(f"{path}: no nodes")
    return nodes


def load_pods(path: Path) -> list[Pod]:
    """Read a pod list (``name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,...]``)."""
    path = Path(path)
    header, rows = _open_rows(path, _POD_COLS)
    ix = {c: header.index(c) for c in _POD_COLS}
    spec_ix = header.index("gpu_spec") if "gpu_spec" in header else None
    pods: list[Pod] = []
    for line, row in rows:
        num_gpu = _int(path, line, "num_gpu", row[ix["num_gpu"]], hi=64)
        gpu_milli = _int(path, line, "gpu_milli", row[ix["gpu_milli"]], hi=MILLI)
        if (num_gpu == 0) != (gpu_milli == 0):
            raise FragbenchError(
                f"{path}:{line}: num_gpu={num_gpu} with gpu_milli={gpu_milli} is inconsistent"
            )
        if num_gpu > 1 and gpu_milli != MILLI:
            raise FragbenchError(
                f"{path}:{line}: a {num_gpu}-GPU pod must take whole GPUs (gpu_milli={gpu_milli})"
            )
        spec: frozenset[str] = frozenset()
        if spec_ix is not None and row[spec_ix]:
            spec = frozenset(s.strip() for s in row[spec_ix].split("|") if s.strip())
        pods.append(
            Pod(
                name=row[ix["name"]],
                cpu_milli=_int(path, line, "cpu_milli", row[ix["cpu_milli"]]),
                memory_mib=_int(path, line, "memory_mib", row[ix["memory_mib"]]),
                num_gpu=num_gpu,
                gpu_milli=gpu_milli,
                gpu_spec=spec,
            )
        )
    if not pods:
        raise FragbenchError(f"{path}: no pods")
    return pods
