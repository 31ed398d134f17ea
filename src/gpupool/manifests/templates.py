"""``TeamTemplate`` (接入模板): how a kind of team is onboarded — its queues with guarantees
per pool, weight, default and allowed priority classes, task-type defaults, the pools that
need approval, and who administers it — written once, applied per team by ``gpupool onboard``.

Why a manifest kind and not a script: a template is reviewed, versioned and validated like
any other configuration (``gpupool validate`` renders it with its defaults and checks every
queue it would create), and the onboarding it drives is one atomic, previewed, audited step.
Names and values may use ``{team}`` and the template's ``parameters`` (``--set key=value``).
Task-type defaults (``typeDefaults``: task type -> priority class, preemptible, retries,
preferred pools, wait limit) are a Queue's own ``spec.typeDefaults`` and go onto every queue the
template creates, so the team's work gets them at admission. What the platform has no field for
(default and allowed priority classes, the older ``taskDefaults``) travels as annotations on the
team's queue, so it is recorded with it and shown with it.
"""

from __future__ import annotations

import json
import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field, ValidationError, model_validator

from gpupool.manifests.base import API_VERSION, ManifestErrors, StrictModel
from gpupool.manifests.documents import SPECS
from gpupool.manifests.queues import QueueSpec
from gpupool.manifests.task_types import parse_task_types

ANNOTATION = "gpupool.io/"


class TemplateQueue(StrictModel):
    """One queue the template creates; the first is the team's own queue (under ``parent``)."""

    name: str = Field(min_length=1, description="may use {team} and the parameters")
    spec: dict[str, Any] = Field(default_factory=dict, description="a Queue spec")


class TaskDefault(StrictModel):
    """What a task type (training, inference, notebook ...) gets unless it says otherwise."""

    priorityClass: str | None = None
    pool: str | None = None
    maxDuration: str | None = None


class Grantees(StrictModel):
    """Who gets a role over the team's queue: people or robots by token, and OIDC groups whose
    members get the role when they sign in (gpupool.oidc); either, or both."""

    tokens: list[str] = Field(default_factory=list, description="token names (may use {team})")
    oidcGroups: list[str] = Field(
        default_factory=list, description="identity-provider groups (may use {team})"
    )


class TeamTemplateSpec(StrictModel):
    description: str = ""
    parameters: dict[str, str | int | float] = Field(default_factory=dict)
    parent: str | None = None
    weight: float = Field(default=1.0, gt=0, le=1e6)
    queues: list[TemplateQueue] = Field(min_length=1)
    defaultPriorityClass: str | None = None
    priorityClasses: list[str] = Field(default_factory=list)
    taskDefaults: dict[str, TaskDefault] = Field(default_factory=dict)
    #: a Queue's spec.typeDefaults (task type -> defaults), set on every queue created
    typeDefaults: dict[str, Any] = Field(default_factory=dict)
    approvalPools: list[str] = Field(default_factory=list)
    #: a list is token names (as before); a mapping names tokens and/or OIDC groups
    admins: list[str] | Grantees = Field(default_factory=list)
    members: list[str] | Grantees = Field(default_factory=list)

    @model_validator(mode="after")
    def _renders(self) -> TeamTemplateSpec:
        """Every queue the template would create is a valid Queue (rendered with its defaults)."""
        render(self, "team", {})
        return self


class TemplateError(ValueError):
    """A template that cannot be rendered for this team and these values (names the field)."""


@dataclass(slots=True)
class Onboarding:
    """What onboarding a team creates: Queue manifests, token grants (name, role, scope) and
    OIDC group grants (group, role, scope)."""

    team: str
    queues: list[dict[str, Any]] = field(default_factory=list)
    tokens: list[tuple[str, str, str]] = field(default_factory=list)
    groups: list[tuple[str, str, str]] = field(default_factory=list)


def grantees(value: list[str] | Grantees) -> Grantees:
    """The mapping form of ``admins``/``members`` (a plain list is token names)."""
    return value if isinstance(value, Grantees) else Grantees(tokens=list(value))


def _values(spec: TeamTemplateSpec, team: str, sets: Mapping[str, str]) -> dict[str, str]:
    unknown = sorted(set(sets) - set(spec.parameters) - {"parent"})
    if unknown:
        known = ", ".join(sorted(spec.parameters)) or "none"
        raise TemplateError(f"--set {unknown[0]}: not a parameter of this template (parameters: {known})")
    vals = {k: str(v) for k, v in spec.parameters.items()}
    vals.update(sets)
    vals["team"] = team
    return vals


def _fill(value: Any, vals: Mapping[str, str], where: str) -> Any:
    """``value`` with every ``{name}`` in its strings replaced; a number stays a number when a
    string is exactly one placeholder of a numeric value."""
    if isinstance(value, str):
        names = [f for _, f, _, _ in string.Formatter().parse(value) if f is not None]
        for n in names:
            if n not in vals:
                raise TemplateError(f"{where}: unknown placeholder {{{n}}}; known: {', '.join(sorted(vals))}")
        out = value.format_map(vals)
        if names and value == "{" + names[0] + "}":
            try:
                return int(out)
            except ValueError:
                return out
        return out
    if isinstance(value, Mapping):
        return {k: _fill(v, vals, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, vals, f"{where}[{i}]") for i, v in enumerate(value)]
    return value


