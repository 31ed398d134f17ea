"""Authorization matrix: every role x action x representative resource, table-driven."""

from __future__ import annotations

import itertools
import re

import pytest

from gpupool.auth import (
    TOKEN_PREFIX,
    Action,
    Principal,
    Resource,
    Role,
    authorize,
    generate_token,
    hash_token,
    parse_bearer,
    token_matches,
)

# Queue tree: org -> team-a -> a-dev ; org -> team-b
PARENT = {"org": None, "team-a": "org", "a-dev": "team-a", "team-b": "org"}


def is_in_subtree(queue: str, root: str) -> bool:
    q: str | None = queue
    while q is not None:
        if q == root:
            return True
        q = PARENT.get(q)
    return False


PRINCIPALS = {
    "admin": Principal("root", Role.PLATFORM_ADMIN),
    "qadmin": Principal("qa", Role.QUEUE_ADMIN, scope="team-a"),
    "member": Principal("alice", Role.MEMBER, scope="team-a"),
    "viewer-a": Principal("vera", Role.VIEWER, scope="team-a"),
    "viewer-all": Principal("vic", Role.VIEWER),
}

RESOURCES = {
    "wl-own": Resource("Workload", "w1", queue="a-dev", owner="alice"),
    "wl-other": Resource("Workload", "w2", queue="a-dev", owner="bob"),
    "wl-outside": Resource("Workload", "w3", queue="team-b", owner="alice"),
    "queue-child": Resource("Queue", "a-dev", queue="team-a"),  # parent in subtree
    "queue-root": Resource("Queue", "team-a", queue="org"),  # the scope root itself
    "queue-outside": Resource("Queue", "team-b", queue="org"),
    "pool": Resource("ResourcePool", "h100"),
    "pclass": Resource("PriorityClass", "high"),
    "cluster": Resource("Cluster", "main"),
    "audit": Resource("Audit"),
    "token": Resource("Token", "t"),
}
ALL = frozenset(RESOURCES)
CONFIG = frozenset({"queue-child", "queue-root", "queue-outside", "pool", "pclass", "cluster"})
IN_SCOPE_WL = frozenset({"wl-own", "wl-other"})

# EXPECTED[principal][action] = resources on which the action is allowed; all others must be denied.
EXPECTED: dict[str, dict[Action, frozenset[str]]] = {
    "admin": {a: ALL for a in Action},
    "qadmin": {
        Action.READ: CONFIG | IN_SCOPE_WL,
        Action.CREATE: frozenset({"queue-child"}),
        Action.UPDATE: frozenset({"queue-child"}),
        Action.DELETE: frozenset({"queue-child"}),
        Action.SUBMIT: IN_SCOPE_WL,
        Action.CANCEL: IN_SCOPE_WL,
        Action.APPROVE: IN_SCOPE_WL,
        Action.READ_AUDIT: frozenset(),
        Action.MANAGE_TOKENS: frozenset(),
    },
    "member": {
        Action.READ: CONFIG | IN_SCOPE_WL,
        Action.CREATE: frozenset(),
        Action.UPDATE: frozenset(),
        Action.DELETE: frozenset(),
        Action.SUBMIT: IN_SCOPE_WL,
        Action.CANCEL: frozenset({"wl-own"}),
        Action.APPROVE: frozenset(),
        Action.READ_AUDIT: frozenset(),
        Action.MANAGE_TOKENS: frozenset(),
    },
    "viewer-a": {a: frozenset() for a in Action} | {Action.READ: CONFIG | IN_SCOPE_WL},
    "viewer-all": {a: frozenset() for a in Action}
    | {Action.READ: CONFIG | {"wl-own", "wl-other", "wl-outside"}},
}


def test_table_covers_every_role_and_action() -> None:
    assert {p.role for p in PRINCIPALS.values()} == set(Role)
    for name, row in EXPECTED.items():
        assert set(row) == set(Action), name
        for allowed in row.values():
            assert allowed <= ALL


CASES = list(itertools.product(PRINCIPALS, Action, RESOURCES))


@pytest.mark.parametrize(("who", "action", "res"), CASES, ids=["-".join(map(str, c)) for c in CASES])
def test_matrix(who: str, action: Action, res: str) -> None:
    principal = PRINCIPALS[who]
    decision = authorize(principal, action, RESOURCES[res], is_in_subtree)
    expected = res in EXPECTED[who][action]
    assert decision.allowed is expected, decision.reason
    assert bool(decision) is expected
    assert decision.reason
    if not expected:
        assert principal.role.value in decision.reason or "unknown" in decision.reason


def test_denials_explain_scope() -> None:
    d = authorize(PRINCIPALS["member"], Action.SUBMIT, RESOURCES["wl-outside"], is_in_subtree)
    assert not d.allowed
    assert "team-a" in d.reason and "team-b" in d.reason
    d = authorize(PRINCIPALS["member"], Action.CANCEL, RESOURCES["wl-other"], is_in_subtree)
    assert "own" in d.reason and "bob" in d.reason
    d = authorize(PRINCIPALS["qadmin"], Action.UPDATE, RESOURCES["queue-root"], is_in_subtree)
    assert not d.allowed and "parent" in d.reason


def test_unknown_role_and_action_denied() -> None:
    weird = Principal("x", "superuser")  # type: ignore[arg-type]
    d = authorize(weird, Action.READ, RESOURCES["pool"], is_in_subtree)
    assert not d.allowed and "unknown role" in d.reason
    d = authorize(PRINCIPALS["admin"], "explode", RESOURCES["pool"], is_in_subtree)
    assert not d.allowed and "unknown action" in d.reason


def test_scoped_role_without_scope_denied() -> None:
    for role in (Role.MEMBER, Role.QUEUE_ADMIN):
        d = authorize(Principal("x", role), Action.READ, RESOURCES["pool"], is_in_subtree)
        assert not d.allowed and "scope" in d.reason


def test_workload_without_queue_is_out_of_scope() -> None:
    d = authorize(PRINCIPALS["member"], Action.SUBMIT, Resource("Workload", "w"), is_in_subtree)
    assert not d.allowed


def test_unknown_kind_denied_for_non_admin() -> None:
    d = authorize(PRINCIPALS["qadmin"], Action.READ, Resource("Secret", "s"), is_in_subtree)
    assert not d.allowed


def test_tokens() -> None:
    t1, h1 = generate_token()
    t2, h2 = generate_token()
    assert t1 != t2 and h1 != h2
    assert t1.startswith(TOKEN_PREFIX) and len(t1) > 40
    assert re.fullmatch(r"[0-9a-f]{64}", h1)
    assert hash_token(t1) == h1 and h1 != t1
    assert token_matches(t1, h1) and not token_matches(t2, h1)


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("Bearer abc", "abc"),
        ("bearer  abc ", "abc"),
        ("Basic abc", None),
        ("Bearer ", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_bearer(header: str | None, expected: str | None) -> None:
    assert parse_bearer(header) == expected
