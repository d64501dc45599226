"""The OpenAPI document against the running app (SPEC §27): schemathesis' engine, every check it has (response
status, content type, headers and schema conformance, positive and negative data, auth, methods, stateful
links), in-process against the ASGI app, authenticated as an org's owner. Any mismatch fails the test.

Bounded (examples per operation, steps, a time limit) to about a minute on the project's two-core machine.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from schemathesis.config import SchemathesisConfig
from schemathesis.config._checks import POSITIVE_DATA_ACCEPTANCE_EXPECTED_STATUSES as POSITIVE
from schemathesis.engine import events
from schemathesis.python import asgi

from space.app import create_app
from space.config import Settings
from space.db import Database
from space.exports.pipeline import run_export
from tests.exports.fixtures import add_project, add_tickets, create_export, runner, uid
from tests.helpers import Api, Org

pytestmark = [pytest.mark.fuzz, pytest.mark.slow]

MAX_EXAMPLES = 5
"""Fuzzed examples per operation and phase (the coverage phase adds its own edge cases on top)."""

REFUSED_BY_RULE = {
    "/orgs/{org_id}/deletion": "POST: `confirm` must be the org's name (SPEC §3), which no schema can say",
    "/orgs/{org_id}/webhooks": "POST: `url` must be https, or http to a public host, once resolved (SPEC §12)",
    "/orgs/{org_id}/audit": "GET: `before` is an opaque cursor that only this org's trail made (SPEC §12)",
}
"""Operations where a request the document admits may still be 400: schemathesis' positive-data check expects
those to succeed, so for these (and only these) a 400 `invalid_request` is also an expected answer."""

NOT_REST_SEMANTICS = [
    (
        "POST",
        "/orgs/{org_id}/members",
        "ensure_resource_availability",
        "404 names an unknown email (SPEC §4), not the org just created",
    ),
    (
        "GET",
        "/orgs/{org_id}/exports/{export_id}",
        "use_after_free",
        "DELETE of a queued or running export cancels it: it stays, `cancelled` (SPEC §4)",
    ),
]
"""Stateful checks whose notion of create and delete the API answers otherwise, on purpose; each is switched off
for that one operation only."""


@pytest.fixture(scope="module")
async def seeded(api: Api, db: Database, settings: Settings) -> dict[str, Any]:
    """An org with tickets, a project with a task, finished exports of each kind and one queued."""
    org: Org = await api.org("Conformance")
    numbers = await add_tickets(db, org.id, org.member, ["first", "second"])
    project = await add_project(db, org.id, "Roadmap", ["write"])
    exports = []
    for body in ({"kind": "snapshot"}, {"kind": "tickets_csv"}, {"kind": "archive"}):
        export = await create_export(api, org, org.owner, body)
        assert await run_export(runner(settings, db), uid(export["id"]), uid(org.id)) == "completed"
        exports.append(export["id"])
    r = await api.call("POST", org.path("/webhooks"), org.owner, json={"url": "https://example.test/hook"})
    webhooks = [r.json()["id"]] if r.status_code == 201 else []
    return {
        "org": org,
        "org_id": [org.id],
        "export_id": exports,
        "project_id": [str(project)],
        "number": [str(n) for n in numbers],
        "user_id": [str(org.member.id), str(org.customer.id)],
        "webhook_id": webhooks or [org.id],
    }


@pytest.fixture(scope="module")
def loaded(settings: Settings, seeded: dict[str, Any]) -> Iterator[Any]:
    """The document of a fresh app, loaded by schemathesis with the run's configuration."""
    org: Org = seeded["org"]
    names = ["org_id", "export_id", "project_id", "number", "user_id", "webhook_id"]
    config = SchemathesisConfig.from_dict(
        {
            "seed": 36,
            "continue-on-failure": True,
            "suppress-health-check": ["all"],
            "generation": {"max-examples": MAX_EXAMPLES, "database": "none", "deterministic": True},
            "checks": {"enabled": True},
            "phases": {"stateful": {"max-steps": 6}},
            "auth": {"openapi": {"bearer": {"bearer": org.owner.token}}},
            # Real ids in the paths most of the time, so the handlers are reached, not only the 404 gate.
            "dictionaries": {name: {"values": seeded[name]} for name in names},
            "parameters": {f"path.{name}": {"dictionary": name, "probability": 0.8} for name in names},
            "operations": [
                *(
                    {
                        "include-path": path,
                        "checks": {"positive_data_acceptance": {"expected-statuses": [*POSITIVE, 400]}},
                    }
                    for path in REFUSED_BY_RULE
                ),
                *(
                    {"include-method": method, "include-path": path, "checks": {check: {"enabled": False}}}
                    for method, path, check, _ in NOT_REST_SEMANTICS
                ),
            ],
        }
    )
    schema = schemathesis.openapi.from_asgi("/schema/openapi.json", create_app(settings), config=config)
    yield schema
    asgi.shutdown_lifespans()


def test_every_answer_matches_the_document(loaded: Any) -> None:
    started = time.monotonic()
    failures: dict[str, list[str]] = collections.defaultdict(list)
    errors: list[str] = []
    ran: set[str] = set()
    requests = 0
    phases: dict[str, float] = {}
    per_phase: dict[str, int] = collections.Counter()
    for event in schemathesis.engine.from_schema(loaded).execute():
        if isinstance(event, events.PhaseStarted):
            phase_started = time.monotonic()
        elif isinstance(event, events.PhaseFinished):
            phases[event.phase.name.value] = phases.get(event.phase.name.value, 0) + time.monotonic() - phase_started
        elif isinstance(event, events.EngineFinished):
            print("stop", event.stop_reason, event.failures)
        if isinstance(event, events.ScenarioFinished):
            if event.label:
                ran.add(event.label)
            recorder = event.recorder
            requests += len(recorder.interactions)
            per_phase[event.phase.value] += len(recorder.interactions)
            for case_id, checks in recorder.checks.items():
                for check in checks:
                    if check.failure_info is not None:
                        failure = check.failure_info.failure
                        case = recorder.cases[case_id].value
                        response = recorder.interactions.get(case_id)
                        status = response.response.status_code if response and response.response else None
                        failures[f"{failure.code} {failure.title}"].append(
                            f"{case.method} {case.formatted_path} -> {status}: {failure.message[:300]}"
                        )
        elif isinstance(event, events.NonFatalError):
            errors.append(f"{event.label}: {event.info.format()[:500]}")
        elif isinstance(event, events.FatalError):
            raise event.exception
    elapsed = time.monotonic() - started
    report = "\n".join(
        f"{title} ({len(cases)}):\n  " + "\n  ".join(sorted(set(cases))[:8]) for title, cases in failures.items()
    )
    print(f"{requests} requests over {len(ran)} operations in {elapsed:.0f} s", phases, per_phase)
    assert not failures, report
    assert not errors, errors
