"""The cluster install files: generated from the sources, committed, and valid offline.

Why compare committed files with the generators: the chart ships the committed files, and the
models (gpupool.manifests) change; a stale CRD would accept what ``gpupool validate`` refuses.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpupool.deploy.cli import crd_files
from gpupool.deploy.crds import all_crds
from gpupool.deploy.manifests import chart_objects, manifest_files
from gpupool.deploy.objects import scheduler_args
from gpupool.deploy.rbac import LEASE_RULES, SCHEDULER_RULES
from gpupool.deploy.validate import builtin_problems, resource_problems, structural_problems
from gpupool.deploy.values import NAMESPACE, RELEASE, default_values

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "gpupool"
K8S_VERSION = "1.31.0"


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]


def test_committed_crds_are_the_generators_output() -> None:
    files = crd_files()
    committed = {p.name for p in (CHART / "crds").glob("*.yaml")}
    assert committed == set(files), "run: gpupool deploy crds --out charts/gpupool/crds"
    for name, text in files.items():
        assert (CHART / "crds" / name).read_text(encoding="utf-8") == text, (
            f"{name} is stale; run: gpupool deploy crds --out charts/gpupool/crds"
        )


@pytest.mark.parametrize("crd", all_crds(), ids=lambda c: c["metadata"]["name"])
def test_crd_schemas_are_structural_and_valid_crds(crd: dict[str, Any]) -> None:
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert structural_problems(schema) == []
    assert "$ref" not in yaml.safe_dump(crd)
    assert builtin_problems(crd, K8S_VERSION) == []


def test_structural_check_can_fail() -> None:
    assert structural_problems({"type": "object", "properties": {"a": {"$ref": "#/x"}}}) == [
        ".a: $ref is not allowed",
        ".a: no type",
    ]


def test_workload_crd_shows_queue_phase_position_reason_pool_age() -> None:
    (wl,) = [c for c in all_crds() if c["spec"]["names"]["kind"] == "Workload"]
    cols = wl["spec"]["versions"][0]["additionalPrinterColumns"]
    assert [c["name"] for c in cols] == ["Queue", "Phase", "Position", "Reason", "Pool", "Age"]
    assert wl["spec"]["scope"] == "Namespaced" and wl["spec"]["versions"][0]["subresources"] == {"status": {}}


def test_every_example_pool_queue_and_workload_matches_the_crds() -> None:
    checked = 0
    for path in sorted((REPO / "examples").rglob("*.yaml")):
        for doc in _docs(path):
            if doc.get("kind") in ("ResourcePool", "Queue", "Workload"):
                assert resource_problems(doc, all_crds()) == [], path
                checked += 1
    assert checked >= 10


def test_quantities_are_int_or_string_and_unknown_fields_are_refused() -> None:
    (queue,) = [
        d for d in _docs(REPO / "examples/cluster/queues.yaml") if d["metadata"]["name"] == "llm-team"
    ]
    ok = copy.deepcopy(queue)
    ok["spec"]["quotas"][0]["guarantee"] = {"nvidia.com/gpu": "40", "cpu": 8}
    assert resource_problems(ok, all_crds()) == []
    bad = copy.deepcopy(queue)
    bad["spec"]["weight"] = 0
    bad["spec"]["quotas"][0]["pool"] = ""
    bad["spec"]["colour"] = "blue"
    problems = resource_problems(bad, all_crds())
    assert any(p.startswith("Queue: spec.weight:") for p in problems), problems
    assert any(p.startswith("Queue: spec.quotas.0.pool:") for p in problems), problems
    assert any("colour" in p for p in problems), problems


# -- the chart and the plain manifests -----------------------------------------------------------
def _simple_render(path: Path) -> list[dict[str, Any]]:
    """A template with no logic beyond names and whole-line actions, rendered at the defaults:
    lines that are only a template action are dropped, names substituted."""
    lines = [
        ln
        for ln in path.read_text(encoding="utf-8").splitlines()
        if not (ln.strip().startswith("{{") and ln.strip().endswith("}}"))
    ]
    text = (
        ("\n".join(lines) + "\n")
        .replace("{{ .Release.Name }}", RELEASE)
        .replace("{{ .Release.Namespace }}", NAMESPACE)
    )
    text = text.replace("{{ .Values.examples.gpus }}", str(default_values()["examples"]["gpus"]))
    assert "{{" not in text, f"{path.name} has template logic left: keep it plain"
    return [d for d in yaml.safe_load_all(text) if d]


def test_values_yaml_is_the_generators_defaults() -> None:
    assert yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8")) == default_values()


def test_values_schema_accepts_the_defaults_and_names_a_bad_value() -> None:
    import jsonschema

    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.validate(default_values(), schema)
    bad = default_values()
    bad["replicaCount"] = 0
    bad["webhook"]["failurePolicy"] = "Maybe"
    bad["colour"] = "blue"
    errors = {
        "/".join(str(p) for p in e.absolute_path) or e.message
        for e in jsonschema.Draft7Validator(schema).iter_errors(bad)
    }
    assert "replicaCount" in errors and "webhook/failurePolicy" in errors
    assert any("colour" in e for e in errors)


def test_chart_and_manifests_grant_the_same_rules() -> None:
    (role,) = _simple_render(CHART / "templates" / "clusterrole.yaml")
    assert role["kind"] == "ClusterRole"
    assert role["rules"] == [r.as_dict() for r in SCHEDULER_RULES]
    lease_role = _simple_render(CHART / "templates" / "leader-election-role.yaml")[0]
    assert lease_role["rules"] == [r.as_dict() for r in LEASE_RULES]
    generated = {(o["kind"], o["metadata"]["name"]): o for o in chart_objects(default_values(), NAMESPACE)}
    assert generated[("ClusterRole", RELEASE)]["rules"] == role["rules"]
    assert generated[("Role", f"{RELEASE}-leader-election")]["rules"] == lease_role["rules"]


def test_no_rule_has_a_wildcard_and_each_says_why() -> None:
    for rule in (*SCHEDULER_RULES, *LEASE_RULES):
        assert "*" not in (rule.group, *rule.resources, *rule.verbs) and rule.why
    objs = chart_objects(default_values(), NAMESPACE)
    for o in objs:
        for r in o.get("rules", []):
            assert "*" not in [*r["apiGroups"], *r["resources"], *r["verbs"]], o["metadata"]["name"]


@pytest.mark.parametrize("name", ["priorityclasses.yaml", "default-pool-queue.yaml"])
def test_plain_templates_render_what_the_generator_does(name: str) -> None:
    rendered = _simple_render(CHART / "templates" / name)
    generated = {(o["kind"], o["metadata"]["name"]): o for o in chart_objects(default_values(), NAMESPACE)}
    assert rendered and all(generated[(o["kind"], o["metadata"]["name"])] == o for o in rendered)


def test_the_chart_seeds_the_example_pool_and_queue_the_generator_does() -> None:
    (rendered,) = _simple_render(CHART / "templates" / "configmap.yaml")
    (cm,) = [o for o in chart_objects(default_values(), NAMESPACE) if o["kind"] == "ConfigMap"]
    assert rendered["data"] == cm["data"] and set(cm["data"]) == {"examples.yaml"}
    docs = [d for d in yaml.safe_load_all(cm["data"]["examples.yaml"]) if d]
    assert [(d["kind"], d["metadata"]["name"]) for d in docs] == [
        ("ResourcePool", "default"),
        ("Queue", "default"),
    ]
    assert all(resource_problems(d, all_crds()) == [] for d in docs)
    none = default_values()
    none["examples"]["create"] = False
    assert next(o for o in chart_objects(none, NAMESPACE) if o["kind"] == "ConfigMap")["data"] == {}


def test_the_chart_runs_the_scheduler_with_the_generators_arguments() -> None:
    text = (CHART / "templates" / "scheduler-deployment.yaml").read_text(encoding="utf-8")
    block = text.split("          args:\n", 1)[1].split("          env:\n", 1)[0]
    v = default_values()
    subst = {
        "{{ .Values.scheduler.logLevel }}": v["scheduler"]["logLevel"],
        "{{ .Values.replicaCount | quote }}": str(v["replicaCount"]),
        '{{ ternary "https" "http" (not (empty .Values.tls.secretName)) }}://$(POD_IP):8080': "http://$(POD_IP):8080",
    }
    args = []
    tls_block = False  # the --tls-cert/--tls-key block: tls.secretName is empty by default
    for ln in block.splitlines():
        item = ln.strip().removeprefix("- ")
        item = subst.get(item, item)
        tls_block = tls_block or item == "{{- if .Values.tls.secretName }}"
        if tls_block:
            tls_block = item != "{{- end }}"
            continue
        if item.startswith("{{"):  # if/range/end, and extraArgs (empty by default)
            continue
        args.append(str(yaml.safe_load(item)))
    assert args == scheduler_args(v)
    for needle in (
        "runAsNonRoot",
        "readOnlyRootFilesystem",
        "/readyz",
        "/healthz",
        "replicas: {{ .Values.replicaCount }}",
    ):
        assert needle in text or needle in (CHART / "templates" / "_helpers.tpl").read_text(encoding="utf-8")


def test_committed_manifests_are_the_generators_output() -> None:
    files = manifest_files(default_values())
    root = REPO / "deploy" / "manifests"
    committed = {str(p.relative_to(root)) for p in root.rglob("*.yaml")}
    assert committed == set(files), "run: gpupool deploy manifests --out deploy/manifests"
    for name, text in files.items():
        assert (root / name).read_text(encoding="utf-8") == text, (
            f"{name} is stale; run: gpupool deploy manifests --out deploy/manifests"
        )


@pytest.fixture(scope="module")
def kustomized() -> list[dict[str, Any]]:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed")
    out = subprocess.run(
        ["kubectl", "kustomize", str(REPO / "deploy" / "manifests")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def test_kustomize_builds_every_object_offline(kustomized: list[dict[str, Any]]) -> None:
    got = sorted((o["kind"], o["metadata"]["name"]) for o in kustomized)
    want = [("Namespace", NAMESPACE)] + [(c["kind"], c["metadata"]["name"]) for c in all_crds()]
    want += [(o["kind"], o["metadata"]["name"]) for o in chart_objects(default_values(), NAMESPACE)]
    assert got == sorted(want)


def test_rendered_objects_are_valid_kubernetes_and_gpupool_objects(kustomized: list[dict[str, Any]]) -> None:
    problems = []
    for o in kustomized:
        if o["apiVersion"].startswith("gpupool.io/"):
            problems += resource_problems(o, all_crds())
        else:
            problems += builtin_problems(o, K8S_VERSION)
    assert problems == []
    broken = copy.deepcopy(next(o for o in kustomized if o["kind"] == "Deployment"))
    broken["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] = 3
    assert builtin_problems(broken, K8S_VERSION) != []  # the validator can fail


def test_pods_run_as_non_root_with_a_read_only_root(kustomized: list[dict[str, Any]]) -> None:
    for o in kustomized:
        if o["kind"] not in ("Deployment", "Job"):
            continue
        spec = o["spec"]["template"]["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] != 0
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False, c["name"]
            assert "resources" in c and c["resources"]["limits"]["memory"]
    (dep,) = [o for o in kustomized if o["kind"] == "Deployment"]
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"] == {"type": "Recreate"}


def test_webhooks_never_see_the_release_namespace(kustomized: list[dict[str, Any]]) -> None:
    (mutating,) = [o for o in kustomized if o["kind"] == "MutatingWebhookConfiguration"]
    for hook in mutating["webhooks"]:
        exprs = hook["namespaceSelector"]["matchExpressions"]
        assert {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": [NAMESPACE]} in exprs
        assert hook["clientConfig"]["service"]["path"].startswith("/webhooks/mutate")
    paths = {h["name"]: h["clientConfig"]["service"]["path"] for h in mutating["webhooks"]}
    assert paths["namespace.mutate.gpupool.io"] == "/webhooks/mutate/namespace"


@pytest.fixture
def fake_api(tmp_path: Path) -> Iterator[Any]:
    fake = pytest.importorskip("gpupool.kube.fake", reason="the fake API server is not there yet")
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed")
    srv = fake.FakeApiServer(time_scale=0.01, bookmark_interval_s=0.2, preload_crds=True)
    srv.start()
    srv.write_kubeconfig(tmp_path / "kubeconfig")
    try:
        yield srv
    finally:
        srv.stop()


def _kubectl(srv: Any, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = ["kubectl", f"--kubeconfig={srv.kubeconfig}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


def test_kubectl_applies_the_manifests_to_the_fake_cluster(
    fake_api: Any, kustomized: list[dict[str, Any]], tmp_path: Path
) -> None:
    served = set(_kubectl(fake_api, "api-resources", "-o", "name").stdout.split())
    crds = [o for o in kustomized if o["kind"] == "CustomResourceDefinition"]
    (tmp_path / "crds.yaml").write_text(yaml.safe_dump_all(crds))
    out = _kubectl(fake_api, "apply", "-f", str(tmp_path / "crds.yaml"))
    assert out.returncode == 0, out.stderr
    served |= {c["metadata"]["name"] for c in crds}

    def resource(o: dict[str, Any]) -> str:
        group = o["apiVersion"].rpartition("/")[0]
        plural = {"PodDisruptionBudget": "poddisruptionbudgets", "PriorityClass": "priorityclasses"}.get(
            o["kind"], o["kind"].lower() + ("es" if o["kind"].endswith("s") else "s")
        )
        return f"{plural}.{group}" if group else plural

    rest = [o for o in kustomized if o["kind"] != "CustomResourceDefinition" and resource(o) in served]
    kinds = {o["kind"] for o in rest}
    assert {
        "Namespace",
        "Deployment",
        "Service",
        "ConfigMap",
        "PriorityClass",
        "ResourcePool",
        "Queue",
    } <= kinds
    (tmp_path / "rest.yaml").write_text(yaml.safe_dump_all(rest))
    out = _kubectl(fake_api, "apply", "-f", str(tmp_path / "rest.yaml"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.count(" created") == len(rest), out.stdout
    got = _kubectl(fake_api, "get", "queues.gpupool.io", "default", "-o", "json")
    assert json.loads(got.stdout)["spec"]["quotas"][0]["pool"] == "default"


@pytest.mark.skipif(shutil.which("helm") is None, reason="helm is not installed here")
def test_helm_lint_and_template() -> None:
    lint = subprocess.run(
        ["helm", "lint", str(CHART)], capture_output=True, text=True, timeout=120, check=False
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr
    out = subprocess.run(
        ["helm", "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--include-crds"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    rendered = {(o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load_all(out.stdout) if o}
    generated = {(o["kind"], o["metadata"]["name"]): o for o in chart_objects(default_values(), NAMESPACE)}
    certgen = {k for k in (set(rendered) | set(generated)) if "certgen" in k[1] or "crd-upgrade" in k[1]}
    assert (
        set(rendered) - certgen
        == (set(generated) | {("CustomResourceDefinition", c["metadata"]["name"]) for c in all_crds()})
        - certgen
    )
    for key in (("Deployment", RELEASE), ("ClusterRole", RELEASE), ("Service", RELEASE)):
        assert rendered[key] == generated[key], key


# -- the webhook certificate ---------------------------------------------------------------------
class StubApi:
    """The few KubeApi calls ensure_secret and write_ca_bundle make, over a dict."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str | None, str], dict[str, Any]] = {}
        self.patches: list[tuple[str, list[dict[str, Any]]]] = []

    def get(self, res: Any, ns: str | None, name: str) -> dict[str, Any]:
        from gpupool.kube.client import ApiError

        if (res.plural, ns, name) not in self.objects:
            raise ApiError(404, "NotFound", name)
        return copy.deepcopy(self.objects[(res.plural, ns, name)])

    def create(self, res: Any, ns: str | None, obj: dict[str, Any]) -> dict[str, Any]:
        self.objects[(res.plural, ns, obj["metadata"]["name"])] = copy.deepcopy(obj)
        return obj

    def request(self, method: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        assert method == "PUT" and path.endswith(body["metadata"]["name"])
        self.objects[("secrets", body["metadata"]["namespace"], body["metadata"]["name"])] = body
        return body

    def patch(
        self, res: Any, ns: str | None, name: str, ops: list[dict[str, Any]], content_type: str
    ) -> None:
        self.patches.append((res.plural, ops))


def test_certs_are_made_once_kept_while_valid_and_trusted_by_both_webhook_configs() -> None:
    import base64
    import datetime as dt

    from cryptography import x509

    from gpupool.deploy.certs import ensure_secret, still_good, write_ca_bundle

    api = StubApi()
    objs = {(o["kind"], o["metadata"]["name"]): o for o in chart_objects(default_values(), NAMESPACE)}
    api.objects[("mutatingwebhookconfigurations", None, RELEASE)] = objs[
        ("MutatingWebhookConfiguration", RELEASE)
    ]
    api.objects[("validatingwebhookconfigurations", None, RELEASE)] = objs[
        ("ValidatingWebhookConfiguration", RELEASE)
    ]
    made, bundle = ensure_secret(api, NAMESPACE, "gpupool-webhook", "gpupool-webhook-tls")  # type: ignore[arg-type]
    assert made
    secret = api.objects[("secrets", NAMESPACE, "gpupool-webhook-tls")]
    assert secret["type"] == "kubernetes.io/tls" and set(secret["data"]) == {"tls.crt", "tls.key", "ca.crt"}
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    ca = x509.load_pem_x509_certificate(base64.b64decode(bundle))
    cert.verify_directly_issued_by(ca)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName
    )
    assert f"gpupool-webhook.{NAMESPACE}.svc" in sans
    again, bundle2 = ensure_secret(api, NAMESPACE, "gpupool-webhook", "gpupool-webhook-tls")  # type: ignore[arg-type]
    assert not again and bundle2 == bundle  # an upgrade keeps a valid certificate
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=3640)
    assert not still_good(secret, ["gpupool-webhook"], now=later)  # near expiry: renewed
    assert not still_good(secret, ["other-name"])  # another Service name: renewed
    assert write_ca_bundle(api, RELEASE, bundle) == 4  # type: ignore[arg-type]  # 3 mutating entries, 1 validating
    assert all(
        op["value"] == bundle and op["path"].endswith("/clientConfig/caBundle")
        for _, ops in api.patches
        for op in ops
    )


