"""Checking a manifest set before anything is sent: every problem in one round, the nearest real
name for a typo, the README's ``validate -f examples/``, and Kubernetes Jobs read as Workloads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner

from gpupool.cli import app
from gpupool.cli.checks import Known, did_you_mean, reference_problems, with_hints
from gpupool.kube.workloads import workload_from_object

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def workload(name: str, **spec: Any) -> dict[str, Any]:
    s = {
        "queue": "llm-research",
        "priorityClass": "experiment",
        "podGroups": [{"resources": {"nvidia.com/gpu": 1}}],
    }
    s.update(spec)
    return {"apiVersion": "gpupool.io/v1alpha1", "kind": "Workload", "metadata": {"name": name}, "spec": s}


def job(name: str, queue: str | None = "llm-research", gpus: int = 2) -> dict[str, Any]:
    labels = {"kueue.x-k8s.io/queue-name": queue} if queue else {}
    container = {"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": gpus}}}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": labels},
        "spec": {"parallelism": 1, "completions": 1, "template": {"spec": {"containers": [container]}}},
    }


def validate(*files: Path) -> tuple[int, str]:
    args = ["validate"]
    for f in files:
        args += ["-f", str(f)]
    r = runner.invoke(app, args, env={"COLUMNS": "300"})
    assert "Traceback" not in r.output
    return r.exit_code, r.output


def test_every_problem_in_one_round_with_the_nearest_names(tmp_path: Path) -> None:
    bad_field = workload("a", queue="llm-reserch")
    bad_field["spec"]["priorityClas"] = "training"
    bad_class = workload("b", priorityClass="experimnt")
    bad_class["spec"]["podGroups"][0]["replicas"] = "x"
    f = tmp_path / "set.yaml"
    f.write_text(yaml.safe_dump_all([bad_field, bad_class]))
    code, out = validate(ROOT / "examples" / "cluster", f)
    assert code == 2
    assert "spec.priorityClas: unknown field (did you mean 'priorityClass'?)" in out
    assert "spec.queue: queue 'llm-reserch' does not exist (did you mean 'llm-research'?)" in out
    assert "spec.podGroups[0].replicas" in out
    assert "'experimnt'" in out and "did you mean 'experiment'?" in out
    assert "4 problem(s)" in out  # one round: the field problems and the names together


def test_the_readme_validate_of_examples_passes() -> None:
    code, out = validate(ROOT / "examples")
    assert code == 0, out
    assert out.startswith("valid: 22 nodes")  # examples/cluster (16) and examples/heterogeneous (6)
    assert "valid (scenario " in out and "poc.yaml" in out


def test_a_kueue_job_validates_as_the_workload_the_kubernetes_backend_makes(tmp_path: Path) -> None:
    f = tmp_path / "job.yaml"
    f.write_text(yaml.safe_dump(job("train")))
    code, out = validate(ROOT / "examples" / "cluster", f)
    assert code == 0, out
    assert "10 workloads" not in out and "1 workloads" in out


def test_a_job_without_a_queue_label_says_which_label(tmp_path: Path) -> None:
    f = tmp_path / "job.yaml"
    f.write_text(yaml.safe_dump_all([job("train", queue=None), job("other", queue="no-such")]))
    code, out = validate(ROOT / "examples" / "cluster", f)
    assert code == 2
    assert "document 1 (Job/train): metadata.labels" in out and "kueue.x-k8s.io/queue-name" in out
    assert "queue 'no-such' does not exist" in out


def test_hints_only_when_a_name_is_near() -> None:
    assert did_you_mean("llm-reserch", ["llm-research", "vision"]) == " (did you mean 'llm-research'?)"
    assert did_you_mean("zzz", ["llm-research"]) == ""
    k = Known({"llm-research"}, {"h100-training"}, {"training"})
    raws = [("f: document 1 (Queue/q)", {"kind": "Queue", "spec": {"quotas": [{"pool": "h100-trainng"}]}})]
    assert reference_problems(raws, k) == [
        "f: document 1 (Queue/q): spec.quotas[0].pool: pool 'h100-trainng' does not exist"
        " (did you mean 'h100-training'?)"
    ]
    assert with_hints(["x: spec.pool: pool 'h100-trainin' does not exist"], k)[0].endswith(
        "(did you mean 'h100-training'?)"
    )


def test_job_conversion_is_the_backends(tmp_path: Path) -> None:
    from gpupool.cli.kubeobjects import to_workload

    obj = job("train")
    manifest, problem = to_workload(obj)
    expected = workload_from_object({**obj, "metadata": {**obj["metadata"], "namespace": "default"}})
    assert problem is None and expected is not None and manifest == expected.manifest
