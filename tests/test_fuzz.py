"""Schema-driven fuzzing over the OpenAPI document (schemathesis), in-process against the ASGI app.

Two orgs, each with members of every role, tickets, projects and finished exports. The fuzzer calls every
route as people of both orgs (and anonymously), with generated and with real ids of both orgs in the paths:
no answer is a 5xx, and no answer to one org's token carries anything of the other org. A second test sends
every route of the document without a token (and with an unknown one): 401 everywhere but /health and /ready.

Run alone with `pytest -m fuzz`. Bounded: a few hundred requests, well under a minute.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from litestar.testing import AsyncTestClient
from schemathesis import GenerationMode
from schemathesis.python import asgi

from space.app import create_app
from space.config import Settings
from space.db import Database
from space.exports.pipeline import run_export
from space.problems import UNREADABLE_PATH
from tests import helpers
from tests.exports.fixtures import add_project, add_tickets, create_export, runner, uid
from tests.helpers import Api, Org

pytestmark = pytest.mark.fuzz

MAX_EXAMPLES = 600
PUBLIC = {
    ("GET", "/health"),
    ("GET", "/ready"),
    ("GET", "/schemas/snapshot-v1.json"),
    ("GET", "/schemas/manifest-v1.json"),
    ("GET", "/schemas/manifest-v2.json"),
    *(("GET", f"/schemas/{name}-v2.json") for name in ("members", "projects", "tasks", "tickets")),
}
"""Routes anyone may call."""


@dataclass
class Tenant:
    """One org of the fuzz run, its real ids (to put in paths) and the strings that identify its data."""

    org: Org
    tag: str
    exports: list[str] = field(default_factory=list)
    projects: list[str] = field(default_factory=list)
    numbers: list[int] = field(default_factory=list)
    rows: list[str] = field(default_factory=list)

    @property
    def people(self) -> list[helpers.TestUser]:
        """Everyone with a role in the org."""
        o = self.org
        return [o.owner, o.admin, o.member, o.customer, o.customer2]

    def secrets(self) -> list[str]:
        """Strings that belong to this org's data; none may reach a caller from the other org."""
        people = self.people
        return [
            self.org.id,
            *self.org.memberships.values(),
            *(p.email for p in people),
            *(str(p.id) for p in people),
            *self.exports,
            *self.projects,
            *self.rows,
        ]


@dataclass(frozen=True)
class Tenants:
    """Org A and org B."""

    a: Tenant
    b: Tenant

    def other(self, caller: helpers.TestUser | None) -> Tenant | None:
        """The org whose data must not reach `caller` (None for an anonymous caller: neither may)."""
        if caller is None:
            return None
        return self.b if caller in self.a.people else self.a


async def _tenant(api: Api, db: Database, settings: Settings, name: str) -> Tenant:
    """An org with tickets by staff and customers, a project with a task, and finished exports of each kind."""
    org = await api.org(name)
    tag = uuid.uuid4().hex[:12]
    t = Tenant(org, tag)
    t.rows = [f"row-{tag}-{i}" for i in range(4)]
    t.numbers += await add_tickets(db, org.id, org.member, t.rows[:2])
    t.numbers += await add_tickets(db, org.id, org.customer, t.rows[2:])
    project = f"project-{tag}"
    t.projects.append(str(await add_project(db, org.id, project, [f"task-{tag}"])))
    t.rows += [project, f"task-{tag}"]
    for user, body in ((org.owner, {"kind": "snapshot"}), (org.customer, {"kind": "tickets_csv"})):
        export = await create_export(api, org, user, body)
        assert await run_export(runner(settings, db), uid(export["id"]), uid(org.id)) == "completed"
        t.exports.append(export["id"])
    # One left queued, one still to be created by the fuzzer.
    t.exports.append((await create_export(api, org, org.member, {"kind": "tickets_csv"}))["id"])
    return t


@pytest.fixture(scope="module")
async def tenants(api: Api, db: Database, settings: Settings) -> Tenants:
    """Two orgs made through the real API, with data and exports."""
    return Tenants(await _tenant(api, db, settings, "Fuzz A"), await _tenant(api, db, settings, "Fuzz B"))


@pytest.fixture(scope="module")
def schema(settings: Settings) -> Iterator[Any]:
    """The OpenAPI document of a fresh app, loaded by schemathesis; the app runs on schemathesis' own loop."""
    loaded = schemathesis.openapi.from_asgi("/schema/openapi.json", create_app(settings))
    yield loaded
    # Dispose of that app's engine (its lifespan) before the test database is dropped.
    asgi.shutdown_lifespans()


def _real_ids(t: Tenant) -> dict[str, list[str]]:
    return {
        "user_id": [str(p.id) for p in t.people],
        "export_id": t.exports,
        "project_id": t.projects,
        "number": [str(n) for n in t.numbers],
    }


