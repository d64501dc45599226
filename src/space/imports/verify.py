"""Verification of a restore (SPEC §23): the new org read back, its data files written as the archive writes them
(`datafiles`, the same statements), in the archive's own ids, and their SHA-256 compared with the manifest's.

Inside the restore's transaction, before it commits: a temporary table holds every id that is not the archive's
(users matched by email or given a new placeholder id, ids mapped by newIds), so each file is written in the
archive's ids and order. `verified` is true only when all four digests are the manifest's.
"""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

from space.db import UnitOfWork, driver_connection
from space.exports.formats.archive import ManifestV2
from space.exports.formats.datafiles import FILES, copy_lines
from space.imports.restore import Plan

MAP_TABLE = "pg_temp.import_map"


async def verify(uow: UnitOfWork, org_id: uuid.UUID, plan: Plan, manifest: ManifestV2) -> dict[str, Any]:
    """`{"verified": bool, "files": {name: {"sha256", "expected", "rows"}}}` for the new org's data files."""
    conn = await driver_connection(uow.session)
    await conn.execute(f"CREATE TEMP TABLE {MAP_TABLE.split('.')[1]} (kind text, new uuid, old uuid) ON COMMIT DROP")
    rows: list[tuple[str, uuid.UUID, uuid.UUID]] = [("user", new, old) for old, new in plan.users.items() if old != new]
    rows += [("membership", new, old) for old, new in plan.memberships.items()]
    rows += [(kind, new, old) for kind, ids in plan.ids.items() for old, new in ids.items()]
    async with conn.cursor() as cur:
        async with cur.copy(f"COPY {MAP_TABLE} (kind, new, old) FROM STDIN") as copy:
            for row in rows:
                await copy.write_row(row)
        await cur.execute(f"ANALYZE {MAP_TABLE}")
    expected = {f.name: f.sha256 for f in manifest.files}
    files: dict[str, Any] = {}
    for name in FILES:
        digest = hashlib.sha256()
        count = 0
        async for data, n in copy_lines(conn, name, org_id, MAP_TABLE if rows else None):
            digest.update(data)
            count += n
        files[name] = {"sha256": digest.hexdigest(), "expected": expected.get(name), "rows": count}
    return {"verified": all(f["sha256"] == f["expected"] for f in files.values()), "files": files}
