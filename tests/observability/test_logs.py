"""Structured logs (SPEC §16): JSON lines, context fields, request ids, and redaction over a whole scenario."""

from __future__ import annotations

import io
import json
import logging
import uuid
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from litestar.testing import AsyncTestClient
from sqlalchemy.exc import SAWarning

from space.config import Settings
from space.db import Database
from space.exports.pipeline import run_export
from space.observability.logs import ContextFilter, JsonFormatter, TextFormatter, configure_logging, redact_text
from tests.exports.fixtures import add_tickets, create_export, download, runner, tuned, uid
from tests.helpers import Api, assert_problem


class Capture:
    """Every record of every logger at INFO and above, formatted as the product formats it."""

    def __init__(self) -> None:
        self.stream = io.StringIO()

    @property
    def text(self) -> str:
        """Everything written."""
        return self.stream.getvalue()

    def lines(self) -> list[dict[str, Any]]:
        """Each line, parsed; a line that is not one JSON object fails the test."""
        out = []
        for line in self.text.splitlines():
            obj = json.loads(line)
            assert isinstance(obj, dict) and {"ts", "level", "event"} <= obj.keys(), line
            out.append(obj)
        return out


@pytest.fixture
def captured() -> Iterator[Capture]:
    """The JSON formatter on the root logger for one test."""
    capture = Capture()
    handler = logging.StreamHandler(capture.stream)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(ContextFilter())
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield capture
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


async def test_a_full_scenario_logs_no_token_no_link_token_no_q_and_no_row_content(
    api: Api, client: AsyncTestClient, db: Database, settings: Settings, captured: Capture
) -> None:  # type: ignore[type-arg]
    org = await api.org("Logs")
    needle = f"needle{uuid.uuid4().hex[:8]}"
    title = f"{needle} Zebra-row-content-{uuid.uuid4().hex[:8]}"
    await add_tickets(db, org.id, org.owner, [title, f"{needle} second"], body="a ticket body with secrets")
    r = await api.call("GET", org.path("/tickets"), org.owner, params={"q": needle})
    assert r.status_code == 200 and r.json()["total"] == 2
    export = await create_export(api, org, org.owner, {"kind": "tickets_csv", "filters": {"q": needle}})
    assert await run_export(runner(settings, db), uid(export["id"]), uid(org.id)) == "completed"
    r = await download(api, org, org.owner, export["id"])
    assert r.status_code == 200 and title.encode() in r.content
    # A real download link, used, and a forged one refused: neither token may reach a line.
    minted = await api.call("POST", org.path(f"/exports/{export['id']}/links"), org.owner)
    assert minted.status_code == 201, minted.text
    link_token = minted.json()["url"].split("token=", 1)[1]
    r = await client.get(minted.json()["url"])
    assert r.status_code == 200 and title.encode() in r.content
    forged = f"{link_token[:-4]}AAAA"
    r = await client.get(org.path(f"/exports/{export['id']}/result"), params={"token": forged})
    assert_problem(r, 401, "link_invalid")
    r = await api.call("GET", org.path("/exports"), None, headers={"Authorization": f"Bearer {org.member.token}x"})
    assert_problem(r, 401, "unauthenticated")
    failing = await create_export(api, org, org.owner, {"kind": "tickets_csv", "filters": {"q": needle}})
    outcome = await run_export(runner(tuned(settings, export_row_limit=1), db), uid(failing["id"]), uid(org.id))
    assert outcome == "too_many_rows"

    lines = captured.lines()
    text = captured.text
    secrets = [needle, title, "Zebra-row-content", link_token, forged, "a ticket body"]
    secrets += [u.token for u in (org.owner, org.admin, org.member, org.customer, org.customer2)]
    assert [s for s in secrets if s in text] == [], text
    assert "spc_" not in text

    requests = [line for line in lines if line["event"] == "request"]
    assert len(requests) >= 6, lines
    assert all(line["request_id"] and line["status"] and line["path"].startswith("/") for line in requests)
    assert all("?" not in line["path"] for line in requests)
    assert {line["status"] for line in requests} >= {200, 202, 401}
    in_org = [line for line in requests if line["path"].startswith(org.path())]
    assert in_org and all(line["org_id"] == org.id for line in in_org)

    ran = [line for line in lines if line.get("logger") == "space.exports"]
    by_event = {line["event"]: line for line in ran}
    assert {"export claimed", "export completed", "export failed"} <= by_event.keys(), ran
    for line in ran:
        assert line["org_id"] == org.id and line["export_id"] in (export["id"], failing["id"]), line
        assert uuid.UUID(line["execution_id"]) and line["attempt"] == 1, line
    assert by_event["export failed"]["error_code"] == "too_many_rows"
    assert by_event["export completed"]["rows"] == 2


