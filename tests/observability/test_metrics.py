"""Prometheus metrics (SPEC §16) of the real app and the real worker code, read from the real /metrics."""

from __future__ import annotations

import logging
import socket
import uuid

import httpx
import pytest
from litestar.testing import AsyncTestClient
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from space.config import Settings
from space.db import Database
from space.exports.pipeline import run_export
from space.observability.metrics import WorkerMetricsServer
from tests.exports.fixtures import (
    Gate,
    add_tickets,
    background,
    create_export,
    download,
    expire_lease,
    runner,
    tuned,
    uid,
)
from tests.helpers import Api
from tests.observability.scrape import delta, label_values, scrape, value

RESULT_ROUTE = "/orgs/{org_id}/exports/{export_id}/result"


async def test_one_export_and_one_download_move_each_counter_by_one(
    api: Api, client: AsyncTestClient, db: Database, settings: Settings
) -> None:  # type: ignore[type-arg]
    org = await api.org("Metrics")
    await add_tickets(db, org.id, org.owner, ["one", "two", "three"])
    before = await scrape(client)
    export = await create_export(api, org, org.owner, {"kind": "tickets_csv"})
    queued = await scrape(client)
    # The queue's depth comes from the ledger: the new export waits there.
    assert delta(before, queued, "space_exports_queued") == 1
    assert await run_export(runner(settings, db), uid(export["id"]), uid(org.id)) == "completed"
    r = await download(api, org, org.owner, export["id"])
    assert r.status_code == 200
    after = await scrape(client)

    assert delta(before, after, "space_exports_total", kind="tickets_csv", outcome="completed") == 1
    assert delta(before, after, "space_export_duration_seconds_count", kind="tickets_csv") == 1
    assert delta(before, after, "space_export_duration_seconds_sum", kind="tickets_csv") > 0
    assert delta(before, after, "space_export_rows_total") == 3
    assert delta(before, after, "space_export_bytes_total") == len(r.content)
    assert delta(before, after, "space_downloads_total", via="bearer") == 1
    assert delta(before, after, "space_download_bytes_total") == len(r.content)
    assert value(after, "space_downloads_in_flight") == 0
    assert delta(before, after, "space_exports_queued") == 0
    assert delta(before, after, "space_exports_running") == 0
    assert delta(before, after, "space_lease_lost_total") == 0
    http = {"method": "GET", "path": RESULT_ROUTE, "status_code": "200", "app_name": "space"}
    assert delta(before, after, "space_http_requests_total", **http) == 1
    assert delta(before, after, "space_http_request_duration_seconds_count", **http) == 1

    # No label names an org, a user or an export.
    ids = {org.id, export["id"], *(str(u.id) for u in (org.owner, org.admin, org.member, org.customer))}
    values = label_values(after)
    assert not {v for v in values if any(i in v for i in ids)}, values
    assert not [v for v in values if _looks_like_an_id(v)], values

    # A download through a link counts under its own label.
    minted = await api.call("POST", org.path(f"/exports/{export['id']}/links"), org.owner)
    assert minted.status_code == 201, minted.text
    linked = await client.get(minted.json()["url"])
    assert linked.status_code == 200 and linked.content == r.content
    last = await scrape(client)
    assert delta(after, last, "space_downloads_total", via="link") == 1
    assert delta(after, last, "space_downloads_total", via="bearer") == 0


def _looks_like_an_id(text: str) -> bool:
    return any(_is_uuid(part) for part in text.replace("{", "/").replace("}", "/").split("/"))


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


async def test_a_failed_export_is_counted_with_its_error_code(
    api: Api, client: AsyncTestClient, db: Database, settings: Settings
) -> None:  # type: ignore[type-arg]
    org = await api.org("Metrics failing")
    await add_tickets(db, org.id, org.owner, ["one", "two"])
    export = await create_export(api, org, org.owner, {"kind": "tickets_csv"})
    before = await scrape(client)
    outcome = await run_export(runner(tuned(settings, export_row_limit=1), db), uid(export["id"]), uid(org.id))
    assert outcome == "too_many_rows"
    after = await scrape(client)
    assert delta(before, after, "space_exports_total", kind="tickets_csv", outcome="too_many_rows") == 1
    assert delta(before, after, "space_exports_total", kind="tickets_csv", outcome="completed") == 0
    assert delta(before, after, "space_export_duration_seconds_count", kind="tickets_csv") == 0
    assert delta(before, after, "space_exports_queued") == -1


