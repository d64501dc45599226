"""Restore (SPEC §23): an org archived, deleted, purged and restored has every row again, and its new archive's data
files have the original's sha256; with the original present, 409 ids_in_use or newIds with a map; dryRun writes
nothing; a broken archive fails archive_invalid (or 413 too_large) and leaves no row in any tenant table; another
user's import is 404; a placeholder member is claimed by `space users add` (the real command)."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
import subprocess
import sys
import uuid
import zipfile
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from space.config import Settings
from space.db import Database
from space.imports.running import run_import
from space.orgs.jobs import purge_org
from tests.browser.conftest import serving
from tests.exports.fixtures import add_project, add_tickets, completed_export, download, tuned, uid
from tests.helpers import Api, Org, assert_problem

DATA = ["data/members.jsonl", "data/projects.jsonl", "data/tasks.jsonl", "data/tickets.jsonl"]


async def _seeded(api: Api, db: Database) -> Org:
    org = await api.org("Restored Co")
    await add_project(db, org.id, "Launch", ["Plan", "=cmd()", 'say "hi"\nthen go', "emoji 🚀 four bytes"])
    await add_project(db, org.id, "Gone", ["never exported"], deleted=True)
    await add_tickets(db, org.id, org.member, ["Printer on fire", "=HYPERLINK()"], assignee_id=org.memberships["admin"])
    await add_tickets(db, org.id, org.customer, ['a "quoted"\r\nline', "𝄞 clef"], status="closed", priority="urgent")
    await add_tickets(db, org.id, org.customer2, ["+1 -1 @x"], status="pending", body="multi\nline\tbody 😀")
    return org


async def _archive(api: Api, db: Database, settings: Settings, org: Org) -> bytes:
    export_id = await completed_export(api, db, settings, org, {"kind": "archive"})
    r = await download(api, org, org.owner, export_id)
    assert r.status_code == 200, r.text
    return r.content


def _digests(content: bytes) -> dict[str, str]:
    manifest = json.loads(zipfile.ZipFile(io.BytesIO(content)).read("manifest.json"))
    return {f["name"]: f["sha256"] for f in manifest["files"] if f["name"] in DATA}


async def _post(api: Api, user: Any, body: bytes, query: str) -> Any:
    return await api.call("POST", f"/imports?{query}", user, content=body, headers={"content-type": "application/zip"})


async def _restore(api: Api, db: Database, settings: Settings, user: Any, body: bytes, query: str) -> dict[str, Any]:
    r = await _post(api, user, body, query)
    assert r.status_code == 202, r.text
    created = r.json()
    assert created["state"] == "queued" and r.headers["location"] == f"/imports/{created['id']}"
    await run_import(settings, db, None, uid(created["id"]), user.id)
    # The upload was kept in PostgreSQL for any worker, and only until the import ended.
    with psycopg.connect(settings.database_url) as owner:
        left = owner.execute("SELECT count(*) FROM import_chunks WHERE import_id = %s", [created["id"]]).fetchone()
    assert left == (0,)
    r = await api.call("GET", f"/imports/{created['id']}", user)
    assert r.status_code == 200, r.text
    result: dict[str, Any] = r.json()
    return result


def _rows(owner: psycopg.Connection[Any], org_id: str) -> dict[str, list[tuple[Any, ...]]]:
    q = {
        "projects": "SELECT id, name, version, deleted_at, created_at, updated_at FROM projects WHERE org_id = %s"
        " ORDER BY id",
        "tasks": "SELECT id, project_id, title, status, due_date, created_at, updated_at FROM tasks WHERE org_id = %s"
        " ORDER BY id",
        "tickets": "SELECT number, title, body, status, priority, creator_id, assignee_id, created_at, updated_at"
        " FROM tickets WHERE org_id = %s ORDER BY number",
        "memberships": "SELECT id, user_id, role FROM memberships WHERE org_id = %s ORDER BY id",
        "counter": "SELECT last_number FROM ticket_counters WHERE org_id = %s",
    }
    return {k: owner.execute(sql, [org_id]).fetchall() for k, sql in q.items()}


def _tenant_counts(owner: psycopg.Connection[Any]) -> dict[str, int]:
    tables = [
        r[0]
        for r in owner.execute(
            "SELECT c.table_name FROM information_schema.columns c JOIN information_schema.tables t"
            " USING (table_schema, table_name) WHERE c.table_schema = 'public' AND c.column_name = 'org_id'"
            " AND t.table_type = 'BASE TABLE' ORDER BY 1"
        ).fetchall()
    ]
    counts = {t: owner.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in tables}  # type: ignore[index]
    counts["organizations"] = owner.execute("SELECT count(*) FROM organizations").fetchone()[0]  # type: ignore[index]
    counts["users"] = owner.execute("SELECT count(*) FROM users").fetchone()[0]  # type: ignore[index]
    return counts


async def test_an_archived_deleted_purged_org_is_restored_row_for_row_and_verified(
    api: Api, api0: Api, db: Database, settings: Settings, owner: psycopg.Connection[Any]
) -> None:
    org = await _seeded(api0, db)
    content = await _archive(api0, db, settings, org)
    before = _rows(owner, org.id)

    # The original is still here: its ids are taken.
    r = await _post(api, org.owner, content, "name=Back")
    assert_problem(r, 409, "ids_in_use")
    # newIds: restored beside it, every id of projects, tasks and memberships mapped, and verified through the map.
    beside = await _restore(api, db, settings, org.owner, content, "name=Beside&newIds=true")
    assert beside["state"] == "completed", beside
    assert beside["report"]["verified"] is True, beside["report"]
    id_map = beside["report"]["idMap"]
    assert len(id_map["projects"]) == 2 and len(id_map["tasks"]) == 5 and len(id_map["memberships"]) == 5
    mapped = _rows(owner, beside["orgId"])
    assert len(mapped["tickets"]) == len(before["tickets"])
    for new, was in zip(mapped["tickets"], before["tickets"], strict=True):
        assert new[:6] == was[:6] and new[7:] == was[7:]
        assert new[6] == (None if was[6] is None else uuid.UUID(id_map["memberships"][str(was[6])]))

    # Deleted and purged, then restored with its own ids: every row equal.
    r = await api0.call(
        "POST", org.path("/deletion"), org.owner, json={"confirm": "Restored Co", "skipFinalExport": True}
    )
    assert r.status_code == 202, r.text
    assert await purge_org(db, uid(org.id)) is not None
    back = await _restore(api, db, settings, org.owner, content, "name=Restored%20Co")
    assert back["state"] == "completed" and back["report"]["verified"] is True, back
    assert back["report"]["idMap"] == {}
    assert back["report"]["counts"] == {"members": 5, "projects": 2, "tasks": 5, "tickets": 5}
    assert len(back["report"]["members"]["matched"]) == 5 and back["report"]["members"]["placeholders"] == []
    after = _rows(owner, back["orgId"])
    assert after == before

    # The new org works and its archive's data files have the original's digests.
    new_org = Org(back["orgId"], org.owner, org.admin, org.member, org.customer, org.customer2, org.memberships)
    r = await api.call("GET", new_org.path("/tickets?pageSize=10"), org.admin)
    assert r.status_code == 200 and r.json()["total"] == 5
    assert _digests(await _archive(api, db, settings, new_org)) == _digests(content)
    # The importer was told.
    r = await api.call("GET", "/me/notifications?limit=5", org.owner)
    assert any(n["type"] == "import.completed" and n["importId"] == back["id"] for n in r.json()["items"])


async def test_a_dry_run_reports_and_writes_nothing(
    api: Api, db: Database, settings: Settings, owner: psycopg.Connection[Any]
) -> None:
    org = await _seeded(api, db)
    content = await _archive(api, db, settings, org)
    counts = _tenant_counts(owner)
    dry = await _restore(api, db, settings, org.owner, content, "name=Dry&dryRun=true&newIds=true")
    assert dry["state"] == "completed" and dry["dryRun"] is True and dry["orgId"] is None
    # Safe to run twice: a finished import is left as it is.
    assert await run_import(settings, db, None, uid(dry["id"]), org.owner.id) == "skipped"
    assert dry["report"]["counts"] == {"members": 5, "projects": 2, "tasks": 5, "tickets": 5}
    assert dry["report"]["idsInUse"] == 7 and len(dry["report"]["members"]["matched"]) == 5
    assert _tenant_counts(owner) == counts
    # Without newIds a dry run reports the ids in use instead of refusing them.
    plain = await _restore(api, db, settings, org.owner, content, "name=Dry&dryRun=true")
    assert plain["state"] == "completed" and plain["report"]["needsNewIds"] is True, plain
    assert plain["report"]["idsInUse"] == 7
    assert _tenant_counts(owner) == counts


def _reassigned(tickets: bytes) -> bytes:
    """The first ticket assigned to a membership the archive does not have."""
    first, rest = tickets.split(b"\n", 1)
    line = json.loads(first)
    line["assigneeId"] = str(uuid.uuid4())
    return json.dumps(line, separators=(",", ":"), ensure_ascii=False).encode() + b"\n" + rest


def _rebuild(
    content: bytes,
    change: dict[str, bytes | None],
    *,
    manifest: bool = True,
    extra: str | None = None,
    version: int = 2,
) -> bytes:
    """The archive with members replaced (None: removed), and the manifest made to agree when `manifest`."""
    source = zipfile.ZipFile(io.BytesIO(content))
    members = {n: source.read(n) for n in source.namelist()}
    for name, data in change.items():
        if data is None:
            members.pop(name, None)
        else:
            members[name] = data
    doc = json.loads(members["manifest.json"])
    doc["schemaVersion"] = version
    if manifest:
        for f in doc["files"]:
            if f["name"] in members:
                f["bytes"], f["sha256"] = len(members[f["name"]]), hashlib.sha256(members[f["name"]]).hexdigest()
        doc["files"] = [f for f in doc["files"] if f["name"] in members]
        members["manifest.json"] = json.dumps(doc).encode()
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        for name, data in members.items():
            z.writestr(name, data)
        if extra:
            z.writestr(extra, b"surprise")
    return out.getvalue()


def _bomb() -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("manifest.json", b"{}")
        z.writestr("data/tickets.jsonl", b"\n" * (50 * 1024 * 1024))
    return out.getvalue()


@pytest.mark.parametrize(
    "case",
    [
        "changed_byte",
        "missing_member",
        "extra_member",
        "dot_dot_name",
        "bad_line",
        "zip_bomb",
        "not_a_zip",
        "version_1",
        "unknown_assignee",
    ],
)
async def test_a_broken_archive_fails_archive_invalid_and_leaves_no_row(
    api: Api, db: Database, settings: Settings, owner: psycopg.Connection[Any], case: str
) -> None:
    org = await _seeded(api, db)
    content = await _archive(api, db, settings, org)
    tickets = zipfile.ZipFile(io.BytesIO(content)).read("data/tickets.jsonl")
    body, where = {
        "changed_byte": (
            _rebuild(content, {"data/tickets.jsonl": tickets.replace(b"fire", b"fira")}, manifest=False),
            "data/tickets.jsonl",
        ),
        "missing_member": (_rebuild(content, {"data/tasks.jsonl": None}), "data/tasks.jsonl"),
        "extra_member": (_rebuild(content, {}, extra="notes.txt"), "notes.txt"),
        "dot_dot_name": (_rebuild(content, {}, extra="../evil.sh"), "../evil.sh"),
        "bad_line": (
            _rebuild(content, {"data/tickets.jsonl": tickets.replace(b'"status":"open"', b'"status":"lost"', 1)}),
            "data/tickets.jsonl, line 1",
        ),
        "zip_bomb": (_bomb(), "ZIP bomb"),
        "not_a_zip": (b"PK\x03\x04 not really", "not a readable ZIP"),
        "version_1": (_rebuild(content, {}, version=1), "schemaVersion 1 is not supported"),
        "unknown_assignee": (
            _rebuild(content, {"data/tickets.jsonl": _reassigned(tickets)}),
            "data/tickets.jsonl, line 1: the ticket's assignee",
        ),
    }[case]
    counts = _tenant_counts(owner)
    failed = await _restore(api, db, settings, org.owner, body, "name=Broken&newIds=true")
    assert failed["state"] == "failed" and failed["errorCode"] == "archive_invalid", failed
    assert where in failed["errorDetail"], failed["errorDetail"]
    assert failed["orgId"] is None
    assert _tenant_counts(owner) == counts


async def test_a_body_over_the_limit_is_413_too_large(
    api: Api, db: Database, settings: Settings, owner: psycopg.Connection[Any], tmp_path: Any
) -> None:
    from litestar.testing import AsyncTestClient

    from space.app import create_app

    org = await api.org()
    counts = _tenant_counts(owner)
    small = tuned(settings, import_byte_limit=1000, import_dir=str(tmp_path))
    async with AsyncTestClient(app=create_app(small)) as client:
        r = await client.post(
            "/imports?name=Big",
            content=b"x" * 5000,
            headers={**org.owner.headers, "content-type": "application/zip"},
        )
        assert_problem(r, 413, "too_large")  # its Content-Length said so: refused before reading

    async def chunked() -> Any:
        for _ in range(5):
            yield b"x" * 1000

    # Sent without a length (chunked, over a real socket): refused as the spooled body passes the limit.
    async with serving(small) as url, httpx.AsyncClient(base_url=url) as http:
        r = await http.post(
            "/imports?name=Big", content=chunked(), headers={**org.owner.headers, "content-type": "application/zip"}
        )
    assert_problem(r, 413, "too_large")
    assert list(tmp_path.iterdir()) == []
    assert _tenant_counts(owner) == counts


async def test_another_users_import_is_404_and_the_name_is_required(api: Api, db: Database, settings: Settings) -> None:
    org = await api.org()
    r = await _post(api, org.owner, b"PK", "dryRun=true")
    assert_problem(r, 400, "invalid_request")
    r = await api.call("POST", "/imports?name=X", org.owner, content=b"PK", headers={"content-type": "text/plain"})
    assert_problem(r, 400, "invalid_request")
    r = await _post(api, org.owner, b"PK", "name=Mine&dryRun=true")
    assert r.status_code == 202, r.text
    import_id = r.json()["id"]
    assert (await api.call("GET", f"/imports/{import_id}", org.owner)).status_code == 200
    for other in (org.admin, org.customer):
        assert_problem(await api.call("GET", f"/imports/{import_id}", other), 404, "not_found")
    assert_problem(await api.call("GET", f"/imports/{uuid.uuid4()}", org.owner), 404, "not_found")
    assert_problem(await api.call("GET", "/imports/nope", org.owner), 404, "not_found")


async def test_an_unknown_email_becomes_a_placeholder_that_users_add_claims(
    api: Api, db: Database, settings: Settings, owner: psycopg.Connection[Any], owner_url: str
) -> None:
    org = await _seeded(api, db)
    content = await _archive(api, db, settings, org)
    members = zipfile.ZipFile(io.BytesIO(content)).read("data/members.jsonl")
    newcomer = f"newcomer-{uuid.uuid4().hex[:8]}@example.test"
    changed = _rebuild(
        content, {"data/members.jsonl": members.replace(org.customer2.email.encode(), newcomer.encode())}
    )
    done = await _restore(api, db, settings, org.owner, changed, "name=Placeholder&newIds=true")
    assert done["state"] == "completed", done
    assert done["report"]["members"]["placeholders"] == [newcomer]
    row = owner.execute("SELECT placeholder FROM users WHERE email = %s", [newcomer]).fetchone()
    assert row == (True,)
    # `space users add` with that email claims the placeholder: it prints a token, and the membership is theirs.
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPACE_")}
    space = str(Path(sys.executable).with_name("space"))
    out = await asyncio.to_thread(
        subprocess.run,
        [space, "users", "add", newcomer, "--name", "New Comer"],
        env={**env, "DATABASE_URL": owner_url},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    token = out.stdout.strip().splitlines()[-1]
    r = await api.client.get("/orgs", headers={"Authorization": f"Bearer {token}"})
    assert done["orgId"] in [o["id"] for o in r.json()["items"]]
    row = owner.execute("SELECT name, placeholder FROM users WHERE email = %s", [newcomer]).fetchone()
    assert row == ("New Comer", False)


async def test_the_new_org_counts_against_the_importers_org_limit(
    api: Api, db: Database, settings: Settings, owner: psycopg.Connection[Any], tmp_path: Any
) -> None:
    from litestar.testing import AsyncTestClient

    from space.app import create_app

    org = await _seeded(api, db)
    content = await _archive(api, db, settings, org)
    counts = _tenant_counts(owner)
    one = tuned(settings, orgs_per_user=1, import_dir=str(tmp_path))  # the owner created one org: theirs
    async with AsyncTestClient(app=create_app(one)) as client:
        r = await client.post(
            "/imports?name=OneTooMany&newIds=true",
            content=content,
            headers={**org.owner.headers, "content-type": "application/zip"},
        )
    assert_problem(r, 409, "org_limit_reached")
    assert list(tmp_path.iterdir()) == []
    assert _tenant_counts(owner) == counts


async def test_a_queued_import_whose_entry_was_lost_is_enqueued_again(
    api: Api, db: Database, settings: Settings
) -> None:
    from sqlalchemy import text

    from space.db import UnitOfWork
    from space.imports.service import reconcile

    org = await api.org()
    r = await _post(api, org.owner, b"PK not a zip", "name=Waiting&dryRun=true")
    assert r.status_code == 202, r.text
    waiting = r.json()["id"]

    async def listed() -> set[str]:
        async with UnitOfWork(db.sessionmaker) as uow:
            rows = await uow.session.execute(text("SELECT import_id FROM space_imports_waiting(interval '0', 1000)"))
            return {str(row[0]) for row in rows}

    assert waiting in await listed()
    # The reconciler puts it on the queue again (SAQ keeps one entry per import's key: never two runs at once).
    assert await reconcile(db, settings, api.client.app.state.queue, grace=0, limit=1000) >= 1
    await run_import(settings, db, None, uid(waiting), org.owner.id)
    assert waiting not in await listed()
