"""The OpenAPI document against the running app (SPEC §27): schemathesis' engine, every check it has (response
status, content type, headers and schema conformance, positive and negative data, auth, methods, stateful
links), in-process against the ASGI app, authenticated as an org's owner. Any mismatch fails the test.

Bounded by examples per operation and stateful steps (about 1,000 requests). The other tests hold what the run
relies on: every refusal of a route kind derived for a route nobody described, public routes without security,
closed request bodies, the export list's union, the Problem schema, OPTIONS' `Allow`.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
import schemathesis
from litestar import Controller, Litestar, post
from litestar.openapi import OpenAPIConfig
from litestar.params import FromPath, JSONBody
from litestar.testing import AsyncTestClient
from schemathesis.config import SchemathesisConfig
from schemathesis.config._checks import POSITIVE_DATA_ACCEPTANCE_EXPECTED_STATUSES as POSITIVE
from schemathesis.engine import StopReason, events
from schemathesis.python import asgi
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from space.app import create_app
from space.config import Settings
from space.db import Database
from space.exports.pipeline import run_export
from space.openapi import PROBLEM_SCHEMA, InputSchemas, complete_document
from space.orgs.deps import ADMINS
from space.problems import PROBLEM_JSON, Problem
from space.schemas import Input
from tests.exports.fixtures import add_project, add_tickets, create_export, runner, uid
from tests.helpers import Api, Org

MAX_EXAMPLES = 3
"""Fuzzed examples per operation and phase (the coverage phase adds its own edge cases on top)."""

REFUSED_BY_RULE = {
    ("POST", "/orgs/{org_id}/deletion"): "`confirm` must be the org's name (SPEC §3), which no schema can say",
    ("POST", "/orgs/{org_id}/webhooks"): "`url` must be https, or http to a public host, once resolved (SPEC §12)",
    ("POST", "/orgs/{org_id}/schedules"): (
        "`at` is for day and week, `weekday` for week, `filters` those of the kind's export request, and an archive is"
        " never incremental (SPEC §21)"
    ),
    ("PATCH", "/orgs/{org_id}/schedules/{schedule_id}"): "`at` is for day and week, `weekday` for week (SPEC §21)",
    ("GET", "/orgs/{org_id}/audit"): "`before` is an opaque cursor that only this org's trail made (SPEC §12)",
    ("GET", "/orgs/{org_id}/exports"): "`before` is an opaque cursor that only this org's export list made (SPEC §27)",
    ("GET", "/me/notifications"): "`before` is an opaque cursor that only the caller's own list made (SPEC §19)",
    (
        "PUT",
        "/me/preferences",
    ): "`email` keys are the event types known to this installation (SPEC §19: unknown is 400)",
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
                        "include-method": method,
                        "include-path": path,
                        "checks": {"positive_data_acceptance": {"expected-statuses": [*POSITIVE, 400]}},
                    }
                    for method, path in REFUSED_BY_RULE
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


@pytest.mark.fuzz
@pytest.mark.slow
# Bounded by examples, not by time (a time limit makes the engine cycle until it runs out); this only guards a hang.
@pytest.mark.timeout(300)
def test_every_answer_matches_the_document(loaded: Any) -> None:
    failures: dict[str, set[str]] = collections.defaultdict(set)
    errors: list[str] = []
    answered: dict[str, set[int]] = collections.defaultdict(set)
    finished: events.EngineFinished | None = None
    for event in schemathesis.engine.from_schema(loaded).execute():
        if isinstance(event, events.ScenarioFinished):
            _collect(event.recorder, failures, answered)
        elif isinstance(event, events.NonFatalError):
            errors.append(f"{event.label}: {event.info.format()[:500]}")
        elif isinstance(event, events.FatalError):
            raise event.exception
        elif isinstance(event, events.EngineFinished):
            finished = event
    assert finished is not None
    for failure in finished.failures:
        failures[f"{failure.code} {failure.title}"].add(failure.message[:300])
    report = "\n".join(f"{title}:\n  " + "\n  ".join(sorted(cases)[:8]) for title, cases in failures.items())
    assert not failures, report
    assert not errors, errors
    assert finished.stop_reason == StopReason.COMPLETED, finished.stop_reason
    # Every operation was called, and past the gates: the handlers answered, files and lists of each scope included.
    documented = {result.ok().label for result in loaded.get_all_operations()}
    assert documented <= set(answered), sorted(documented - set(answered))
    successes = {label for label, statuses in answered.items() if any(200 <= s < 300 for s in statuses)}
    assert len(successes) >= len(documented) * 2 // 3, sorted(documented - successes)
    assert 200 in answered["GET /orgs/{org_id}/exports/{export_id}/result"], answered


def _collect(recorder: Any, failures: dict[str, set[str]], answered: dict[str, set[int]]) -> None:
    """A scenario's failed checks (by failure code) and the statuses each operation answered."""
    for case_id, node in recorder.cases.items():
        interaction = recorder.interactions.get(case_id)
        if interaction is not None and interaction.response is not None:
            answered[node.value.operation.label].add(interaction.response.status_code)
        for check in recorder.checks.get(case_id, []):
            if check.failure_info is not None:
                failure, case = check.failure_info.failure, node.value
                status = interaction.response.status_code if interaction and interaction.response else None
                failures[f"{failure.code} {failure.title}"].add(
                    f"{case.method} {case.formatted_path} -> {status}: {failure.message[:300]}"
                )


@pytest.fixture(scope="module")
async def lists_org(api: Api) -> Org:
    """An org with no exports yet."""
    return await api.org("Lists")


