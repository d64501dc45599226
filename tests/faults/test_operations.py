"""Operations (SPEC §16) of real `space worker` and `space api` processes: the worker's own metrics endpoint, a
killed worker's lease loss on the next worker's metrics, and JSON log lines from every process."""

from __future__ import annotations

import json
import signal
import uuid
from typing import Any

import httpx
import pytest

from space.db import Database
from tests.exports.fixtures import add_tickets, create_export, download
from tests.faults.procs import ROWS, MidRead, Owner, Proc, Procs, free_port, observed, seeded, wait_until
from tests.helpers import Api, assert_problem
from tests.observability.scrape import Sample, parse, value

pytestmark = pytest.mark.faults

JSON_LOGS = {"SPACE_LOG_FORMAT": "json"}


async def _metrics(port: int) -> dict[Sample, float]:
    async with httpx.AsyncClient(timeout=10) as c:
        r = await c.get(f"http://127.0.0.1:{port}/metrics")
    assert r.status_code == 200, r.text
    return parse(r.text)


async def _serving(proc: Proc, port: int) -> dict[Sample, float]:
    async def up() -> dict[Sample, float] | None:
        if not proc.alive:
            raise AssertionError(f"{proc.name} exited\n{proc.log()}")
        try:
            return await _metrics(port)
        except httpx.HTTPError:
            return None

    result: dict[Sample, float] = await wait_until(up, f"{proc.name} to serve its metrics")
    return result


def json_lines(proc: Proc) -> list[dict[str, Any]]:
    """Every line the process wrote, each parsed as one JSON object with ts, level and event."""
    lines = []
    for line in proc.log_path.read_text().splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            raise AssertionError(f"not a JSON line: {line!r}\n{proc.log()}") from None
        assert isinstance(obj, dict) and {"ts", "level", "event"} <= obj.keys(), line
        lines.append(obj)
    return lines


async def test_a_killed_workers_export_shows_as_a_lease_loss_on_the_next_workers_metrics(
    fapi: Api, faults_db: Database, owner: Owner, procs: Procs
) -> None:
    org, _ = await seeded(fapi, faults_db, "lost-lease")
    export = await create_export(fapi, org, org.member, {"kind": "tickets_csv"})
    eid = export["id"]
    port_a, port_b = free_port(), free_port()
    async with MidRead(owner, org.id, eid) as pause:
        await pause.arm()
        a = await procs.worker("worker-a", SPACE_WORKER_METRICS_PORT=str(port_a), **JSON_LOGS)
        held = await pause.engage()
        # Held mid-read: the ledger (not the worker's memory) says one export runs.
        seen_a = await _serving(a, port_a)
        assert value(seen_a, "space_exports_running") >= 1
        a.send(signal.SIGKILL)
        assert await a.wait() == -signal.SIGKILL
    b = await procs.worker("worker-b", SPACE_WORKER_METRICS_PORT=str(port_b), **JSON_LOGS)
    await _serving(b, port_b)
    done = await owner.finished(eid)
    assert done["state"] == "completed" and done["attempt"] == 2, (done, procs.logs())
    seen_b = await _metrics(port_b)
    assert value(seen_b, "space_lease_lost_total") == 1
    assert value(seen_b, "space_exports_total", kind="tickets_csv", outcome="completed") == 1
    assert value(seen_b, "space_export_duration_seconds_count", kind="tickets_csv") == 1
    assert value(seen_b, "space_export_rows_total") == ROWS
    assert value(seen_b, "space_exports_running") == 0

    # Both workers' logs are JSON lines; the export's lines name the export, its execution and attempt.
    for proc, attempt, execution in ((a, 1, held.execution_id), (b, 2, str(done["execution_id"]))):
        lines = json_lines(proc)
        claimed = [line for line in lines if line["event"] == "export claimed"]
        assert claimed, proc.log()
        assert claimed[0]["export_id"] == eid and claimed[0]["org_id"] == org.id, claimed
        assert claimed[0]["execution_id"] == execution and claimed[0]["attempt"] == attempt, claimed
    completed = [line for line in json_lines(b) if line["event"] == "export completed"]
    assert len(completed) == 1 and completed[0]["rows"] == ROWS
    observed(
        "lease_loss_metrics",
        worker_a_running=value(seen_a, "space_exports_running"),
        worker_b_lease_lost=value(seen_b, "space_lease_lost_total"),
        worker_b_completed=value(seen_b, "space_exports_total", kind="tickets_csv", outcome="completed"),
    )


async def test_api_and_worker_processes_write_json_lines_that_leak_nothing(
    fapi: Api, faults_db: Database, owner: Owner, procs: Procs
) -> None:
    _, base = await procs.api("api-json", **JSON_LOGS)
    worker = await procs.worker("worker-json", SPACE_EXPORT_ROW_LIMIT="2", **JSON_LOGS)
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        api = Api(client, fapi.users)  # type: ignore[arg-type]
        org = await api.org("json-logs")
        needle = f"needle{uuid.uuid4().hex[:8]}"
        title = f"{needle} row-content-{uuid.uuid4().hex[:8]}"
        await add_tickets(faults_db, org.id, org.member, [title, f"{needle} two"])
        small = await create_export(api, org, org.member, {"kind": "tickets_csv", "filters": {"q": needle}})
        assert (await owner.finished(small["id"]))["state"] == "completed"
        r = await download(api, org, org.member, small["id"])
        assert r.status_code == 200 and title.encode() in r.content
        sent = len(r.content)
        link_token = f"lnk.{uuid.uuid4().hex}"
        r = await client.get(org.path(f"/exports/{small['id']}/result"), params={"token": link_token})
        assert r.status_code < 500
        await add_tickets(faults_db, org.id, org.member, [f"{needle} three"])
        big = await create_export(api, org, org.member, {"kind": "tickets_csv", "filters": {"q": needle}})
        failed = await owner.finished(big["id"])
        assert (failed["state"], failed["error_code"]) == ("failed", "too_many_rows")
        r = await client.get("/orgs", headers={"X-Request-ID": "probe-1"})
        assert_problem(r, 401, "unauthenticated")
        assert r.headers["x-request-id"] == "probe-1"
        assert (await client.get("/ready")).status_code == 200
        samples = parse((await client.get("/metrics")).text)
    assert value(samples, "space_downloads_total", via="bearer") == 1
    assert value(samples, "space_download_bytes_total") == sent
    worker.send(signal.SIGTERM)
    await worker.wait()

    api_proc = next(p for p in procs.started if p.name == "api-json")
    lines = json_lines(api_proc) + json_lines(worker)
    loggers = {line["logger"] for line in lines}
    assert {"uvicorn.error", "space.http", "space.exports"} <= loggers, loggers
    assert any(line.get("request_id") == "probe-1" and line["event"] == "request" for line in lines)
    text = api_proc.log_path.read_text() + worker.log_path.read_text()
    secrets = [needle, title, link_token, *(u.token for u in (org.owner, org.member, org.customer))]
    assert [s for s in secrets if s in text] == [], text[-4000:]
