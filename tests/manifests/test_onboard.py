"""Onboarding a team from a TeamTemplate (gpupool.manifests.templates, POST /v1/onboard,
gpupool.store.onboarding): rendered and validated, previewed, atomic, one audit entry."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpupool.audit import AuditEntry
from gpupool.manifests import ManifestError, parse_documents
from gpupool.manifests.templates import TemplateError, render
from gpupool.store import Conflict, Store, ValidationFailed
from tests.test_service_support import REPO, Api, running_app, wl

TEMPLATES = REPO / "examples" / "templates"


def template(name: str = "training-team") -> dict[str, Any]:
    raw: dict[str, Any] = yaml.safe_load((TEMPLATES / f"{name}.yaml").read_text())
    return raw


def test_the_shipped_templates_pass_validate() -> None:
    files = sorted(TEMPLATES.glob("*.yaml"))
    assert [f.stem for f in files] == ["inference-service", "research-group", "training-team"]
    for f in files:
        r = subprocess.run(
            [sys.executable, "-m", "gpupool.cli.main", "validate", "-f", str(f)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert r.returncode == 0, r.stdout + r.stderr


def test_a_template_renders_queues_and_tokens_for_a_team() -> None:
    [doc] = parse_documents((TEMPLATES / "training-team.yaml").read_text())
    plan = render(doc.spec, "nlp", {"gpus": "16"})
    root, exp = plan.queues
    assert root["metadata"]["name"] == "nlp" and exp["metadata"]["name"] == "nlp-experiments"
    assert root["spec"]["parent"] == "ai-org" and exp["spec"]["parent"] == "nlp"
    assert root["spec"]["quotas"][0]["guarantee"] == {"nvidia.com/gpu": 16}
    assert root["metadata"]["annotations"]["gpupool.io/default-priority-class"] == "training"
    assert plan.tokens == [("nlp-lead", "queue-admin", "nlp"), ("nlp-ci", "member", "nlp")]
    [inf] = parse_documents((TEMPLATES / "inference-service.yaml").read_text())
    assert render(inf.spec, "search", {}).queues[0]["spec"]["requiresApproval"] is True  # approval pool


def test_template_errors_name_the_field() -> None:
    [doc] = parse_documents((TEMPLATES / "training-team.yaml").read_text())
    with pytest.raises(TemplateError, match="--set colour: not a parameter"):
        render(doc.spec, "nlp", {"colour": "red"})
    bad = template()
    bad["spec"]["queues"][0]["spec"]["weigth"] = 2
    with pytest.raises(ManifestError, match=r"spec: .*spec\.queues\[0\]\.spec\.weigth"):
        parse_documents(yaml.safe_dump(bad))
    bad = template()
    bad["spec"]["queues"][0]["name"] = "{team}-{nope}"
    with pytest.raises(ManifestError, match="unknown placeholder"):
        parse_documents(yaml.safe_dump(bad))


def _room(api: Api) -> None:
    """The example tree gives ai-org's whole h100 and l40s guarantees to its teams: cut
    vision-team's so a new team fits."""
    v = api.get("/v1/config/queues/vision-team")
    v["metadata"].pop("resourceVersion")
    v["spec"]["quotas"] = [
        {"pool": "h100-training", "guarantee": {"nvidia.com/gpu": 8}},
        {"pool": "l40s-experiment", "guarantee": {"nvidia.com/gpu": 4}},
    ]
    assert api.req("POST", "/v1/apply", json={"items": [v]}).status_code == 200


def test_onboarding_creates_queues_and_tokens_with_one_audit_entry(tmp_path: Path) -> None:
    with running_app(tmp_path) as api:
        svc = api.c.app.state.svc  # type: ignore[attr-defined]
        _room(api)
        n = len(svc.store.audit_records())
        body = {"template": template(), "team": "nlp", "set": {"gpus": "8"}}
        pre = api.req("POST", "/v1/onboard", json={**body, "dryRun": True})
        assert pre.status_code == 200, pre.text
        assert [q["metadata"]["name"] for q in pre.json()["objects"]] == ["nlp", "nlp-experiments"]
        assert {q["queue"] for q in pre.json()["queues"]} >= {"nlp"}
        with pytest.raises(Exception, match="not found"):
            svc.store.get_object("Queue", "nlp")  # the preview created nothing
        r = api.req("POST", "/v1/onboard", json=body)
        assert r.status_code == 200, r.text
        out = r.json()
        assert [c["name"] for c in out["created"]] == ["nlp", "nlp-experiments"]
        lead = next(t for t in out["tokens"] if t["name"] == "nlp-lead")
        assert (lead["role"], lead["scope"]) == ("queue-admin", "nlp")
        actions = [a.action for a in svc.store.audit_records()[n:]]
        assert actions == ["config.preview", "team.onboard"]
        # the team's admin token works, on the team's queue
        job = {
            "apiVersion": "gpupool.io/v1alpha1",
            "kind": "Workload",
            "metadata": {"name": "nlp-job"},
            "spec": {
                "queue": "nlp-experiments",
                "priorityClass": "experiment",
                "podGroups": [{"resources": {"nvidia.com/gpu": 1, "cpu": 2, "memory": "8Gi"}}],
            },
        }
        assert api.req("POST", "/v1/workloads", token=lead["token"], json=job).status_code in (200, 201)
        again = api.req("POST", "/v1/onboard", json=body)
        assert again.status_code == 409 and "already exists" in again.text


