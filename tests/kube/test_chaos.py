"""``gpupool bench kube --chaos`` (issue 23): node flaps and deletions, kill -9 and SIGSTOP of the
leader, API errors and dropped watches while Jobs, gangs and preemptions flow; every count that
must be 0 is 0. A short run here; longer ones by hand (``--chaos 600``)."""

from __future__ import annotations

from typing import Any

from gpupool.bench.chaos import COUNTS, Tally, format_chaos, run_chaos


def _pod(
    job: str, index: str, uid: str, a: str = "0", b: str = "0", phase: str = "Running"
) -> dict[str, Any]:
    ann = {
        "batch.kubernetes.io/job-completion-index": index,
        "gpupool.io/workload": f"default.job.{job}",
        "gpupool.io/podset": "main",
        "gpupool.io/pod-index": index,
        "gpupool.io/node": "n0",
        "gpupool.io/gpu-indices": a if uid.endswith("x") else b,
        "gpupool.io/gpu-milli": "1000",
        "gpupool.io/gpu-memory-mib": "1000",
    }
    md = {"name": f"{job}-{index}-{uid}", "uid": uid, "labels": {"job-name": job}, "annotations": ann}
    return {"metadata": md, "spec": {"nodeName": "n0"}, "status": {"phase": phase}}


class Srv:
    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods

    def list(self, *_: Any, **__: Any) -> list[dict[str, Any]]:
        return self.pods


def test_the_tally_sees_two_pods_on_one_device_and_restarts_per_slot() -> None:
    t = Tally()
    t.sample(Srv([_pod("j", "0", "ux"), _pod("j", "1", "vx")]))  # both on device 0
    assert len(t.double_booked) == 1
    t.sample(Srv([_pod("j", "0", "w", b="1")]))  # slot 0 ran again
    assert {i: len(u) for i, u in t.running_uids["j"].items()} == {"0": 2, "1": 1}


def test_the_tally_counts_a_bind_long_after_its_admission() -> None:
    import time

    t = Tally()
    late = _pod("j", "0", "ux")
    late["metadata"]["annotations"]["gpupool.io/decision"] = repr(time.time() - 3600.0)
    prompt = _pod("k", "0", "vx", a="1")
    prompt["metadata"]["annotations"]["gpupool.io/decision"] = repr(time.time() - 1.0)
    t.sample(Srv([late, prompt]))
    assert [x.split()[0] for x in t.late_binds] == ["j-0-ux"]


def test_a_short_chaos_run_counts_zero_everywhere() -> None:
    r = run_chaos(30.0, nodes=4, seed=3)
    out = format_chaos(r)
    assert r["jobs"] > 0 and r["samples"] > 10 and r["faults"], out
    assert {k: r[k] for k in COUNTS} == dict.fromkeys(COUNTS, 0), out
