"""Schema-driven fuzzing over the OpenAPI document (schemathesis), in-process against the ASGI app.

Run alone with `pytest -m fuzz`. Bounded: a few hundred requests, well under a minute.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.python import asgi

from space.app import create_app
from space.config import Settings
from tests import helpers
from tests.helpers import Api, Org

pytestmark = pytest.mark.fuzz

MAX_EXAMPLES = 300


@dataclass(frozen=True)
class Tenants:
    """Org A (whose tokens the fuzzer uses) and org B (whose data must never show up)."""

    a: Org
    b: Org

    def secrets_of_b(self) -> list[str]:
        """Strings that identify org B's data; none may appear in a response to an A token."""
        people: list[helpers.TestUser] = [self.b.owner, self.b.admin, self.b.member, self.b.customer, self.b.customer2]
        return [self.b.id, *self.b.memberships.values(), *(p.email for p in people), *(str(p.id) for p in people)]


@pytest.fixture(scope="module")
async def tenants(api_module: Api) -> Tenants:
    """Two orgs made through the real API."""
    return Tenants(await api_module.org("Fuzz A"), await api_module.org("Fuzz B"))


@pytest.fixture(scope="module")
def api_module(client: Any, users: helpers.UserFactory) -> Api:
    """The `api` helper, for the module."""
    return Api(client, users)


@pytest.fixture(scope="module")
def schema(settings: Settings) -> Iterator[Any]:
    """The OpenAPI document of a fresh app, loaded by schemathesis; the app runs on schemathesis' own loop."""
    loaded = schemathesis.openapi.from_asgi("/schema/openapi.json", create_app(settings))
    yield loaded
    # Dispose of that app's engine (its lifespan) before the test database is dropped.
    asgi.shutdown_lifespans()


def test_openapi_fuzz(schema: Any, tenants: Tenants) -> None:
    a = tenants.a
    # Fixed org ids let the fuzzer past the membership check; generated ones probe the 404 path.
    strategy = st.one_of(
        schema.as_strategy(GenerationMode.POSITIVE),
        schema.as_strategy(GenerationMode.NEGATIVE),
        schema.as_strategy(GenerationMode.POSITIVE, path_parameters={"org_id": a.id}),
        schema.as_strategy(GenerationMode.NEGATIVE, path_parameters={"org_id": a.id}),
        schema.as_strategy(GenerationMode.POSITIVE, path_parameters={"org_id": tenants.b.id}),
    )
    callers = [a.owner, a.admin, a.member, a.customer, None]
    targets = [str(a.member.id), str(a.customer2.id), str(tenants.b.member.id), str(tenants.b.owner.id)]
    secrets = tenants.secrets_of_b()
    seen: dict[int, int] = {}

    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        case = data.draw(strategy)
        caller = data.draw(st.sampled_from(callers))
        if case.path_parameters and "user_id" in case.path_parameters and data.draw(st.booleans()):
            # Real member ids of A and B, not only random strings.
            case.path_parameters["user_id"] = data.draw(st.sampled_from(targets))
        headers = dict(caller.headers) if caller is not None else {}
        response = case.call(headers=headers)
        seen[response.status_code] = seen.get(response.status_code, 0) + 1
        where = f"{case.method} {case.formatted_path} as {caller.name if caller else 'anonymous'}"
        assert response.status_code < 500, f"{where}: {response.status_code} {response.text[:500]}"
        if response.status_code >= 400:
            ctype = response.headers.get("content-type", [""])
            ctype = ctype[0] if isinstance(ctype, list) else ctype
            assert ctype.startswith("application/problem+json"), f"{where}: {ctype}"
            if case.method != "HEAD":
                body = response.json()
                assert body["status"] == response.status_code and body["code"] and body["detail"], where
        text = response.content.decode("utf-8", "replace")
        for secret in secrets:
            assert secret not in text, f"{where}: org B's {secret} leaked: {text[:500]}"

    run()
    # The run reached the handlers, not only the 401/404 gates.
    assert any(200 <= s < 300 for s in seen), seen
    assert 400 in seen and 404 in seen, seen