def test_an_onboarding_that_does_not_fit_is_refused_whole(tmp_path: Path) -> None:
    with running_app(tmp_path) as api:
        svc = api.c.app.state.svc  # type: ignore[attr-defined]
        before = (len(svc.store.list_objects()), len(svc.store.list_tokens()))
        r = api.req("POST", "/v1/onboard", json={"template": template(), "team": "nlp"})
        assert r.status_code == 422 and "over-subscribed" in r.text  # ai-org has no room
        assert (len(svc.store.list_objects()), len(svc.store.list_tokens())) == before


def test_a_failing_part_leaves_nothing_behind(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path}/o.db")
    [doc] = parse_documents((TEMPLATES / "research-group.yaml").read_text())
    plan = render(doc.spec, "robo", {})
    head = store.audit_head()
    bad_tokens = [*plan.tokens, ("robo-bot", "platform-admin", "robo-research")]  # after the queues
    with pytest.raises(ValidationFailed, match=r"tokens\.role"):
        store.onboard_team(plan.queues, bad_tokens, AuditEntry("t", "team.onboard", "Team", "robo"))
    assert store.list_objects() == [] and store.list_tokens() == [] and store.audit_head() == head
    with pytest.raises(Exception, match="not found"):
        store.list_revisions("Queue", "robo-research")
    recs, issued = store.onboard_team(
        plan.queues, plan.tokens, AuditEntry("t", "team.onboard", "Team", "robo")
    )
    assert [r.name for r in recs] == ["robo-research"] and [t.record.name for t in issued] == ["robo-pi"]
    [rev] = store.list_revisions("Queue", "robo-research")
    assert (rev.author, rev.reason) == ("t", "onboarding")


# ---------------------------------------------------------------------- OIDC group mapping


def _with_groups(name: str = "training-team") -> dict[str, Any]:
    t = template(name)
    t["spec"]["admins"] = {"tokens": ["{team}-lead"], "oidcGroups": ["{team}-leads"]}
    t["spec"]["members"] = {"oidcGroups": ["{team}", "ml-all"]}
    return t


def test_a_template_may_name_oidc_groups_instead_of_or_besides_tokens() -> None:
    [doc] = parse_documents(yaml.safe_dump(_with_groups()))
    plan = render(doc.spec, "nlp", {})
    assert plan.tokens == [("nlp-lead", "queue-admin", "nlp")]
    assert plan.groups == [
        ("nlp-leads", "queue-admin", "nlp"),
        ("nlp", "member", "nlp"),
        ("ml-all", "member", "nlp"),
    ]
    bad = _with_groups()
    bad["spec"]["members"] = {"oidcGroups": ["{nope}"]}
    with pytest.raises(ManifestError, match=r"members\.oidcGroups\[0\]: unknown placeholder"):
        parse_documents(yaml.safe_dump(bad))
    bad["spec"]["members"] = {"groups": ["x"]}  # a misspelt key is refused, not ignored
    with pytest.raises(ManifestError, match="groups"):
        parse_documents(yaml.safe_dump(bad))