def _parses(args: list[str]) -> tuple[int, str]:
    """``gpupool ARGS --help`` with the real command line: every option is parsed (an unknown one
    exits 2) and nothing runs."""
    from typer.testing import CliRunner

    from gpupool.cli.main import app

    r = CliRunner().invoke(app, [*args, "--help"])
    return r.exit_code, r.output


def test_every_container_runs_a_command_gpupool_has() -> None:
    objs = chart_objects(default_values(), NAMESPACE)
    containers = [
        c
        for o in objs
        if o["kind"] in ("Deployment", "Job")
        for c in o["spec"]["template"]["spec"]["containers"]
    ]
    assert {c["name"] for c in containers} == {"scheduler", "webhook", "certgen"}
    for c in containers:
        code, out = _parses(c["args"])
        assert code == 0, (c["name"], out)
    hook = (CHART / "templates" / "crd-upgrade.yaml").read_text(encoding="utf-8")
    assert "args: [deploy, crds, --apply]" in hook and _parses(["deploy", "crds", "--apply"])[0] == 0
    code, out = _parses(["serve", "--lease-name", "x"])
    assert code == 2 and "--lease-name" in out  # the check can fail


def test_crds_upgrade_in_place_and_settle(fake_api: Any) -> None:
    """The chart's pre-upgrade hook (``gpupool deploy crds --apply``) against the fake API server:
    a previous release's CRD is replaced, a missing one created, and a second run changes nothing."""
    from gpupool.deploy.upgrade import CRDS, apply_crds
    from gpupool.kube.client import KubeApi, load_config

    old = all_crds()[:2]
    del old[1]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][
        "weight"
    ]
    api = KubeApi(load_config(str(fake_api.kubeconfig)))
    try:
        assert [a for _, a in apply_crds(api, old)] == ["created", "created"]
        assert [a for _, a in apply_crds(api)] == ["unchanged", "updated", "created"]
        assert [a for _, a in apply_crds(api)] == ["unchanged"] * 3
        queue = api.get(CRDS, None, "queues.gpupool.io")
        props = queue["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        assert "weight" in props
    finally:
        api.close()


def _leaves(v: Any, prefix: str = "") -> list[str]:
    if isinstance(v, dict) and v and not prefix.endswith("resources"):
        return [x for k, sub in v.items() for x in _leaves(sub, f"{prefix}.{k}" if prefix else k)]
    return [prefix]


def test_the_install_guide_lists_every_rule_and_value() -> None:
    from gpupool.deploy.rbac import certgen_rules, certgen_secret_rules

    doc = (REPO / "docs" / "install.md").read_text(encoding="utf-8")
    for r in (
        *SCHEDULER_RULES,
        *LEASE_RULES,
        *certgen_rules(RELEASE),
        *certgen_secret_rules(f"{RELEASE}-webhook-tls"),
    ):
        names = f" (only `{', '.join(r.names)}`)" if r.names else ""
        group = r.group or '""'
        resources = ", ".join(f"`{x}`" for x in r.resources)
        row = f"| `{group}` | {resources}{names} | {', '.join(r.verbs)} | {r.why} |"
        assert row in doc, row
    for key in _leaves(default_values()):
        assert f"`{key}`" in doc, f"docs/install.md does not list the value {key}"


# -- end to end on the fake cluster: the webhook's output is what the backend schedules ----------
def _pods(srv: Any, ns: str) -> list[dict[str, Any]]:
    got = srv.list("pods", ns)
    return list(got["items"] if isinstance(got, dict) else got)


def _events(srv: Any, ns: str) -> list[dict[str, Any]]:
    got = srv.list("events", ns)
    return list(got["items"] if isinstance(got, dict) else got)


def _serve_kube(kubeconfig: Path, cfg: Path, state: Path) -> tuple[subprocess.Popen[bytes], int]:
    import socket
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    cmd = [
        sys.executable,
        "-m",
        "gpupool.cli.main",
        "serve",
        "--backend",
        "kubernetes",
        "--kubeconfig",
        str(kubeconfig),
    ]
    cmd += ["--config", str(cfg), "--state-dir", str(state), "--port", str(port), "--tick", "0.2"]
    with (state.parent / "serve.log").open("wb") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), port


