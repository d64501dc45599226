"""Webhook URLs reach the logs as scheme and host only (SPEC §25, issue 29): the path and query of a receiver's URL
are often its secret (Slack's are). Registration and deliveries (delivered, failed with an answer, failed to connect,
refused by the address rules) are made for real against a local receiver, and every record is searched."""

from __future__ import annotations

import logging
import socket
import uuid
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest
from litestar.testing import AsyncTestClient

from space.app import create_app
from space.config import Settings
from space.db import Database, Tenant, UnitOfWork
from space.observability.logs import JsonFormatter
from space.webhooks import guard, service
from space.webhooks.delivery import deliver
from space.webhooks.models import EventType
from space.webhooks.schemas import EventData
from tests.exports.fixtures import tuned
from tests.helpers import Api, UserFactory
from tests.webhooks.receiver import receiver

SECRET_PATH = "T0000-B0000-pathsecret8c1e"
SECRET_QUERY = "querysecret5d2a"


@pytest.fixture(scope="module")
def private_ok(settings: Settings) -> Settings:
    """Settings that let webhooks reach this machine's receiver, and retry at once."""
    return tuned(settings, webhook_allow_private=True, webhook_retry_seconds=0)


@pytest.fixture(scope="module")
async def local_client(private_ok: Settings) -> AsyncIterator[AsyncTestClient]:  # type: ignore[type-arg]
    """The real app built with `private_ok`."""
    async with AsyncTestClient(app=create_app(private_ok)) as c:
        yield c


@pytest.fixture
def local_api(local_client: AsyncTestClient, users: UserFactory) -> Api:  # type: ignore[type-arg]
    """API caller against the app that allows local webhook URLs."""
    return Api(local_client, users)


def _closed_port() -> int:
    """A local port nothing listens on (bound, then closed: connecting is refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def _secret_url(host: str, port: int) -> str:
    return f"http://{host}:{port}/services/{SECRET_PATH}?token=x&key={SECRET_QUERY}"


def test_loggable_keeps_scheme_and_host_only() -> None:
    assert guard.loggable("https://hooks.example/services/T0/B0/xyz?k=v#f") == "https://hooks.example"
    assert guard.loggable("http://127.0.0.1:8123/a/b?c=d") == "http://127.0.0.1:8123"
    assert guard.loggable("https://[2001:db8::1]:8443/p") == "https://[2001:db8::1]:8443"
    assert guard.loggable("https://user:pw@Hooks.Example/p") == "https://hooks.example"
    assert guard.loggable("https://h:99999/p") == "[unparsable url]"
    text = "sent to https://hooks.example/services/T0/B0/xyz?k=v and http://10.0.0.1:81/x, done"
    assert guard.without_paths(text) == "sent to https://hooks.example and http://10.0.0.1:81, done"


async def test_no_log_record_carries_a_webhook_urls_path_or_query(
    caplog: pytest.LogCaptureFixture,
    local_api: Api,
    db: Database,
    private_ok: Settings,
    owner: psycopg.Connection[Any],
) -> None:
    caplog.set_level(logging.DEBUG)
    org = await local_api.org()
    oid = uuid.UUID(org.id)
    with receiver([500]) as rx:
        port = urlsplit(rx.url).port
        assert port is not None
        hooks = {}
        # Registration: a receiver that answers, one whose port is closed, one by name (refused at delivery below).
        for name, url in [
            ("answers", _secret_url("127.0.0.1", port)),
            ("closed", _secret_url("127.0.0.1", _closed_port())),
            ("by_name", _secret_url("localhost", port)),
        ]:
            r = await local_api.call(
                "POST", org.path("/webhooks"), org.owner, json={"url": url, "events": ["export.failed"]}
            )
            assert r.status_code == 201, r.text
            hooks[name] = r.json()["id"]
        async with UnitOfWork(db.sessionmaker, Tenant(org_id=oid)) as uow:
            data = EventData(org_id=oid, export_id=uuid.uuid4(), state="failed", error_code="worker_lost")
            assert await service.emit(uow, None, EventType.export_failed, data) == 3
        delivery = {
            name: owner.execute("SELECT id FROM webhook_deliveries WHERE endpoint_id = %s", (hook_id,)).fetchone()[0]  # type: ignore[index]
            for name, hook_id in hooks.items()
        }
        # The receiver answers 500, then 200: a failed attempt with an answer, then a delivered one.
        assert await deliver(private_ok, db, None, delivery["answers"], oid) == "retrying"
        assert await deliver(private_ok, db, None, delivery["answers"], oid) == "delivered"
        assert rx.count == 2
        got = await rx.next()
        assert SECRET_PATH in got.path  # the secret is where it belongs: in the request the receiver got
        # No connection: httpx's error.
        assert await deliver(private_ok, db, None, delivery["closed"], oid) == "retrying"
        # Refused by the address rules at delivery (a worker that does not allow local addresses).
        strict = tuned(private_ok, webhook_allow_private=False)
        assert await deliver(strict, db, None, delivery["by_name"], oid) == "failed"

    records = caplog.records
    # The request lines are there (and so would the secret be, were they not cut to scheme and host).
    sent = [r.getMessage() for r in records if r.name == "httpx" and f"127.0.0.1:{port}" in r.getMessage()]
    assert len(sent) == 2, [r.getMessage() for r in records if r.name == "httpx"]
    formatter = JsonFormatter()
    for record in records:
        seen = " ".join([record.getMessage(), repr(record.__dict__), formatter.format(record)])
        for secret in (SECRET_PATH, SECRET_QUERY, "/services/"):
            assert secret not in seen, (record.name, seen)
