"""The re-keying migration (SPEC §28) on a populated database of the revision before it: every row of every table
the same, value for value, after the upgrade and again after the downgrade; the stored export downloads with the
same sha256 at the end; the catalogue breaches are gone after the upgrade and back after the downgrade."""

from __future__ import annotations

import hashlib
import uuid

import psycopg

from space.db.migrate import downgrade, scripts, upgrade
from tests.db.keys import violations
from tests.db.test_backup_restore import _populate, running_app
from tests.exports.fixtures import download
from tests.helpers import Org, fresh_database

# Found by its file, not its number: revisions are renumbered when branches merge.
REKEY = next(s for s in scripts().walk_revisions() if s.path.endswith("_rekey.py"))
BEFORE = str(REKEY.down_revision)


def table_digests(url: str) -> dict[str, tuple[int, str]]:
    """Row count and a digest of every row's values, per table (from the catalogue, not a list), the superuser's
    view; Alembic's own table aside."""
    with psycopg.connect(url) as conn:
        tables = conn.execute(
            "SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE c.relkind IN ('r', 'p') AND n.nspname IN ('public', 'saq') AND c.relname <> 'alembic_version'"
            " ORDER BY 1"
        ).fetchall()
        digests = {}
        for (t,) in tables:
            row = conn.execute(
                f"SELECT count(*), md5(coalesce(string_agg(r::text, '|' ORDER BY r::text), '')) FROM {t} r"
            )
            digests[t] = row.fetchone()  # type: ignore[assignment]
        return digests  # type: ignore[return-value]


def _outbound_rows(url: str, org: Org, export_id: str) -> None:
    """A webhook endpoint with a delivery and an attempt, and an email notification: rows the API writes only
    against a live receiver, written here as the owner."""
    endpoint, delivery = uuid.uuid4(), uuid.uuid4()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO webhook_endpoints (id, org_id, url, events, secret) VALUES"
            " (%s, %s, 'https://hooks.example.test/in', '{export.completed}', 's3cret')",
            (endpoint, org.id),
        )
        conn.execute(
            "INSERT INTO webhook_deliveries (id, org_id, endpoint_id, event_id, event_type, body, state, attempts)"
            " VALUES (%s, %s, %s, gen_random_uuid(), 'export.completed', '{}', 'delivered', 1)",
            (delivery, org.id, endpoint),
        )
        conn.execute(
            "INSERT INTO webhook_attempts (id, org_id, endpoint_id, delivery_id, attempt, status, response_code)"
            " VALUES (gen_random_uuid(), %s, %s, %s, 1, 'succeeded', 204)",
            (org.id, endpoint, delivery),
        )
        conn.execute(
            "INSERT INTO notifications (id, org_id, user_id, channel, type, export_id, title)"
            " SELECT gen_random_uuid(), org_id, creator_id, 'email', 'export.completed', id, 'Ready' FROM export_jobs"
            " WHERE id = %s",
            (uuid.UUID(export_id),),
        )


async def _sha256(url: str, org: Org, export_id: str) -> str:
    async with running_app(url, export_chunk_bytes=512) as (api, _, _):
        r = await download(api, org, org.member, export_id)
    assert r.status_code == 200, r.text
    return hashlib.sha256(r.content).hexdigest()


async def test_rekey_keeps_every_row_and_export(owner_url: str) -> None:
    with fresh_database(owner_url, "space_rekey") as url:
        # Orgs, members, projects, tasks, tickets (some assigned), two completed exports in many chunks, with
        # downloads, the audit rows all of that wrote, in-app notifications; then webhooks and an email. Made by
        # the app at head (the code can't run against an older schema), then taken down to the revision before.
        async with running_app(url, export_chunk_bytes=512) as (api, db, settings):
            org, export_id = await _populate(api, db, settings)
        _outbound_rows(url, org, export_id)
        sha = await _sha256(url, org, export_id)
        downgrade(url, BEFORE)
        before = table_digests(url)
        for table in ("memberships", "tasks", "export_chunks", "audit_events", "webhook_attempts", "notifications"):
            assert before[f"public.{table}"][0] > 0, table
        old_breaches = violations_at(url)
        assert old_breaches

        upgrade(url, REKEY.revision)
        assert table_digests(url) == before
        assert violations_at(url) == []

        downgrade(url, BEFORE)
        assert table_digests(url) == before
        assert violations_at(url) == old_breaches

        # Every chunk's bytes were equal throughout (the digests); back at head the export downloads as before.
        upgrade(url, "head")
        assert await _sha256(url, org, export_id) == sha


def violations_at(url: str) -> list[str]:
    with psycopg.connect(url) as conn:
        return violations(conn)