async def test_the_request_id_is_taken_from_the_client_or_made_and_echoed(
    client: AsyncTestClient, api: Api, captured: Capture
) -> None:  # type: ignore[type-arg]
    r = await client.get("/health", headers={"X-Request-ID": "edge-42.a:b"})
    assert r.headers["x-request-id"] == "edge-42.a:b"
    r = await client.get("/health")
    made = r.headers["x-request-id"]
    assert len(made) == 32 and int(made, 16) >= 0
    # Not an id: replaced by a fresh one, never echoed (it could carry anything into the logs).
    r = await client.get("/health", headers={"X-Request-ID": "Bearer spc_abc def" + "x" * 200})
    assert r.status_code == 200 and len(r.headers["x-request-id"]) == 32
    # Refusals and unknown routes carry one too.
    r = await client.get("/me", headers={"X-Request-ID": "refused-1"})
    assert r.status_code == 401 and r.headers["x-request-id"] == "refused-1"
    r = await client.get("/no/such/route", headers={"X-Request-ID": "unknown-1"})
    assert r.status_code == 404 and r.headers["x-request-id"] == "unknown-1"
    ids = {line["request_id"] for line in captured.lines() if line["event"] == "request"}
    assert {"edge-42.a:b", made, "refused-1", "unknown-1"} <= ids


@pytest.mark.parametrize(
    ("raw", "leak"),
    [
        ("Authorization: Bearer spc_Zm9vYmFy-_x", "Zm9vYmFy"),
        ("authorization=bearer abc.def.ghi", "abc.def"),
        ('"GET /orgs/1/exports/2/result?token=lnk.abc.def HTTP/1.1" 200', "lnk.abc"),
        ("GET /orgs/1/tickets?status=open&q=find%20me&page=2", "find"),
        ("{'q': 'find me', 'status': 'open'}", "find"),
        ("token=abcdef123 and more", "abcdef123"),
        ("a token spc_secretvalue in prose", "secretvalue"),
    ],
)
def test_redaction_removes_secrets_from_any_text(raw: str, leak: str) -> None:
    out = redact_text(raw)
    assert leak not in out and "[redacted]" in out, out


def test_every_logger_and_warnings_pass_through_the_one_json_formatter(capsys: pytest.CaptureFixture[str]) -> None:
    handler = configure_logging("json")
    try:
        logging.getLogger("uvicorn.error").info("Uvicorn running on http://127.0.0.1:8000?token=abc")
        logging.getLogger("uvicorn.access").info('%s - "%s %s HTTP/1.1" %d', "127.0.0.1", "GET", "/x?q=secret", 200)
        logging.getLogger("saq").warning("job failed %s", {"q": "secret", "export_id": "e1"})
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.warn("an SQLAlchemy warning with Bearer spc_tok", SAWarning, stacklevel=1)
        try:
            raise ValueError("boom with token=abc")
        except ValueError:
            logging.getLogger("sqlalchemy.pool").exception("pool error")
        logging.getLogger("sqlalchemy.engine").info("SELECT ... (statements are not logged at INFO)")
    finally:
        logging.getLogger().removeHandler(handler)
        logging.captureWarnings(False)
    err = capsys.readouterr().err
    lines = [json.loads(line) for line in err.splitlines() if line.strip()]
    assert [line["logger"] for line in lines] == [
        "uvicorn.error",
        "uvicorn.access",
        "saq",
        "py.warnings",
        "sqlalchemy.pool",
    ]
    assert "secret" not in err and "spc_tok" not in err and "token=abc" not in err, err
    assert all(line["ts"].endswith("Z") and line["level"] for line in lines)
    assert "ValueError" in lines[-1]["exc"]


def test_the_text_format_is_one_readable_line_per_record() -> None:
    record = logging.makeLogRecord(
        {"name": "space.exports", "levelno": 20, "levelname": "INFO", "msg": "export completed", "rows": 3}
    )
    record.space_context = {"export_id": "e1", "attempt": 1}
    line = TextFormatter().format(record)
    assert "\n" not in line
    assert "INFO    space.exports: export completed" in line and "export_id=e1 attempt=1 rows=3" in line


def test_the_formatter_takes_over_loggers_an_earlier_configuration_disabled(capsys: pytest.CaptureFixture[str]) -> None:
    # As uvicorn's own dictConfig and then a library's (disable_existing_loggers) can leave it.
    stale = logging.getLogger("uvicorn.error")
    stale.addHandler(logging.NullHandler())
    stale.propagate, stale.disabled = False, True
    stale.setLevel(logging.WARNING)
    handler = configure_logging("json")
    try:
        logging.getLogger("uvicorn.error").info("still heard")
    finally:
        logging.getLogger().removeHandler(handler)
        logging.captureWarnings(False)
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert [(line["logger"], line["event"]) for line in lines] == [("uvicorn.error", "still heard")]
