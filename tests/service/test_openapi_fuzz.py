"""Schemathesis against the in-process app: every answer must match the OpenAPI document.

Why: the document is what clients are generated from; an undeclared status, content type or
body shape is a bug in the API as much as a 500 is. Schemathesis generates requests from the
document (valid ones, and invalid ones that must be refused with a declared 4xx), sends them
over ASGI to the real app with its controller running, and checks each answer:

* no 5xx (not_a_server_error), status codes, content types and response headers declared,
  bodies conforming to the declared schemas;
* without a token, every /v1 operation answers 401 with the house error body (or 422 for a
  request with a NUL character, which the request guard refuses before authentication).

Bounded for `make test`: EXAMPLES per operation and mode, a fixed seed (derandomize) so a run
is reproducible, and a time budget after which the remaining operations are skipped (and named
in the output). The only request kept out of the fuzz: revoking the fuzzer's own token (it
would turn every later answer into a 401, which is correct but tests nothing).
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.python.asgi import shutdown_lifespans  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from gpupool.service.api import create_app  # noqa: E402
from gpupool.service.config import ServiceConfig  # noqa: E402
from tests.test_service_support import wl  # noqa: E402

EXAMPLES = int(os.environ.get("GPUPOOL_FUZZ_EXAMPLES", "12"))
"""Generated requests per operation and generation mode (positive, negative); raise it for a
deeper run by hand, e.g. GPUPOOL_FUZZ_EXAMPLES=100 GPUPOOL_FUZZ_BUDGET_S=600."""
BUDGET_S = float(os.environ.get("GPUPOOL_FUZZ_BUDGET_S", "70"))
"""Wall-clock budget of the authenticated run; operations left when it is spent are skipped."""
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
]
KNOWN_SERVER_ERRORS: set[tuple[str, str]] = set()
"""(operation, failure kind) pairs owned by other work in progress; empty means strict."""


@dataclass
class Tally:
    """What a run did: examples sent and failures by (operation, kind), with one sample each."""

    examples: int = 0
    operations: int = 0
    skipped: list[str] = field(default_factory=list)
    failures: Counter[tuple[str, str]] = field(default_factory=Counter)
    samples: dict[tuple[str, str], str] = field(default_factory=dict)

    def record(self, label: str, kind: str, text: str) -> None:
        self.failures[(label, kind)] += 1
        self.samples.setdefault((label, kind), text[:1500])

    def report(self, title: str) -> str:
        lines = [
            f"{title}: {self.operations} operations, {self.examples} examples, "
            f"{sum(self.failures.values())} failures"
        ]
        lines += [f"  skipped (time budget): {', '.join(self.skipped)}"] if self.skipped else []
        for (label, kind), n in sorted(self.failures.items()):
            lines.append(f"  {n} x {kind} on {label}\n    {self.samples[(label, kind)]}")
        return "\n".join(lines)


@dataclass
class Fuzz:
    schema: Any
    token: str
    token_id: int


@pytest.fixture(scope="module")
def fuzz(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fuzz]:
    """The app with its controller, loaded by schemathesis (which runs its lifespan over ASGI)."""
    state = Path(tmp_path_factory.mktemp("fuzz"))
    cfg = ServiceConfig(state_dir=state, time_scale=3600.0, tick_s=0.05, min_interval_s=0.0)
    app = create_app(cfg)
    try:
        schema = schemathesis.openapi.from_asgi("/openapi.json", app)
        token = app.state.svc.bootstrap_token or (state / "admin-token").read_text().strip()
        own = next(t.id for t in app.state.svc.store.list_tokens() if t.name == "bootstrap-admin")
        _seed(schema, token)
        yield Fuzz(schema, token, own)
    finally:
        shutdown_lifespans()


def _seed(schema: Any, token: str) -> None:
    """A few workloads, so that some generated names and listings find something."""
    op = schema["/v1/workloads"]["POST"]
    for i, queue in enumerate(["llm-research", "llm-research", "serving"]):
        case = op.Case(body=wl(f"fuzz-seed-{i}", queue=queue), media_type="application/json")
        case.call(headers={"Authorization": f"Bearer {token}"})


def _failure_texts(exc: BaseException) -> list[tuple[str, str]]:
    group = exc.exceptions if isinstance(exc, BaseExceptionGroup) else (exc,)
    return [(type(f).__name__, str(f)) for f in group]


def _run_operation(op: Any, mode: GenerationMode, body: Callable[[Any], None], keep: Any = None) -> None:
    strategy = op.as_strategy(generation_mode=mode)
    if keep is not None:
        strategy = strategy.filter(keep)

    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def run(case: Any) -> None:
        body(case)

    try:
        run()
    except Exception as exc:
        # an operation with nothing to negate (no parameters, no body) has no negative cases
        if type(exc).__name__ != "Unsatisfiable":
            raise


def _has_nul(case: Any) -> bool:
    """A NUL anywhere in the request: the request guard refuses it (422) before authentication."""
    parts = [case.path_parameters, case.query, case.headers, getattr(case, "body", None)]
    return "\\u0000" in json.dumps(parts, default=str)


def _operations(schema: Any) -> list[Any]:
    return [r.ok() for r in schema.get_all_operations()]


def test_fuzz_authenticated_answers_match_the_document(fuzz: Fuzz) -> None:
    tally = Tally()
    headers = {"Authorization": f"Bearer {fuzz.token}"}
    start = time.monotonic()

    def not_own_token(case: Any) -> bool:
        return str(case.path_parameters.get("token_id") if case.path_parameters else "") != str(fuzz.token_id)

    for op in _operations(fuzz.schema):
        if time.monotonic() - start > BUDGET_S:
            tally.skipped.append(op.label)
            continue
        tally.operations += 1

        def call(case: Any, label: str = op.label) -> None:
            tally.examples += 1
            try:
                case.call_and_validate(headers=headers, checks=CHECKS)
            except (Exception, BaseExceptionGroup) as exc:
                for kind, text in _failure_texts(exc):
                    tally.record(label, kind, text)

        keep = not_own_token if "{token_id}" in op.path else None
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            _run_operation(op, mode, call, keep)
    print(tally.report("schemathesis, admin token"), f"in {time.monotonic() - start:.1f}s")
    unexpected = {k: n for k, n in tally.failures.items() if k not in KNOWN_SERVER_ERRORS}
    assert not unexpected, tally.report("schemathesis, admin token")
    assert tally.examples >= tally.operations * 2


def test_fuzz_without_token_every_v1_operation_answers_401(fuzz: Fuzz) -> None:
    tally = Tally()
    for op in _operations(fuzz.schema):
        if not op.path.startswith("/v1/"):
            continue  # health and metrics are public
        tally.operations += 1

        def call(case: Any, label: str = op.label) -> None:
            tally.examples += 1
            try:
                resp = case.call()
                case.validate_response(resp, checks=CHECKS)
                if resp.status_code != 401 and not (resp.status_code == 422 and _has_nul(case)):
                    tally.record(label, f"status {resp.status_code}", resp.text[:300])
            except (Exception, BaseExceptionGroup) as exc:
                for kind, text in _failure_texts(exc):
                    tally.record(label, kind, text)

        _run_operation(op, GenerationMode.POSITIVE, call)
    print(tally.report("schemathesis, no token"))
    assert not tally.failures, tally.report("schemathesis, no token")
