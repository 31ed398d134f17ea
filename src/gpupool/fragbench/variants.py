"""Variants of an openb pod list that change one share of the workload at a time.

Why: the default score was tuned on the five shared openb traces; a score that only holds there
has been fitted, not validated. The FGD paper tests its policy on traces derived from the
default one by moving one share at a time (more pods pinned to GPU models, more pods sharing a
GPU, more multi-GPU pods, more CPU demand from pods without GPUs). This module derives such
variants at any level, deterministically from a seed, so that a score can be chosen on some
levels and reported on others.

Each kind changes its own share and leaves the other three as they were (see :func:`shares`):

``model-constrained=F``
    a fraction ``F`` of the GPU pods (by count, drawn uniformly) is pinned to GPU models; which
    models each accepts is drawn from the real gpuspec10 trace's mix for its kind (fractional or
    whole GPUs; see :mod:`gpupool.fragbench.specmix`), among the sets where it fits at all.
``gpu-share=F``
    a fraction ``F`` of the one-GPU pods (by count) takes a share of a GPU: whole one-GPU pods
    become fractional, their milli drawn from the trace's own fractional pods.
``multi-gpu=F``
    a fraction ``F`` of the GPU devices the GPU pods ask for (a fractional pod asks for one)
    belongs to multi-GPU pods: copies of the trace's multi-GPU pods are added.
``cpu-heavy=X``
    the pods without GPUs ask for ``X`` times the CPU they ask for in the base trace: copies of
    them are added (``X`` >= 1), so their shapes stay those of the trace; below 1, pods without
    GPUs drawn at random are left out (the paper's cpu100 is 0.73 of the default trace's).
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from gpupool.fragbench.specmix import FRACTIONAL_SHARE, draw_spec
from gpupool.fragbench.trace import MILLI, FragbenchError, Node, Pod

__all__ = ["KINDS", "Variant", "apply_variant", "parse_variant", "shares", "write_pods"]

#: variant kinds and the range of levels each accepts
KINDS: dict[str, tuple[float, float]] = {
    "model-constrained": (0.0, 1.0),
    "gpu-share": (0.0, 1.0),
    "multi-gpu": (0.0, 0.95),
    "cpu-heavy": (0.1, 10.0),
}


@dataclass(frozen=True, slots=True)
class Variant:
    """One share changed to ``level`` (see the module docstring for each kind)."""

    kind: str
    level: float

    @property
    def label(self) -> str:
        """How a result names the variant, e.g. ``model-constrained=0.3``."""
        return f"{self.kind}={self.level:g}"


def parse_variant(text: str) -> Variant:
    """Read ``KIND=LEVEL`` (a ``%`` suffix divides by 100): the ``--variant`` option's value."""
    kind, sep, raw = text.partition("=")
    kind = kind.strip().lower()
    if not sep or kind not in KINDS:
        raise FragbenchError(f"variant {text!r}: expected KIND=LEVEL with KIND one of {', '.join(KINDS)}")
    raw = raw.strip()
    try:
        level = float(raw[:-1]) / 100.0 if raw.endswith("%") else float(raw)
    except ValueError:
        raise FragbenchError(f"variant {text!r}: level {raw!r} is not a number") from None
    lo, hi = KINDS[kind]
    if not lo <= level <= hi:
        raise FragbenchError(f"variant {text!r}: level of {kind} must be in [{lo:g}, {hi:g}]")
    return Variant(kind, level)


def shares(pods: Sequence[Pod], base_cpu_only_cpu: int | None = None) -> dict[str, float]:
    """The four shares a variant moves, measured on a pod list.

    ``cpu-heavy`` is the pods without GPUs' total CPU over ``base_cpu_only_cpu`` (1.0 when not
    given, or when the base has none)."""
    gpu = [p for p in pods if p.num_gpu > 0]
    one = [p for p in gpu if p.num_gpu == 1]
    devices = sum(p.num_gpu for p in gpu)
    cpu_only = sum(p.cpu_milli for p in pods if p.num_gpu == 0)
    return {
        "model-constrained": sum(1 for p in gpu if p.gpu_spec) / max(len(gpu), 1),
        "gpu-share": sum(1 for p in one if p.gpu_milli < MILLI) / max(len(one), 1),
        "multi-gpu": sum(p.num_gpu for p in gpu if p.num_gpu > 1) / max(devices, 1),
        "cpu-heavy": cpu_only / base_cpu_only_cpu if base_cpu_only_cpu else 1.0,
    }


def apply_variant(pods: Sequence[Pod], nodes: Sequence[Node], variant: Variant, seed: int = 0) -> list[Pod]:
    """The pod list with ``variant``'s share moved to its level; the same seed, the same list.

    A share already above the level is an error naming it: variants only add (pins, shares,
    copies; ``cpu-heavy`` below 1 leaves CPU-only pods out), so that what is not moved stays
    exactly as it was."""
    rng = np.random.default_rng(seed)
    now = shares(pods)[variant.kind] if variant.kind != "cpu-heavy" else 0.0
    if variant.level < now - 1e-9:
        raise FragbenchError(
            f"variant {variant.label}: the base trace's {variant.kind} share is already {now:.3f}"
        )
    if variant.kind == "model-constrained":
        return _pin_models(list(pods), nodes, variant.level, rng)
    if variant.kind == "gpu-share":
        return _share_gpus(list(pods), variant.level, rng)
    if variant.kind == "multi-gpu":
        return _add_multi_gpu(list(pods), variant.level, rng)
    return _add_cpu_only(list(pods), variant.level, rng)