def test_export_lists_of_each_scope_and_empty_ones_match(loaded: Any, lists_org: Org) -> None:
    """The export list is a union (issue 36: its `oneOf` refused every `scope=org` list and every empty one)."""
    org, headers = lists_org, lists_org.owner.headers
    listing = loaded["/orgs/{org_id}/exports"]["GET"]
    checks = [response_schema_conformance, status_code_conformance, content_type_conformance]

    def answer(scope: str) -> Any:
        case = listing.Case(path_parameters={"org_id": org.id}, query={"scope": scope})
        return case.call_and_validate(headers=headers, checks=checks).json()

    assert answer("own") == {"items": []} and answer("org") == {"items": []}
    create = loaded["/orgs/{org_id}/exports"]["POST"].Case(
        path_parameters={"org_id": org.id}, body={"kind": "snapshot"}
    )
    assert create.call_and_validate(headers=headers, checks=checks).status_code == 202
    own, every = answer("own")["items"], answer("org")["items"]
    assert (
        len(own) == len(every) == 1 and "creator" not in own[0] and every[0]["creator"]["userId"] == str(org.owner.id)
    )


class Thing(Input):
    """A body for the made-up route below."""

    name: str


class ThingController(Controller):
    """A route added later, with nothing declared for the document: it still gets every refusal of its kind."""

    path = "/orgs/{org_id:str}/things"
    opt = {"roles": ADMINS}

    @post("/")
    async def make(self, org_id: FromPath[str], data: JSONBody[Thing]) -> None:
        """Make a thing."""


def test_a_new_route_gets_its_refusals_without_hand_work() -> None:
    app = Litestar([ThingController], plugins=[InputSchemas()], openapi_config=OpenAPIConfig("t", "1"))
    doc = complete_document(app).to_schema()
    operation = doc["paths"]["/orgs/{org_id}/things"]["post"]
    assert operation["security"] == [{"bearer": []}]
    # Bearer, body, path, roles, an org's write, body size, database: each from what the route is, not from a list.
    assert sorted(operation["responses"]) == ["201", "400", "401", "403", "404", "409", "413", "503"]
    for status in ("401", "409"):
        content = operation["responses"][status]["content"]
        assert content == {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}}
    assert "org_suspended" in operation["responses"]["409"]["description"]
    assert doc["components"]["schemas"]["Thing"]["additionalProperties"] is False


async def test_public_routes_need_no_token_and_every_other_says_401(client: AsyncTestClient) -> None:  # type: ignore[type-arg]
    doc = (await client.get("/schema/openapi.json")).json()
    public = {
        ("get", "/health"),
        ("get", "/ready"),
        ("get", "/schemas/snapshot-v1.json"),
        ("get", "/schemas/manifest-v1.json"),
        ("get", "/schemas/manifest-v2.json"),
        *(("get", f"/schemas/{name}-v2.json") for name in ("members", "projects", "tasks", "tickets")),
    }
    for path, item in doc["paths"].items():
        for method, operation in item.items():
            if (method, path) in public:
                assert operation["security"] == [] and "401" not in operation["responses"], (method, path)
                continue
            assert operation["security"], (method, path)
            assert "unauthenticated" in operation["responses"]["401"]["description"], (method, path)
            for status, answer in operation["responses"].items():
                if int(status) >= 400:
                    assert list(answer["content"]) == [PROBLEM_JSON], (method, path, status)


async def test_every_request_body_refuses_unknown_fields(client: AsyncTestClient) -> None:  # type: ignore[type-arg]
    doc = (await client.get("/schema/openapi.json")).json()
    schemas = doc["components"]["schemas"]
    seen: set[str] = set()

    def closed(schema: dict[str, Any], where: str) -> None:
        if "$ref" in schema:
            name = schema["$ref"].rsplit("/", 1)[1]
            if name not in seen:
                seen.add(name)
                closed(schemas[name], name)
            return
        for key in ("oneOf", "anyOf", "allOf"):
            for member in schema.get(key, []):
                closed(member, where)
        if schema.get("type") == "object" and "properties" in schema:
            assert schema.get("additionalProperties") is False, where
        for value in (*schema.get("properties", {}).values(), *([schema["items"]] if "items" in schema else [])):
            closed(value, where)

    bodies = [
        (path, method, op["requestBody"]["content"]["application/json"]["schema"])
        for path, item in doc["paths"].items()
        for method, op in item.items()
        if "requestBody" in op
    ]
    for path, method, schema in bodies:
        closed(schema, f"{method} {path}")
    assert {"OrgCreate", "TicketsCsvRequest", "TicketFilters", "DeletionRequest"} <= seen, seen


def test_the_problem_schema_is_the_problem_struct() -> None:
    """The document's hand-written Problem (space.openapi) and the struct every refusal is encoded from agree."""
    struct = msgspec.json.schema(Problem)["$defs"]["Problem"]
    described = PROBLEM_SCHEMA.to_schema()
    assert set(described["properties"]) == set(struct["properties"])
    assert set(described["required"]) == set(struct["required"])


async def test_options_lists_every_method_of_its_path(api: Api, lists_org: Org) -> None:
    """Litestar 2 answered OPTIONS with the first handler's methods only (schemathesis' Allow check, ST205)."""
    r = await api.call("OPTIONS", "/orgs", lists_org.owner)
    assert r.status_code == 204 and r.headers["allow"] == "GET, OPTIONS, POST", r.headers
    r = await api.call("OPTIONS", lists_org.path("/deletion"), lists_org.owner)
    assert r.headers["allow"] == "DELETE, OPTIONS, POST", r.headers