def test_group_grants_are_recorded_with_the_queues_or_not_at_all(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path}/g.db")
    [doc] = parse_documents((TEMPLATES / "research-group.yaml").read_text())
    plan = render(doc.spec, "robo", {})
    head = store.audit_head()
    entry = AuditEntry("t", "team.onboard", "Team", "robo")
    for groups, error in (
        ([("robo", "member", "robo-research"), ("", "member", "robo-research")], ValidationFailed),
        ([("robo", "member", "robo-research"), ("robo", "member", "robo-research")], Conflict),
        ([("robo", "platform-admin", "robo-research")], ValidationFailed),
    ):
        with pytest.raises(error):
            store.onboard_team(plan.queues, plan.tokens, entry, groups=groups)
        assert store.list_objects() == [] and store.list_tokens() == [] and store.audit_head() == head
        assert store.oidc_group_grants() == []
    store.onboard_team(plan.queues, plan.tokens, entry, groups=[("robo", "member", "robo-research")])
    assert store.oidc_group_grants() == [("robo", "member", "robo-research")]
    [rec] = [a for a in store.audit_records() if a.action == "team.onboard"]
    assert rec.detail["oidcGroups"] == [{"group": "robo", "role": "member", "scope": "robo-research"}]


def test_an_onboarded_teams_groups_sign_in_with_its_role(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.test_oidc import ISSUER, JWK, id_token

    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps({"keys": [JWK]}))
    cfg = {
        "issuer": ISSUER,
        "audience": "gpupool",
        "jwksFile": str(jwks),
        "groups": [{"group": "ml-platform", "role": "platform-admin"}],
    }
    (tmp_path / "oidc.yaml").write_text(yaml.safe_dump(cfg))
    monkeypatch.setenv("GPUPOOL_OIDC_CONFIG", str(tmp_path / "oidc.yaml"))
    with running_app(tmp_path / "state") as api:
        _room(api)
        lead = id_token(preferred_username="nadia", groups=["nlp-leads"])
        assert api.req("GET", "/v1/whoami", token=lead).status_code == 401  # no rule maps the group yet
        r = api.req("POST", "/v1/onboard", json={"template": _with_groups(), "team": "nlp"})
        assert r.status_code == 200, r.text
        assert {"group": "nlp-leads", "role": "queue-admin", "scope": "nlp"} in r.json()["oidcGroups"]
        who = api.get("/v1/whoami", token=lead)
        assert (who["name"], who["role"], who["scope"]) == ("nadia", "queue-admin", "nlp")
        member = id_token(preferred_username="max", groups=["nlp"])
        job = wl("sso-job", queue="nlp-experiments", priorityClass="experiment")
        assert api.req("POST", "/v1/workloads", token=member, json=job).status_code == 201
        assert (
            api.req("POST", "/v1/workloads", token=member, json=wl("sso-no", queue="vision-team")).status_code
            == 403
        )


# ---------------------------------------------------------------------- task-type defaults


def test_a_templates_type_defaults_go_onto_every_queue_it_creates() -> None:
    [doc] = parse_documents((TEMPLATES / "training-team.yaml").read_text())
    root, exp = render(doc.spec, "nlp", {}).queues
    assert root["spec"]["typeDefaults"] == exp["spec"]["typeDefaults"]
    assert root["spec"]["typeDefaults"]["training"] == {
        "priorityClass": "training",
        "preferredPools": ["h100-training"],
        "maxWait": "4h",
    }
    bad = template()
    bad["spec"]["typeDefaults"] = {"notebook": {"priorityClass": "experiment"}}  # not a task type
    with pytest.raises(ManifestError, match=r"spec\.typeDefaults.*notebook"):
        parse_documents(yaml.safe_dump(bad))
    bad["spec"]["typeDefaults"] = {"training": {"maxWait": "soon"}}
    with pytest.raises(ManifestError, match=r"spec\.typeDefaults.*maxWait"):
        parse_documents(yaml.safe_dump(bad))


def test_an_onboarded_queues_type_defaults_apply_to_its_work(tmp_path: Path) -> None:
    with running_app(tmp_path) as api:
        _room(api)
        r = api.req("POST", "/v1/onboard", json={"template": template(), "team": "nlp"})
        assert r.status_code == 200, r.text
        stored = api.get("/v1/config/queues/nlp-experiments")
        assert stored["spec"]["typeDefaults"]["evaluation"]["maxWait"] == "1h"
        job = wl("nlp-eval", queue="nlp-experiments", type="evaluation")
        del job["spec"]["priorityClass"]  # the type's default decides it
        assert api.req("POST", "/v1/workloads", json=job).status_code == 201
        why = api.get("/v1/workloads/nlp-eval/explain")["typeDefaults"]
        assert why["priorityClass"] == {"value": "experiment", "from": "queue nlp-experiments"}
        assert why["preferredPools"] == {"value": ["l40s-experiment"], "from": "queue nlp-experiments"}
