"""The node view answers only complete views, even while another thread rebuilds it.

Regression: a restarted controller asked for the nodes while the first rebuild was running in
another thread, got the empty view from before it, and evicted its running work as NodeRemoved.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from gpupool.kube import inventory, nodes
from gpupool.kube.nodes import NodeView


class _Cache:
    def __init__(self, objs: list[dict[str, Any]]) -> None:
        self.objs = {o["metadata"]["name"]: o for o in objs}

    def items(self) -> list[dict[str, Any]]:
        return list(self.objs.values())

    def get(self, _ns: str, name: str) -> dict[str, Any] | None:
        return self.objs.get(name)

    def add_listener(self, fn: Callable[[str, dict[str, Any]], None]) -> None:
        pass


class _Informers:
    def __init__(self, node_objs: list[dict[str, Any]]) -> None:
        self.nodes = _Cache(node_objs)
        self.pods = _Cache([])


def _node(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.count": "8", "nvidia.com/gpu.memory": "81920"}},
        "status": {
            "allocatable": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "8"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def test_a_reader_waits_for_the_rebuild_in_progress(monkeypatch: pytest.MonkeyPatch) -> None:
    names = [f"n{i}" for i in range(4)]
    view = NodeView(_Informers([_node(n) for n in names]), inventory.InventoryOptions())  # type: ignore[arg-type]
    real = inventory.node_inventory
    halfway, release = threading.Event(), threading.Event()
    built: list[str] = []

    def slow(obj: dict[str, Any], *a: Any, **k: Any) -> inventory.NodeInventory:
        built.append(obj["metadata"]["name"])
        if len(built) == 2:
            halfway.set()
            release.wait(5)
        return real(obj, *a, **k)

    monkeypatch.setattr(nodes.inventory, "node_inventory", slow)
    rebuilding = threading.Thread(target=view.refresh)
    rebuilding.start()
    assert halfway.wait(5)
    seen: list[list[str]] = []
    reader = threading.Thread(target=lambda: seen.append([n.name for n in view.nodes()]))
    reader.start()
    reader.join(0.3)
    release.set()
    rebuilding.join(5)
    reader.join(5)
    assert seen == [sorted(names)]