def _up(proc: subprocess.Popen[bytes], port: int, log: Path) -> bool:
    import httpx

    assert proc.poll() is None, f"gpupool serve exited: {log.read_text(encoding='utf-8')[-2000:]}"
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def _until(what: str, fn: Any, timeout_s: float = 120.0) -> Any:
    import time

    end = time.monotonic() + timeout_s
    while time.monotonic() < end:  # a wait for the cluster to settle, not a speed claim
        got = fn()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_jobs_and_shares_through_the_webhook_run_on_the_fake_cluster(fake_api: Any, tmp_path: Path) -> None:
    """The install's pieces together: the chart's ConfigMap (the example pool and queue) as the configuration, a
    GPU node labelled and tainted as docs/install.md says, objects mutated by the webhook as the
    API server would, and ``gpupool serve --backend kubernetes`` scheduling them."""
    import base64

    from fastapi.testclient import TestClient

    from gpupool.service.routes.webhooks import webhook_app
    from tests.service.test_webhooks import apply_patch, review

    (node,) = fake_api.add_gpu_nodes(1, labels={"gpupool.io/managed": "true"})
    obj = fake_api.get("nodes", "", node)
    obj["spec"]["taints"] = [{"key": "gpupool.io/managed", "value": "true", "effect": "NoSchedule"}]
    fake_api.update("nodes", obj)
    cfg = tmp_path / "cfg"  # what the pod mounts from the ConfigMap gpupool-config
    cfg.mkdir()
    (cm,) = [o for o in chart_objects(default_values(), NAMESPACE) if o["kind"] == "ConfigMap"]
    for name, text in cm["data"].items():
        (cfg / name).write_text(text, encoding="utf-8")
    run = {"fake.gpupool.io/run-seconds": "36000"}
    container = {"name": "main", "image": "trainer:1"}

    def job(name: str, pods: int, gpus: int) -> dict[str, Any]:
        tmpl = {
            "metadata": {"annotations": run},
            "spec": {
                "restartPolicy": "Never",
                "containers": [{**container, "resources": {"limits": {"nvidia.com/gpu": gpus}}}],
            },
        }
        meta = {"name": name, "namespace": "default", "labels": {"kueue.x-k8s.io/queue-name": "default"}}
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": meta,
            "spec": {"parallelism": pods, "completions": pods, "template": tmpl},
        }

    kai: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "kai",
            "namespace": "default",
            "labels": {"gpupool.io/queue": "default"},
            "annotations": {**run, "gpu-fraction": "0.5"},
        },
        "spec": {"containers": [container]},
    }
    volcano = copy.deepcopy(kai)
    volcano["metadata"].update(name="volcano", annotations=run)
    volcano["spec"]["containers"] = [
        {**container, "resources": {"limits": {"volcano.sh/vgpu-number": 1, "volcano.sh/vgpu-cores": 50}}}
    ]
    proc, port = _serve_kube(Path(fake_api.kubeconfig), cfg, tmp_path / "state")
    try:
        _until("gpupool serve", lambda: _up(proc, port, tmp_path / "serve.log"))
        with TestClient(webhook_app()) as c:
            for o, group in (
                (job("train", 2, 1), "batch"),
                (kai, ""),
                (volcano, ""),
                (job("too-big", 2, 8), "batch"),
            ):
                resp = c.post("/webhooks/mutate", json=review(o, group, o["kind"])).json()["response"]
                fake_api.create(apply_patch(o, json.loads(base64.b64decode(resp["patch"]))))
        bound = _until(
            "four pods bound",
            lambda: (
                [p for p in _pods(fake_api, "default") if p["spec"].get("nodeName")]
                if sum(1 for p in _pods(fake_api, "default") if p["spec"].get("nodeName")) >= 4
                else None
            ),
        )
        milli = {p["metadata"]["name"]: p["metadata"]["annotations"]["gpupool.io/gpu-milli"] for p in bound}
        assert milli["kai"] == "500" and milli["volcano"] == "500"
        assert (
            fake_api.get("jobs.batch", "default", "train")["spec"]["suspend"] is False
        )  # admitted: unsuspended
        assert (
            fake_api.get("jobs.batch", "default", "too-big")["spec"]["suspend"] is True
        )  # 16 GPUs > the queue's 8
        why = _until(
            "an Event on the waiting Job",
            lambda: [
                e
                for e in _events(fake_api, "default")
                if e.get("involvedObject", {}).get("name") == "too-big"
            ],
        )
        assert all(e.get("message") for e in why)
    finally:
        proc.terminate()
        proc.wait(30)