def render(spec: TeamTemplateSpec, team: str, sets: Mapping[str, str]) -> Onboarding:
    """The queues and tokens of ``team`` from the template; TemplateError naming the field."""
    vals = _values(spec, team, sets)
    out = Onboarding(team)
    types = _type_defaults(spec, vals)
    root = ""
    for i, tq in enumerate(spec.queues):
        name = str(_fill(tq.name, vals, f"spec.queues[{i}].name"))
        root = root or name
        qspec = _queue_spec(spec, i, vals, root if i else None, types)
        out.queues.append(_queue(name, qspec, spec, team, root == name))
    for role, key, raw in (("queue-admin", "admins", spec.admins), ("member", "members", spec.members)):
        who = grantees(raw)
        plain = isinstance(raw, list)  # a plain list keeps its old field path in messages
        for i, name in enumerate(who.tokens):
            where = f"spec.{key}[{i}]" if plain else f"spec.{key}.tokens[{i}]"
            out.tokens.append((str(_fill(name, vals, where)), role, root))
        for i, group in enumerate(who.oidcGroups):
            out.groups.append((_group(group, vals, f"spec.{key}.oidcGroups[{i}]"), role, root))
    return out


def _type_defaults(spec: TeamTemplateSpec, vals: Mapping[str, str]) -> dict[str, Any]:
    """The template's task-type defaults, filled and checked as a Queue's (known task types,
    known fields, a wait limit that is a duration)."""
    if not spec.typeDefaults:
        return {}
    types = dict(_fill(spec.typeDefaults, vals, "spec.typeDefaults"))
    err = ManifestErrors()
    parse_task_types(types, "spec.typeDefaults", err)
    if err.items:
        raise TemplateError(err.items[0])
    return types


def _queue_spec(
    spec: TeamTemplateSpec, i: int, vals: Mapping[str, str], root: str | None, types: Mapping[str, Any]
) -> dict[str, Any]:
    """Queue ``i``'s spec: the team's queue (``root`` None) goes under ``parent`` with the
    template's weight, the others under the team's queue; each gets the task-type defaults
    (unless it names its own) and needs approval where it has a quota in an approval pool."""
    where = f"spec.queues[{i}]"
    qspec = dict(_fill(spec.queues[i].spec, vals, f"{where}.spec"))
    if root is None:
        parent = vals.get("parent", spec.parent)
        if parent:
            qspec.setdefault("parent", _fill(parent, vals, "spec.parent"))
        qspec.setdefault("weight", int(spec.weight) if spec.weight.is_integer() else spec.weight)
    else:
        qspec.setdefault("parent", root)
    if types:
        qspec.setdefault("typeDefaults", dict(types))
    pools = {str(q.get("pool")) for q in qspec.get("quotas") or [] if isinstance(q, Mapping)}
    if pools & set(spec.approvalPools):
        qspec["requiresApproval"] = True
    try:
        QueueSpec.model_validate(qspec)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(x) for x in first["loc"])
        raise TemplateError(f"{where}.spec.{loc}: {first['msg']}") from exc
    return qspec


def _group(raw: str, vals: Mapping[str, str], where: str) -> str:
    group = str(_fill(raw, vals, where)).strip()
    if not group or len(group) > 253:
        raise TemplateError(f"{where}: a group name of 1 to 253 characters")
    return group


def _queue(name: str, qspec: dict[str, Any], spec: TeamTemplateSpec, team: str, root: bool) -> dict[str, Any]:
    notes = {f"{ANNOTATION}team": team}
    if root:
        if spec.defaultPriorityClass:
            notes[f"{ANNOTATION}default-priority-class"] = spec.defaultPriorityClass
        if spec.priorityClasses:
            notes[f"{ANNOTATION}priority-classes"] = ",".join(spec.priorityClasses)
        if spec.taskDefaults:
            tasks = {k: v.model_dump(exclude_none=True) for k, v in spec.taskDefaults.items()}
            notes[f"{ANNOTATION}task-defaults"] = json.dumps(tasks, sort_keys=True)
        if spec.approvalPools:
            notes[f"{ANNOTATION}approval-pools"] = ",".join(spec.approvalPools)
    meta = {"name": name, "labels": {f"{ANNOTATION}team": team}, "annotations": notes}
    return {"apiVersion": API_VERSION, "kind": "Queue", "metadata": meta, "spec": qspec}


SPECS.setdefault("TeamTemplate", TeamTemplateSpec)

__all__ = [
    "Grantees",
    "Onboarding",
    "TaskDefault",
    "TeamTemplateSpec",
    "TemplateError",
    "TemplateQueue",
    "grantees",
    "render",
]
