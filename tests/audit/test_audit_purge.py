"""The purge removes an org's audit trail with the org and counts it in the tombstone; other orgs keep theirs."""

from __future__ import annotations

from typing import Any

import psycopg

from space.config import Settings
from space.db import Database
from space.orgs.jobs import purge_due
from tests.helpers import Api
from tests.orgs.fixtures import org_row, request_deletion


def _audit_rows(owner: psycopg.Connection[Any], org_id: str) -> int:
    row = owner.execute("SELECT count(*) FROM audit_events WHERE org_id = %s", (org_id,)).fetchone()
    assert row is not None
    return int(row[0])


async def test_purge_removes_the_trail_and_counts_it(
    api0: Api, db: Database, settings0: Settings, owner: psycopg.Connection[Any]
) -> None:
    doomed, kept = await api0.org(), await api0.org()
    await request_deletion(api0, doomed)
    # Four members added and the deletion request.
    trail = _audit_rows(owner, doomed.id)
    assert trail == 5
    kept_trail = _audit_rows(owner, kept.id)

    purged = await purge_due(settings0, db, batch_rows=2)

    assert doomed.id in [str(p.org_id) for p in purged]
    assert _audit_rows(owner, doomed.id) == 0
    assert org_row(owner, doomed.id)["purged_counts"]["audit_events"] == trail
    assert _audit_rows(owner, kept.id) == kept_trail
