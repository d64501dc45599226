"""Imports (SPEC §23): the upload spooled (never held in memory), its row, and the importer's view.

The body is written to a local file in `SPACE_IMPORT_DIR` as it arrives and refused past
`SPACE_IMPORT_BYTE_LIMIT` (413 `too_large`, the file removed). Before answering 202 the upload is looked at once,
cheaply: the first ids of its projects and tasks, so that restoring an archive whose original is still here
answers 409 `ids_in_use` at once (the restore checks every id again). The row is written with the upload's pieces
(`upload.store`: any worker of any host can restore it), and the restore job enqueued after the commit.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import uuid
import zipfile
from collections.abc import AsyncIterator
from typing import Any

import msgspec
from saq import Job, Queue
from sqlalchemy import select, text

from space.auth.service import Principal
from space.config import Settings
from space.db import UnitOfWork, driver_connection
from space.db.locks import lock_user
from space.errors import InvalidRequest, NotFound, OrgLimitReached, SpaceError
from space.exports.formats.datafiles import PROJECTS, TASKS
from space.imports import upload
from space.imports.models import Import
from space.imports.restore import IdsInUse
from space.imports.schemas import ImportOut
from space.orgs import service as orgs
from space.schemas import Name

RUN_IMPORT = "run_import_job"
log = logging.getLogger("space.imports")
_FIRST_IDS = 10_000


class TooLarge(SpaceError):
    status, code, title = 413, "too_large", "The archive is too large"


async def spool(settings: Settings, body: AsyncIterator[bytes]) -> tuple[str, int]:
    """Write the body to a new file; (its path, its size). Past the limit: the file removed, 413."""
    fd, path = tempfile.mkstemp(prefix="import-", suffix=".zip", dir=upload.local_dir(settings))
    size = 0
    try:
        with os.fdopen(fd, "wb") as out:
            async for chunk in body:
                size += len(chunk)
                if size > settings.import_byte_limit:
                    raise TooLarge(
                        f"The archive passes the limit of {settings.import_byte_limit} bytes (SPACE_IMPORT_BYTE_LIMIT)."
                    )
                out.write(chunk)
    except BaseException:
        discard(path)
        raise
    return path, size


def discard(path: str) -> None:
    """Remove a spooled upload (gone already: nothing to do)."""
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)


def parse_name(name: str | None) -> str:
    """The new org's name, as an org's name is checked (400 invalid_request naming `name`)."""
    try:
        return msgspec.convert(name, Name).strip()
    except msgspec.ValidationError:
        raise InvalidRequest(
            "Query parameter `name` (the new organization's name) is required: 1-200 characters."
        ) from None


class _Id(msgspec.Struct):
    id: uuid.UUID


def first_ids(path: str) -> list[uuid.UUID]:
    """Up to _FIRST_IDS project and task ids of the upload, or none when it can't be read so (the job says why)."""
    found: list[uuid.UUID] = []
    decoder = msgspec.json.Decoder(_Id)
    try:
        with zipfile.ZipFile(path) as archive:
            for name in (PROJECTS, TASKS):
                with archive.open(name) as stream:
                    for line in stream:
                        found.append(decoder.decode(line).id)
                        if len(found) >= _FIRST_IDS:
                            return found
    except Exception:
        return found
    return found


async def create(
    uow: UnitOfWork, principal: Principal, settings: Settings, name: str, path: str, size: int, flags: dict[str, bool]
) -> ImportOut:
    """The import's row (queued); 409 org_limit_reached or ids_in_use before any work is queued."""
    await lock_user(uow.session, principal.user_id)
    created = await orgs.created_orgs(uow.session, principal.user_id)
    if created >= settings.orgs_per_user:
        raise OrgLimitReached(f"You created {created} organizations; at most {settings.orgs_per_user} are allowed.")
    if not flags["new_ids"] and not flags["dry_run"]:
        ids = first_ids(path)
        if ids:
            conn = await driver_connection(uow.session)
            cur = await conn.execute("SELECT count(*) FROM space_import_ids_in_use(%s::uuid[])", [ids])
            row = await cur.fetchone()
            if row is not None and row[0]:
                raise IdsInUse(
                    f"{row[0]} project and task ids of the archive are in use in this installation (is the original"
                    " organization still here?). Ask again with newIds=true to give them new ids."
                )
    row_ = Import(
        id=uuid.uuid4(),
        user_id=principal.user_id,
        name=name,
        dry_run=flags["dry_run"],
        new_ids=flags["new_ids"],
        byte_size=size,
    )
    uow.session.add(row_)
    await uow.session.flush()
    await upload.store(uow.session, principal.user_id, row_.id, path)
    await uow.session.refresh(row_)
    return out(row_)


def out(row: Import) -> ImportOut:
    """The import as its importer sees it."""
    return ImportOut(
        id=row.id,
        name=row.name,
        state=row.state,  # type: ignore[arg-type]
        progress=row.progress,
        phase=row.phase,
        dry_run=row.dry_run,
        new_ids=row.new_ids,
        org_id=row.org_id,
        report=row.report,
        error_code=row.error_code,
        error_detail=row.error_detail,
        byte_size=row.byte_size,
        created_at=row.created_at,
        completed_at=row.completed_at,
    )


async def get(uow: UnitOfWork, user_id: uuid.UUID, import_id: uuid.UUID) -> ImportOut:
    """The caller's own import; anyone else's (or none) is 404."""
    row = await uow.session.scalar(select(Import).where(Import.user_id == user_id, Import.id == import_id))
    if row is None:
        raise NotFound("No such import.")
    return out(row)


def import_job(settings: Settings, import_id: uuid.UUID, user_id: uuid.UUID) -> Job:
    """The SAQ job of a restore: keyed by the import (one queue entry each), bounded like an archive's read."""
    return Job(
        function=RUN_IMPORT,
        kwargs={"import_id": str(import_id), "user_id": str(user_id)},
        key=f"import-{import_id}",
        timeout=int(settings.archive_timeout_seconds) + 60,
        retries=2,  # SAQ counts runs: one more if a worker died mid-restore (nothing of it was committed)
    )


async def enqueue(queue: Queue, settings: Settings, import_id: uuid.UUID, user_id: uuid.UUID) -> Any:
    """Put the restore on the export lane's queue (after the commit)."""
    return await queue.enqueue(import_job(settings, import_id, user_id))


RECONCILE_GRACE_SECONDS = 60
"""An import queued this long may have lost its queue entry (an enqueue after the commit that failed)."""


async def reconcile(
    db: Any, settings: Settings, queue: Queue, grace: float = RECONCILE_GRACE_SECONDS, limit: int = 100
) -> int:
    """Enqueue again every import queued for longer than `grace` seconds; SAQ keeps one entry per import (its key),
    so one that still has its entry is not doubled. How many were found."""
    async with UnitOfWork(db.sessionmaker) as uow:
        rows = (
            await uow.session.execute(
                text("SELECT import_id, import_user_id FROM space_imports_waiting(make_interval(secs => :g), :n)"),
                {"g": grace, "n": limit},
            )
        ).all()
    for import_id, user_id in rows:
        try:
            await enqueue(queue, settings, import_id, user_id)
        except Exception:
            log.exception("enqueue of import %s failed; the next round tries again", import_id)
    return len(rows)
