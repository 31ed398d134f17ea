"""The checks a set of manifests gets before anything is sent, all in one round, with "did you mean".

Why here as well as in the server: the server refuses a set whole, but it answers one problem
kind at a time (fields first, names next time), and a typo such as ``llm-reserch`` is fixed
faster when the nearest real name is shown. The client knows the set and, when a server is
named, the queues, pools and priority classes there, so it can report every problem at once.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from pydantic import BaseModel

from gpupool.manifests import KUEUE_QUEUE_LABEL, default_priority_classes
from gpupool.manifests import base as m_base
from gpupool.manifests import cluster as m_cluster
from gpupool.manifests import queues as m_queues
from gpupool.manifests import workloads as m_workloads


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the nearest known name, or nothing when none is near."""
    near = difflib.get_close_matches(name, sorted(set(known)), n=1, cutoff=0.6)
    return f" (did you mean {near[0]!r}?)" if near else ""


@dataclass(slots=True)
class Known:
    """The names a set may refer to: its own objects, the built-ins, and the server's."""

    queues: set[str] = field(default_factory=set)
    pools: set[str] = field(default_factory=set)
    classes: set[str] = field(default_factory=lambda: {p.name for p in default_priority_classes()})

    def add(self, kind: str, name: str) -> None:
        {"Queue": self.queues, "ResourcePool": self.pools, "PriorityClass": self.classes}.get(
            kind, set()
        ).add(name)


@cache
def field_names() -> frozenset[str]:
    """Every field name (and alias) of the manifest schemas, to suggest for an unknown field."""
    names: set[str] = set()
    for mod in (m_base, m_cluster, m_queues, m_workloads):
        for obj in vars(mod).values():
            if isinstance(obj, type) and issubclass(obj, BaseModel):
                for n, f in obj.model_fields.items():
                    names.add(f.alias or n)
    return frozenset(names)


_EXTRA = re.compile(r"^(?P<loc>.*?)(?P<field>[A-Za-z0-9_]+): Extra inputs are not permitted$")
_MISSING = re.compile(r"(?P<what>queue|pool|priority class) '(?P<name>[^']+)' does not exist")


def with_hints(errors: Iterable[str], known: Known) -> list[str]:
    """The problems, each unknown field or name followed by the nearest real one."""
    out = []
    for e in errors:
        m = _EXTRA.match(e)
        if m:
            e = f"{m['loc']}{m['field']}: unknown field{did_you_mean(m['field'], field_names())}"
        m2 = _MISSING.search(e)
        if m2 and "did you mean" not in e:
            pool = {"queue": known.queues, "pool": known.pools, "priority class": known.classes}
            e += did_you_mean(m2["name"], pool[m2["what"]])
        out.append(e)
    return out


def _ref(src: str, at: str, what: str, name: Any, known: set[str]) -> list[str]:
    if not isinstance(name, str) or not name or not known or name in known:
        return []
    return [f"{src}: {at}: {what} {name!r} does not exist{did_you_mean(name, known)}"]


def reference_problems(raws: Iterable[tuple[str, Mapping[str, Any]]], known: Known) -> list[str]:
    """The names each document refers to that neither the set nor the server has."""
    out: list[str] = []
    for src, raw in raws:
        spec = raw.get("spec") if isinstance(raw.get("spec"), Mapping) else {}
        assert isinstance(spec, Mapping)
        kind = raw.get("kind")
        if kind == "Workload":
            labels = (raw.get("metadata") or {}).get("labels") or {}
            queue = spec.get("queue") or (
                labels.get(KUEUE_QUEUE_LABEL) if isinstance(labels, Mapping) else None
            )
            out += _ref(src, "spec.queue", "queue", queue, known.queues)
            out += _ref(src, "spec.priorityClass", "priority class", spec.get("priorityClass"), known.classes)
            out += _ref(src, "spec.pool", "pool", spec.get("pool"), known.pools)
        elif kind == "Queue":
            out += _ref(src, "spec.parent", "queue", spec.get("parent"), known.queues)
            for i, q in enumerate(spec.get("quotas") or []):
                if isinstance(q, Mapping):
                    out += _ref(src, f"spec.quotas[{i}].pool", "pool", q.get("pool"), known.pools)
    return out


def located(errors: Iterable[str]) -> set[str]:
    """The ``source: field`` each problem is about, so one place is not reported twice."""
    out = set()
    for e in errors:
        parts = e.split(": ")
        if len(parts) >= 3:
            out.add(": ".join(parts[:2]) + ": " + parts[2].split(" ")[0])
    return out


def merge(errors: list[str], extra: Iterable[str]) -> list[str]:
    """``errors`` and the ``extra`` problems about places ``errors`` does not mention already."""
    seen = located(errors)
    return errors + [e for e in extra if not (located([e]) & seen)]
