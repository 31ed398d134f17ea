"""Partial admission of ``batch/v1`` Jobs (部分准入): Kueue's ``kueue.x-k8s.io/job-min-parallelism``.

A Job annotated ``kueue.x-k8s.io/job-min-parallelism: "N"`` (or gpupool's own
``gpupool.io/min-member``) is a workload whose pod group may run with as few as N of its
``parallelism`` pods: its manifest says ``gang.minMember: N`` and the engine may admit it with a
reduced count k (``engine/partial.py``). Three things follow on the Job itself:

* **The Job must start only k pods.** Its controller creates ``parallelism`` pods; the backend
  sets ``spec.parallelism`` to k before it unsuspends the Job (Kueue's ``RunWithPodSetsInfo``),
  and puts the original back when it suspends it again (``RestorePodSetsInfo``), so a later
  admission may again give it every pod.
* **Completions must follow.** A Job that still needs more completions than the k pods gpupool
  binds would wait for pods no one binds, and never finish. Kubernetes lets ``completions``
  change only on an Indexed Job, and only to equal ``parallelism`` (elastic Indexed Jobs); a
  NonIndexed Job's ``completions`` is immutable. So partial admission is accepted for a Job
  whose completions can follow: none set (a work-queue Job: parallelism alone changes), or
  ``completionMode: Indexed`` with ``completions == parallelism`` (both change, as Kueue does
  with ``kueue.x-k8s.io/job-completions-equal-parallelism``). Any other Job is held back with
  the annotation named (``KubeWorkloadError``), never admitted into a stall.
* **The workload stays the one submitted.** The original counts are kept in
  ``gpupool.io/original-parallelism`` (and ``-completions``) while the Job runs reduced; the
  translation reads them, so a Job re-read after a restart is still "3 pods, at least 2", not
  "2 pods".
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from gpupool.kube.translate.resources import KubeWorkloadError, mapping

MIN_PARALLELISM = "kueue.x-k8s.io/job-min-parallelism"
MIN_MEMBER = "gpupool.io/min-member"
#: the annotations a Job's minimum is read from, in this order (they must agree when both are set)
MIN_KEYS = (MIN_PARALLELISM, MIN_MEMBER)
ORIGINAL_PARALLELISM = "gpupool.io/original-parallelism"
ORIGINAL_COMPLETIONS = "gpupool.io/original-completions"

_DIGITS = re.compile(r"^[0-9]{1,9}$")


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return mapping(mapping(obj.get("metadata")).get("annotations"))


def _whole(value: object, key: str) -> int:
    """An annotation's positive whole number (Kueue parses it as an integer too)."""
    if not (isinstance(value, str) and _DIGITS.match(value.strip())) or int(value) < 1:
        raise KubeWorkloadError(
            f"metadata.annotations.{key}", f"expected a positive whole number, got {value!r}"
        )
    return int(value)


def requested_spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """The Job's spec with the counts its owner asked for: while gpupool runs it reduced, the
    originals come back from ``gpupool.io/original-*`` (the spec itself says k)."""
    spec = mapping(obj.get("spec"))
    ann = _annotations(obj)
    if ann.get(ORIGINAL_PARALLELISM) is None:
        return spec
    out = dict(spec)
    out["parallelism"] = _whole(ann[ORIGINAL_PARALLELISM], ORIGINAL_PARALLELISM)
    if ann.get(ORIGINAL_COMPLETIONS) is not None:
        out["completions"] = _whole(ann[ORIGINAL_COMPLETIONS], ORIGINAL_COMPLETIONS)
    return out


def min_parallelism(obj: Mapping[str, Any]) -> tuple[int, str] | None:
    """The Job's minimum pod count and the path of the annotation that says it; None when
    neither annotation is set. Raises KubeWorkloadError for a value that is not a positive whole
    number, or for the two annotations disagreeing."""
    ann = _annotations(obj)
    found = [(_whole(ann[k], k), k) for k in MIN_KEYS if ann.get(k) is not None]
    if not found:
        return None
    if len({n for n, _ in found}) > 1:
        raise KubeWorkloadError(
            f"metadata.annotations.{found[1][1]}", f"disagrees with {found[0][1]} ({found[0][0]})"
        )
    return found[0][0], f"metadata.annotations.{found[0][1]}"


def completions_follow(spec: Mapping[str, Any]) -> bool:
    """Whether ``completions`` changes with ``parallelism`` (an Indexed Job with both equal)."""
    completions = spec.get("completions")
    return (
        completions is not None
        and spec.get("completionMode") == "Indexed"
        and completions == spec.get("parallelism", 1)
    )


def check_reducible(spec: Mapping[str, Any], where: str) -> None:
    """Raise unless the Job may run with fewer pods and still finish (see the module)."""
    if spec.get("completions") is None or completions_follow(spec):
        return
    raise KubeWorkloadError(
        where,
        "partial admission needs completions that can follow parallelism: leave spec.completions "
        "unset, or use completionMode: Indexed with completions equal to parallelism (a NonIndexed "
        "Job's completions cannot change, so with fewer pods admitted it would never finish)",
    )


def admit_patch(obj: Mapping[str, Any], admitted: int) -> dict[str, Any]:
    """The merge patch that makes a partial Job run ``admitted`` pods: ``spec.parallelism`` (and
    ``completions`` when they follow) set to the count, the originals kept in annotations; with
    every pod admitted, the originals put back. {} for a Job without partial admission, or one
    already as asked. Raises KubeWorkloadError for a Job the translation would refuse."""
    if min_parallelism(obj) is None:
        return {}
    spec = requested_spec(obj)
    parallelism = int(spec.get("parallelism", 1))
    pods = min(parallelism, int(spec["completions"])) if spec.get("completions") is not None else parallelism
    if admitted >= pods:
        return restore_patch(obj)
    target: dict[str, Any] = {"parallelism": admitted}
    keep = {ORIGINAL_PARALLELISM: str(parallelism)}
    if completions_follow(spec):
        target["completions"] = admitted
        keep[ORIGINAL_COMPLETIONS] = str(spec["completions"])
    return {"metadata": {"annotations": keep}, "spec": target}


def restore_patch(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The merge patch that gives a Job back the counts gpupool reduced and drops the record of
    them; {} when nothing was reduced. Raises KubeWorkloadError for an unreadable record."""
    ann = _annotations(obj)
    if ann.get(ORIGINAL_PARALLELISM) is None:
        return {}
    spec = requested_spec(obj)
    back: dict[str, Any] = {"parallelism": spec["parallelism"]}
    if ann.get(ORIGINAL_COMPLETIONS) is not None:
        back["completions"] = spec["completions"]
    drop = {ORIGINAL_PARALLELISM: None, ORIGINAL_COMPLETIONS: None}
    return {"metadata": {"annotations": drop}, "spec": back}


__all__ = [
    "MIN_KEYS",
    "MIN_MEMBER",
    "MIN_PARALLELISM",
    "ORIGINAL_COMPLETIONS",
    "ORIGINAL_PARALLELISM",
    "admit_patch",
    "check_reducible",
    "completions_follow",
    "min_parallelism",
    "requested_spec",
    "restore_patch",
]
