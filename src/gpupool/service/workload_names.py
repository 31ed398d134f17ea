"""The stored key of a workload whose name another scope holds, and the name it was written as.

Why a module of its own: the by-name lookup (gpupool.service.core) and the submit path
(gpupool.service.usecases.scoped_names) derive the same key; the rule is documented there.
"""

from __future__ import annotations

import hashlib

from gpupool.store import WorkloadRecord

NAME_ANNOTATION = "gpupool.io/name"
_DIGEST = 10


def scoped_key(name: str, scope: str) -> str:
    """The stored key of ``name`` written from ``scope`` when the plain name is taken
    elsewhere: deterministic, at most 253 characters, still a valid name (backends use it)."""
    digest = hashlib.sha256(scope.encode()).hexdigest()[:_DIGEST]
    return f"{name[: 252 - _DIGEST]}-{digest}"


def written_name(rec: WorkloadRecord) -> str:
    """The name its submitter wrote (the stored key unless the workload was rescoped).

    The annotation counts only where the key derives from it: a submitter writing it by hand
    on a plain name cannot make its workload show another name."""
    ann = (rec.manifest.get("metadata") or {}).get("annotations") or {}
    name = ann.get(NAME_ANNOTATION) if isinstance(ann, dict) else None
    if not isinstance(name, str) or not name:
        return rec.name
    stem = f"{name[: 252 - _DIGEST]}-"
    derived = rec.name.startswith(stem) and len(rec.name) == len(stem) + _DIGEST
    return name if derived else rec.name
