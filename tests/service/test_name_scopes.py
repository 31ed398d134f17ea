"""No name oracle across teams: a workload name is unique among the workloads the caller can
read (gpupool.service.usecases.scoped_names).

Rule under test: a name held by a workload the caller cannot read answers exactly as a fresh
name would (status and body shape, via ``POST /v1/workloads`` and ``POST /v1/apply``); a name
held by a workload the caller can read keeps the 409; both teams then read, list, explain,
resubmit and cancel their own workload by the one name, on SQLite and PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.test_service_support import Api, db_url, running_app, wl

__all__ = ["db_url"]

TEAM_QUEUE = {"alice": "llm-research", "carol": "llm-research", "bob": "vision-team", "dave": "vision-team"}
CALLERS = {"alice": "llm-research", "bob": "vision-team", "admin": "llm-research", "viewer": "llm-research"}
# who holds the name first: a teammate of the caller ("own") or a member of the other team
HOLDER = {
    "alice": {"own": "carol", "other": "dave"},
    "bob": {"own": "dave", "other": "carol"},
    "admin": {"own": "carol", "other": "dave"},
    "viewer": {"own": "carol", "other": "dave"},
}
# (fresh, own team's name, other team's name): admin reads every team, a viewer submits nothing
EXPECTED = {
    "alice": (201, 409, 201),
    "bob": (201, 409, 201),
    "admin": (201, 409, 409),
    "viewer": (403, 403, 403),
}


@pytest.fixture
def world(tmp_path: Path, db_url: str) -> Iterator[tuple[Api, dict[str, str]]]:
    with running_app(tmp_path, db_url) as api:
        tokens = {"admin": str(api.token), "viewer": api.token_for("viewer", "viewer", None)}
        for n, q in TEAM_QUEUE.items():
            tokens[n] = api.token_for(n, "member", q)
        yield api, tokens


def _held(api: Api, tokens: dict[str, str], holder: str, name: str) -> None:
    job = wl(name, queue=TEAM_QUEUE[holder], duration="1h")
    r = api.req("POST", "/v1/workloads", token=tokens[holder], json=job)
    assert r.status_code == 201, r.text


def _submit(api: Api, token: str, via: str, job: dict[str, Any]) -> tuple[int, Any]:
    """The status and the body's shape: its keys, and the name it reports."""
    if via == "post":
        r = api.req("POST", "/v1/workloads", token=token, json=job)
    else:
        r = api.req("POST", "/v1/apply", token=token, json={"items": [job]})
    body = r.json()
    if r.status_code >= 400:
        return r.status_code, sorted(body)
    if via == "post":
        return r.status_code, (sorted(body), body["name"], body["queue"], body["owner"])
    return r.status_code, (sorted(body), [(x["name"], x["result"]) for x in body["results"]])


def _shape(got: tuple[int, Any], name: str) -> tuple[int, Any]:
    """``got`` with the probed name written generically, to compare across names."""
    return got[0], repr(got[1]).replace(name, "NAME")


@pytest.mark.parametrize("via", ["post", "apply"])
def test_another_teams_name_answers_as_a_fresh_name(world: tuple[Api, dict[str, str]], via: str) -> None:
    api, tokens = world
    for caller, queue in CALLERS.items():
        answers = []
        for case in ("fresh", "own", "other"):
            name = f"{caller}-{via}-{case}"
            if case != "fresh":
                _held(api, tokens, HOLDER[caller][case], name)
            answers.append(_shape(_submit(api, tokens[caller], via, wl(name, queue=queue)), name))
        created = 201 if via == "post" else 200  # an apply answers 200 with each object's result
        want = tuple(created if c == 201 else c for c in EXPECTED[caller])
        assert tuple(a[0] for a in answers) == want, (caller, answers)
        if caller in ("alice", "bob"):  # the other team's name leaves no trace in the answer
            assert answers[2] == answers[0], (caller, answers)


def test_both_teams_address_their_own_workload_by_the_one_name(world: tuple[Api, dict[str, str]]) -> None:
    api, tokens = world
    _held(api, tokens, "dave", "shared")  # team B first
    mine = wl("shared", queue="llm-research", duration="1h")
    first = api.req("POST", "/v1/workloads", token=tokens["alice"], json=mine)
    assert first.status_code == 201, first.text
    assert first.json()["name"] == "shared" and first.json()["key"] != "shared"
    # a resubmission is idempotent, by POST and by apply; a teammate's different one is a 409
    assert api.req("POST", "/v1/workloads", token=tokens["alice"], json=mine).status_code == 200
    again = api.req("POST", "/v1/apply", token=tokens["alice"], json={"items": [mine]})
    assert again.status_code == 200 and again.json()["results"][0]["result"] == "unchanged", again.text
    other = wl("shared", queue="llm-research", gpus=2)
    assert api.req("POST", "/v1/workloads", token=tokens["carol"], json=other).status_code == 409
    for who, queue, owner in (("alice", "llm-research", "alice"), ("carol", "llm-research", "alice")):
        got = api.req("GET", "/v1/workloads/shared", token=tokens[who]).json()
        assert (got["name"], got["queue"], got["owner"]) == ("shared", queue, owner)
    got = api.req("GET", "/v1/workloads/shared", token=tokens["bob"]).json()
    assert (got["name"], got["key"], got["owner"]) == ("shared", "shared", "dave")
    for path in ("events", "explain"):
        assert api.req("GET", f"/v1/workloads/shared/{path}", token=tokens["alice"]).status_code == 200
    listed = api.req("GET", "/v1/workloads", token=tokens["alice"]).json()["items"]
    assert [(w["name"], w["owner"]) for w in listed if w["name"] == "shared"] == [("shared", "alice")]
    cancelled = api.req("POST", "/v1/workloads/shared/cancel", token=tokens["alice"])
    assert cancelled.status_code == 200 and cancelled.json()["owner"] == "alice", cancelled.text
    theirs = api.req("GET", "/v1/workloads/shared", token=tokens["dave"]).json()
    assert theirs["owner"] == "dave" and theirs["phase"] != "Cancelled"
    assert api.req("POST", "/v1/workloads/shared/cancel", token=tokens["dave"]).status_code == 200
    # the admin reads both: the name is team B's, team A's is addressed by its key
    assert api.get("/v1/workloads/shared")["owner"] == "dave"
    assert api.get(f"/v1/workloads/{first.json()['key']}")["owner"] == "alice"


def test_a_hand_written_name_annotation_does_not_rename_a_workload(world: tuple[Api, dict[str, str]]) -> None:
    api, tokens = world
    job = wl("plain", queue="llm-research")
    job["metadata"]["annotations"] = {"gpupool.io/name": "someone-else"}
    r = api.req("POST", "/v1/workloads", token=tokens["alice"], json=job)
    assert r.status_code == 201 and (r.json()["name"], r.json()["key"]) == ("plain", "plain"), r.text
