"""The cluster's nodes as the engine's inventory, rebuilt only where something changed.

Why incremental: a real cluster sends a status update per node every few seconds and a pod
event for every DaemonSet pod; rebuilding 1,000 nodes on each would cost more than a cycle.
A node is rebuilt when its object or the unmanaged pods on it changed, and the controller is
told only when a rebuilt ``Node`` differs from the one it has (a heartbeat changes nothing).
"""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Any

from gpupool.kube import annotations as kube_ann
from gpupool.kube import inventory
from gpupool.kube.runtime.informer import Informers, object_key
from gpupool.kube.runtime.tracker import is_terminal, node_of
from gpupool.model import Node


class NodeView:
    """Per node: its ``NodeInventory`` (engine ``Node``, devices, readiness)."""

    def __init__(self, informers: Informers, opts: inventory.InventoryOptions) -> None:
        self.informers = informers
        self.opts = opts
        self._lock = threading.Lock()
        self._inv: dict[str, inventory.NodeInventory] = {}
        self._dirty: set[str] = set()
        self._all_dirty = True
        self._refreshing = threading.Lock()
        self._changed = False
        self._seen: dict[str, tuple[Any, ...]] = {}
        informers.nodes.add_listener(self._on_node)
        informers.pods.add_listener(self._on_pod)

    def _on_node(self, typ: str, obj: dict[str, Any]) -> None:
        """Mark the node for a rebuild, unless only HAMi's node lock changed: the binder writes
        it before every bind on a HAMi node and the device plugin clears it, two events per
        bind that change nothing the inventory reads (a rebuild scans every cached pod)."""
        name = object_key(obj)[1]
        seen = None if typ == "DELETED" else _inventory_part(obj)
        with self._lock:
            if seen is not None and self._seen.get(name) == seen:
                return
            if seen is None:
                self._seen.pop(name, None)
            else:
                self._seen[name] = seen
            self._dirty.add(name)

    def _on_pod(self, _typ: str, pod: dict[str, Any]) -> None:
        node = node_of(pod)
        if node and not inventory.is_managed(pod, self.opts):
            with self._lock:
                self._dirty.add(node)

    def refresh(self) -> bool:
        """Rebuild the changed nodes; True when the engine's view of them changed."""
        with self._refreshing:
            changed = self._rebuild()
            self._changed |= changed
            return changed

    def take_changed(self) -> bool:
        """Whether anything changed since the last call (to tell the controller once)."""
        with self._refreshing:
            out, self._changed = self._changed, False
            return out

    def _rebuild(self) -> bool:
        """Rebuild into a copy and swap it in whole: a reader holding the previous dict never
        sees it change under it (nor a half-built one)."""
        with self._lock:
            dirty, self._dirty = self._dirty, set()
            everything, self._all_dirty = self._all_dirty, False
        if everything:
            dirty = {object_key(o)[1] for o in self.informers.nodes.items()} | set(self._inv)
        if not dirty:
            return False
        unmanaged = self._unmanaged(dirty)
        inv = dict(self._inv)
        changed = False
        for name in dirty:
            obj = self.informers.nodes.get("", name)
            old = inv.get(name)
            if obj is None:
                changed |= inv.pop(name, None) is not None
                continue
            new = inventory.node_inventory(obj, unmanaged.get(name, ()), self.opts)
            inv[name] = new
            changed |= (
                old is None or old.node != new.node or old.ready != new.ready or old.devices != new.devices
            )
        self._inv = inv
        return changed

    def _unmanaged(self, nodes: set[str]) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for p in self.informers.pods.items():
            n = node_of(p)
            if n in nodes and not is_terminal(p) and not inventory.is_managed(p, self.opts):
                out[n].append(p)
        return out

    def _current(self) -> dict[str, inventory.NodeInventory]:
        """The complete view. Why under ``_refreshing``: while another thread rebuilds, the dirty
        marks are already taken; answering then would give the view from before the rebuild —
        at start-up an empty one, which made a restarted controller evict its running work
        as NodeRemoved."""
        with self._refreshing:
            if self._all_dirty or self._dirty:
                self._changed |= self._rebuild()
            return self._inv

    def nodes(self) -> list[Node]:
        inv = self._current()
        return [inv[n].node for n in sorted(inv)]

    def down(self) -> dict[str, str]:
        inv = self._current()
        return {n: i.unschedulable_reason or "NotReady" for n, i in inv.items() if not i.ready}

    def unhealthy(self) -> dict[str, dict[int, str]]:
        """Devices the node's device plugin reports unhealthy (HAMi's register): node -> index ->
        reason; the controller takes them out of placement and requeues their work."""
        why = f"reported unhealthy by the device plugin ({inventory.HAMI_REGISTER})"
        inv = self._current()
        out = {n: {d.index: why for d in i.devices if not d.healthy} for n, i in inv.items()}
        return {n: devs for n, devs in out.items() if devs}

    def devices(self, node: str) -> tuple[inventory.Device, ...]:
        i = self._current().get(node)
        return i.devices if i is not None else ()


def _inventory_part(obj: dict[str, Any]) -> tuple[Any, ...]:
    """What of a Node the inventory may read: all of it but the resourceVersion, the managed
    fields and HAMi's node lock annotation."""
    md = obj.get("metadata") or {}
    ann = {k: v for k, v in (md.get("annotations") or {}).items() if k != kube_ann.HAMI_NODE_LOCK}
    rest = {k: v for k, v in md.items() if k not in ("annotations", "resourceVersion", "managedFields")}
    return (rest, ann, obj.get("spec"), obj.get("status"))


__all__ = ["NodeView"]