async def test_a_lease_taken_over_is_one_lease_loss_however_many_see_it(
    api: Api, client: AsyncTestClient, db: Database, settings: Settings
) -> None:  # type: ignore[type-arg]
    org = await api.org("Metrics takeover")
    await add_tickets(db, org.id, org.owner, ["one", "two"])
    export = await create_export(api, org, org.owner, {"kind": "tickets_csv"})
    eid, oid = uid(export["id"]), uid(org.id)
    before = await scrape(client)
    gate = Gate({"before_publish"})
    async with background(run_export(runner(settings, db), eid, oid, gate=gate), gate) as stale:
        await gate.reached("before_publish")
        running = await scrape(client)
        assert delta(before, running, "space_exports_running") == 1
        assert delta(before, running, "space_exports_queued") == -1
        await expire_lease(db, org.id, eid)
        expired = await scrape(client)
        # A running export whose lease ran out waits for a worker again.
        assert delta(before, expired, "space_exports_running") == 0
        assert delta(before, expired, "space_exports_queued") == 0
        assert await run_export(runner(settings, db), eid, oid) == "completed"
        gate.resume("before_publish")
        assert await stale == "lease_lost"
    after = await scrape(client)
    # The successor's claim saw the expired lease; the stale run finding its fence gone is the same loss.
    assert delta(before, after, "space_lease_lost_total") == 1
    assert delta(before, after, "space_exports_total", kind="tickets_csv", outcome="completed") == 1
    assert delta(before, after, "space_export_duration_seconds_count", kind="tickets_csv") == 1


async def test_metrics_and_readiness_need_no_token(client: AsyncTestClient) -> None:  # type: ignore[type-arg]
    r = await client.get("/ready")
    assert r.status_code == 200, r.text
    assert r.json() == {"status": "ready", "database": "ok", "queue": "ok"}
    assert (await client.get("/health")).status_code == 200
    samples = await scrape(client)
    assert ("space_exports_queued", frozenset()) in samples
    assert ("space_exports_oldest_queued_seconds", frozenset()) in samples


async def test_a_second_worker_on_a_taken_metrics_port_runs_without_it(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        server = WorkerMetricsServer("127.0.0.1", taken.getsockname()[1])
        with caplog.at_level(logging.WARNING, logger="space"):
            server.start(db)  # no exception: the worker goes on building exports
        server.stop()
    assert any("SPACE_WORKER_METRICS_PORT" in r.getMessage() for r in caplog.records), caplog.text


def _one_charset(content_type: str) -> list[str]:
    """The parameters of a Content-Type, each once: Prometheus 3 refuses a type with a repeated parameter."""
    params = [p.strip().split("=", 1)[0].lower() for p in content_type.split(";")[1:]]
    assert len(params) == len(set(params)) and params.count("charset") == 1, content_type
    return params


def _assert_openmetrics(content_type: str, body: str) -> None:
    assert content_type.startswith("application/openmetrics-text; version=1.0.0;"), content_type
    assert "charset=utf-8" in content_type
    _one_charset(content_type)
    # A complete OpenMetrics exposition: the parser refuses one without its `# EOF` line.
    families = {f.name for f in text_string_to_metric_families(body)}
    assert body.endswith("# EOF\n") and "space_exports" in families, sorted(families)


async def test_metrics_name_one_charset_and_answer_openmetrics_when_asked(
    client: AsyncTestClient,  # type: ignore[type-arg]
) -> None:
    r = await client.get("/metrics")
    assert r.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8", r.headers
    assert "# EOF" not in r.text
    r = await client.get("/metrics", headers={"Accept": "application/openmetrics-text"})
    assert r.headers["content-type"] == "application/openmetrics-text; version=1.0.0; charset=utf-8", r.headers
    _assert_openmetrics(r.headers["content-type"], r.text)
    # What Prometheus 3 sends: OpenMetrics first, with a version and weights.
    prometheus = (
        "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,"
        "text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
    )
    r = await client.get("/metrics", headers={"Accept": prometheus})
    _assert_openmetrics(r.headers["content-type"], r.text)


async def test_the_workers_metrics_answer_alike(db: Database) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = WorkerMetricsServer("127.0.0.1", port)
    server.start(db)
    try:
        # An async client: the server's thread waits for the ledger's query on this event loop.
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            r = await http.get("/metrics")
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4")
            _one_charset(r.headers["content-type"])
            r = await http.get("/metrics", headers={"Accept": "application/openmetrics-text"})
            assert r.headers["content-type"] == "application/openmetrics-text; version=1.0.0; charset=utf-8"
            _assert_openmetrics(r.headers["content-type"], r.text)
    finally:
        server.stop()