def _pin_models(pods: list[Pod], nodes: Sequence[Node], level: float, rng: np.random.Generator) -> list[Pod]:
    """Pin free GPU pods, drawn at random, until ``level`` of them are pinned.

    As in the real gpuspec10 trace (``specmix``): pinned pods are drawn uniformly within their
    kind, fractional ones making ``FRACTIONAL_SHARE`` of them, and their models follow its mix."""
    gpu_ix = [i for i, p in enumerate(pods) if p.num_gpu > 0]
    free = [i for i in gpu_ix if not pods[i].gpu_spec]
    want = max(round(level * len(gpu_ix)) - (len(gpu_ix) - len(free)), 0)
    frac = [i for i in free if pods[i].gpu_milli < MILLI]
    whole = [i for i in free if pods[i].gpu_milli == MILLI]
    n_frac = min(round(want * FRACTIONAL_SHARE), len(frac))  # the mix's kinds, as far as they go
    n_frac = max(n_frac, want - len(whole))
    chosen = [
        *rng.permutation(np.array(frac, dtype=np.int64))[:n_frac].tolist(),
        *rng.permutation(np.array(whole, dtype=np.int64))[: want - n_frac].tolist(),
    ]
    for i in sorted(chosen):
        spec = draw_spec(pods[i], nodes, rng)
        if spec is not None:  # a pod that runs nowhere now: pinning it changes nothing measurable
            pods[i] = replace(pods[i], gpu_spec=spec)
    return pods


def _share_gpus(pods: list[Pod], level: float, rng: np.random.Generator) -> list[Pod]:
    """Turn whole one-GPU pods, drawn at random, into fractional ones until ``level`` share."""
    one = [i for i, p in enumerate(pods) if p.num_gpu == 1]
    whole = [i for i in one if pods[i].gpu_milli == MILLI]
    milli = [pods[i].gpu_milli for i in one if pods[i].gpu_milli < MILLI]
    if not milli:
        raise FragbenchError("variant gpu-share: the base trace has no fractional pod to take shares from")
    want = round(level * len(one)) - (len(one) - len(whole))
    draws = rng.choice(np.array(milli, dtype=np.int64), size=max(want, 0))
    chosen = rng.permutation(np.array(whole, dtype=np.int64))[: max(want, 0)].tolist()
    for i, m in zip(chosen, draws.tolist(), strict=False):
        pods[i] = replace(pods[i], gpu_milli=int(m))
    return pods


def _add_multi_gpu(pods: list[Pod], level: float, rng: np.random.Generator) -> list[Pod]:
    """Add copies of multi-GPU pods, drawn at random, until they ask ``level`` of the devices."""
    multi = [p for p in pods if p.num_gpu > 1]
    if not multi:
        raise FragbenchError("variant multi-gpu: the base trace has no multi-GPU pod to copy")
    total = sum(p.num_gpu for p in pods if p.num_gpu > 0)
    have = sum(p.num_gpu for p in multi)
    need = (level * total - have) / (1.0 - level)  # devices to add: (have + a) / (total + a) = level
    added = 0
    out = list(pods)
    while added < need - 1e-9:
        p = multi[int(rng.integers(len(multi)))]
        out.append(replace(p, name=f"{p.name}-multi{len(out)}"))
        added += p.num_gpu
    return out


def _add_cpu_only(pods: list[Pod], factor: float, rng: np.random.Generator) -> list[Pod]:
    """Add copies of pods without GPUs, drawn at random, until they ask ``factor`` times the CPU."""
    cpu_only = [p for p in pods if p.num_gpu == 0]
    if not cpu_only:
        raise FragbenchError("variant cpu-heavy: the base trace has no pod without GPUs to copy")
    base = sum(p.cpu_milli for p in cpu_only)
    if factor < 1.0:  # leave out random pods without GPUs while their CPU stays above the level
        gone: set[int] = set()
        left = base
        for i in rng.permutation(len(pods)).tolist():
            if pods[i].num_gpu == 0 and left - pods[i].cpu_milli >= factor * base:
                gone.add(i)
                left -= pods[i].cpu_milli
        return [p for i, p in enumerate(pods) if i not in gone]
    need = (factor - 1.0) * base
    added = 0
    out = list(pods)
    while added < need:
        p = cpu_only[int(rng.integers(len(cpu_only)))]
        out.append(replace(p, name=f"{p.name}-cpu{len(out)}"))
        added += p.cpu_milli
    return out


def write_pods(path: Path, pods: Sequence[Pod]) -> None:
    """Write a pod list in the openb columns the loader reads (to run other code on a variant)."""
    with Path(path).open("w", encoding="utf-8", newline="") as f:
        out = csv.writer(f)
        out.writerow(("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec"))
        for p in pods:
            spec = "|".join(sorted(p.gpu_spec))
            out.writerow((p.name, p.cpu_milli, p.memory_mib, p.num_gpu, p.gpu_milli, spec))