def test_openapi_fuzz(schema: Any, tenants: Tenants) -> None:
    a, b = tenants.a, tenants.b
    operations_of_doc = _operations(schema)
    modes = [GenerationMode.POSITIVE, GenerationMode.NEGATIVE]
    # Per operation and mode: generated org ids (the 404 path), and A's and B's real ones (past the
    # membership check). Drawing the operation first gives every route its share of the examples.
    strategies = {
        (i, mode, org): op.as_strategy(
            generation_mode=mode, path_parameters={"org_id": org} if org and "{org_id}" in op.path else None
        )
        for i, op in enumerate(operations_of_doc)
        for mode in modes
        for org in (None, a.org.id, b.org.id)
    }
    callers: list[helpers.TestUser | None] = [*a.people, b.org.owner, b.org.customer, None]
    real = {k: v + _real_ids(b)[k] for k, v in _real_ids(a).items()}
    secrets = {"a": a.secrets(), "b": b.secrets()}
    seen: dict[int, int] = {}
    operations: dict[str, set[int]] = {}

    # Every operation gets its share of the examples: drawn from all of them at once, a derandomized run of a
    # growing API left some route unreached.
    per_operation = max(12, MAX_EXAMPLES // len(operations_of_doc))

    @settings(
        max_examples=per_operation,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(data=st.data())
    def run(op: int, data: st.DataObject) -> None:
        mode = data.draw(st.sampled_from(modes), label="mode")
        org = data.draw(st.sampled_from([a.org.id, a.org.id, b.org.id, None]), label="org")
        case = data.draw(strategies[(op, mode, org)])
        caller = data.draw(st.sampled_from(callers))
        for name, values in real.items():
            # Real ids of A and B in the paths, not only random strings.
            if case.path_parameters and name in case.path_parameters and data.draw(st.booleans()):
                case.path_parameters[name] = data.draw(st.sampled_from(values))
        headers = dict(caller.headers) if caller is not None else {}
        response = case.call(headers=headers)
        seen[response.status_code] = seen.get(response.status_code, 0) + 1
        operations.setdefault(f"{case.method} {case.path}", set()).add(response.status_code)
        where = f"{case.method} {case.formatted_path} as {caller.name if caller else 'anonymous'}"
        assert response.status_code < 500, f"{where}: {response.status_code} {response.text[:500]}"
        if response.status_code >= 400:
            ctype = response.headers.get("content-type", [""])
            ctype = ctype[0] if isinstance(ctype, list) else ctype
            assert ctype.startswith("application/problem+json"), f"{where}: {ctype}"
            if case.method != "HEAD":
                body = response.json()
                assert body["status"] == response.status_code and body["code"] and body["detail"], where
        if caller is None and (case.method, case.path) not in PUBLIC:
            # A path no route can have (a control character or an invalid byte in it) is 404 before anyone is
            # asked who they are (SPEC §25); every other one asks first.
            expected = 404 if UNREADABLE_PATH.search(unquote(case.formatted_path)) else 401
            assert response.status_code == expected, f"{where}: {response.status_code}"
        text = response.content.decode("utf-8", "replace")
        other = tenants.other(caller)
        for key in ["a", "b"] if other is None else ["a" if other is a else "b"]:
            for secret in secrets[key]:
                assert secret not in text, f"{where}: org {key.upper()}'s {secret} leaked: {text[:500]}"

    for op in range(len(operations_of_doc)):
        run(op)
    # The run reached the handlers, not only the 401/404 gates, and every route of the document.
    assert any(200 <= s < 300 for s in seen), seen
    assert 400 in seen and 404 in seen, seen
    documented = {f"{op.method.upper()} {op.path}" for op in operations_of_doc}
    assert documented <= set(operations), sorted(documented - set(operations))
    # Past the authentication and membership gates on the exports and lifecycle routes too.
    reached = {op for op, statuses in operations.items() if statuses - {401, 404}}
    for group in ("/exports", "/suspend", "/reactivate", "/deletion"):
        assert any(group in op for op in reached), (group, sorted(reached))


def _operations(schema: Any) -> list[Any]:
    return [result.ok() for result in schema.get_all_operations()]


async def test_every_route_rejects_a_missing_or_unknown_token(
    client: AsyncTestClient,  # type: ignore[type-arg]
    tenants: Tenants,
) -> None:
    a = tenants.a
    doc = (await client.get("/schema/openapi.json")).json()
    ids = {
        "org_id": a.org.id,
        "user_id": str(a.org.member.id),
        "export_id": a.exports[0],
        "project_id": a.projects[0],
        "number": str(a.numbers[0]),
        "webhook_id": str(uuid.uuid4()),
        "notification_id": str(uuid.uuid4()),
        "schedule_id": str(uuid.uuid4()),
        "import_id": str(uuid.uuid4()),
        "destination_id": str(uuid.uuid4()),
    }
    checked = []
    for path, ops in doc["paths"].items():
        for method in ops:
            if method not in {"get", "head", "post", "put", "patch", "delete"} or (method.upper(), path) in PUBLIC:
                continue
            url = path.format(**{k: v for k, v in ids.items() if "{" + k + "}" in path})
            for headers in ({}, {"Authorization": "Bearer spc_not-a-token"}, {"Authorization": "Basic eDp5"}):
                if method == "head":  # no body to read the code from: the status and the challenge tell
                    r = await client.head(url, headers=headers)
                    assert r.status_code == 401 and r.content == b"", (url, headers, r.status_code)
                    assert r.headers["www-authenticate"].startswith("Bearer"), (method, url, r.headers)
                    continue
                r = await client.request(method.upper(), url, headers=headers, json={"name": "x"})
                body = helpers.assert_problem(r, 401, "unauthenticated")
                assert r.headers["www-authenticate"].startswith("Bearer"), (method, url, r.headers)
                assert a.org.id not in r.text and not any(s in r.text for s in a.rows), body
            checked.append(f"{method.upper()} {path}")
    # Every route of the document, exports and lifecycle included.
    assert "GET /orgs/{org_id}/exports/{export_id}/result" in checked and "POST /orgs/{org_id}/suspend" in checked
    assert len(checked) == sum(len(ops) for ops in doc["paths"].values()) - len(PUBLIC), checked
    r = await client.get("/health")
    assert r.status_code == 200