#: the writes the Kubernetes backend makes (read from gpupool.kube.runtime's binder, evictor and
#: lease, and gpupool.kube's status, mirror and config_source)
BACKEND_WRITES = (
    ("", "nodes", "patch"),  # binder: HAMi's node lock
    ("", "pods/binding", "create"),  # binder
    ("", "pods/status", "patch"),  # status writer, evictor (DisruptionTarget)
    ("", "pods/eviction", "create"),  # evictor
    ("", "pods", "delete"),  # evictor
    ("", "pods", "patch"),  # evictor: the admission record on a bare pod
    ("", "events", "create"),  # status writer, evictor
    ("", "events", "patch"),  # status writer: a repeated Event's count
    *(
        (g, r, "patch")  # evictor: admission record, (un)suspension
        for g, r in (
            ("batch", "jobs"),
            ("jobset.x-k8s.io", "jobsets"),
            ("kubeflow.org", "pytorchjobs"),
            ("apps", "deployments"),
            ("apps", "statefulsets"),
        )
    ),
    ("gpupool.io", "workloads", "create"),  # mirror: a Workload per Kubernetes workload
    ("gpupool.io", "workloads", "delete"),  # mirror: the workload's object is gone
    ("gpupool.io", "workloads/status", "patch"),  # mirror: queue, phase, position, reason
    ("gpupool.io", "resourcepools/status", "patch"),  # config source: Accepted condition
    ("gpupool.io", "queues/status", "patch"),  # config source: Accepted condition
)


def _granted(rules: Any) -> set[tuple[str, str, str]]:
    return {(r.group, res, v) for r in rules for res in r.resources for v in r.verbs}


def test_the_scheduler_may_do_what_the_backend_does() -> None:
    from gpupool.kube.client import RESOURCES
    from gpupool.kube.runtime.informer import WATCHED

    granted = _granted(SCHEDULER_RULES)
    from gpupool.kube.adapters.config_source import KINDS as CONFIG_KINDS

    watched = [RESOURCES[kind] for kind in WATCHED] + list(CONFIG_KINDS.values())
    for res in watched:  # the backend's informers and the configuration source's
        assert {(res.group, res.plural, "list"), (res.group, res.plural, "watch")} <= granted, res.plural
    assert set(BACKEND_WRITES) <= granted
    lease = _granted(LEASE_RULES)
    assert {("coordination.k8s.io", "leases", v) for v in ("get", "create", "update")} <= lease
