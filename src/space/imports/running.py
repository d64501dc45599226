"""One import's run, in the export worker lane (SPEC §23): check the whole archive, plan, restore, verify.

Safe to run twice: a row already completed or failed is left alone; a row left `running` by a worker that died
is run again from the start (nothing of it was committed: the restore is one transaction). Progress is written
in short transactions of its own, beside the long one: 1-10 checking, 10-90 writing rows, 90-99 verifying.
The upload is fetched from `import_chunks` into a local file of this worker's; whatever the outcome, its pieces
are deleted in the transaction that ends the import, and the local file once it has ended.

Its end is told to the importer in that same transaction (SPEC §19): `import.completed` in the new org,
`import.failed` in the importer's own notifications (no org was made).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
import zipfile
from typing import Any

from saq import Queue
from sqlalchemy import func, select, update

from space.auth.models import User
from space.config import Settings
from space.db import Database, Tenant, UnitOfWork
from space.errors import SpaceError
from space.exports.formats.datafiles import FILES
from space.imports import reading, restore, upload, verify
from space.imports.models import Import, ImportState
from space.imports.service import discard
from space.notifications import service as notifications
from space.notifications.models import NotificationType
from space.notifications.service import Notice, notify

log = logging.getLogger("space.imports")


async def _set(db: Database, tenant: Tenant, import_id: uuid.UUID, **values: Any) -> None:
    async with UnitOfWork(db.sessionmaker, tenant) as uow:
        await uow.session.execute(
            update(Import).where(Import.user_id == tenant.user_id, Import.id == import_id).values(**values)
        )


def _counts(checked: reading.Checked) -> dict[str, int]:
    return {name.removeprefix("data/").removesuffix(".jsonl"): checked.rows.get(name, 0) for name in FILES}


async def run_import(
    settings: Settings, db: Database, queue: Queue | None, import_id: uuid.UUID, user_id: uuid.UUID
) -> str:
    """Run the import; its end state ("completed", "failed", or "skipped" when it was not waiting)."""
    tenant = Tenant(user_id=user_id)
    async with UnitOfWork(db.sessionmaker, tenant) as uow:
        row = await uow.session.scalar(
            select(Import).where(Import.user_id == user_id, Import.id == import_id).with_for_update()
        )
        if row is None or row.state not in (ImportState.queued, ImportState.running):
            return "skipped"
        row.state, row.phase, row.progress = ImportState.running.value, "checking", 1
        name, dry_run, new_ids = row.name, row.dry_run, row.new_ids
        email = await uow.session.scalar(select(User.email).where(User.id == user_id)) or ""
    async with UnitOfWork(db.sessionmaker, tenant) as uow:
        path = await upload.fetch(uow.session, settings, user_id, import_id)
    try:
        checked = await asyncio.to_thread(reading.check, path, settings.archive_byte_limit)
        total = max(1, sum(checked.rows.values()))
        await _set(db, tenant, import_id, phase="restoring", progress=10)

        async def progress(rows: int) -> None:
            await _set(db, tenant, import_id, progress=min(89, 10 + rows * 80 // total))

        with zipfile.ZipFile(path) as archive:
            async with UnitOfWork(db.sessionmaker, tenant) as uow:
                # A dry run reports ids in use rather than refusing them.
                plan = await restore.plan(uow, archive, checked, new_ids or dry_run, email)
                report: dict[str, Any] = {
                    "counts": _counts(checked),
                    "members": {"matched": plan.matched, "placeholders": plan.placeholder_emails},
                    "idsInUse": plan.in_use,
                }
                if dry_run and plan.in_use and not new_ids:
                    report["needsNewIds"] = True
                org_id = None
                if not dry_run:
                    org_id = await restore.write(uow, archive, checked, plan, name, settings.orgs_per_user, progress)
                    await _set(db, tenant, import_id, phase="verifying", progress=90)
                    report.update(await verify.verify(uow, org_id, plan, checked.manifest))
                report["idMap"] = plan.id_map()
                if plan.creators_reassigned:
                    report["creatorsReassigned"] = plan.creators_reassigned
                await uow.session.execute(
                    update(Import)
                    .where(Import.user_id == user_id, Import.id == import_id)
                    .values(
                        state=ImportState.completed.value,
                        phase=None,
                        progress=100,
                        org_id=org_id,
                        report=report,
                        completed_at=func.clock_timestamp(),
                    )
                )
                if org_id is not None:
                    verified = "verified" if report.get("verified") else "not verified"
                    notice = Notice(
                        type=NotificationType.import_completed,
                        org_id=org_id,
                        recipients=[user_id],
                        title=f"Your archive was restored as {name} ({verified})",
                        details={"rows": sum(checked.rows.values()), "verified": report.get("verified")},
                        import_id=import_id,
                    )
                    await notify(uow, queue, notice)
                await upload.drop(uow.session, user_id, import_id)
        discard(path)
        return ImportState.completed.value
    except reading.ArchiveInvalid as exc:
        failure = ("archive_invalid", exc.detail)
    except SpaceError as exc:
        failure = (exc.code, exc.detail)
    except Exception:
        log.exception("import %s stopped", import_id)
        failure = ("restore_failed", "The restore stopped on an unexpected error; nothing of it was kept. Try again.")
    await _fail(db, queue, tenant, import_id, path, *failure, name=name, dry_run=dry_run)
    return ImportState.failed.value


async def _fail(
    db: Database,
    queue: Queue | None,
    tenant: Tenant,
    import_id: uuid.UUID,
    path: str,
    code: str,
    detail: str,
    *,
    name: str,
    dry_run: bool,
) -> None:
    log.info("import %s failed: %s", import_id, code)
    assert tenant.user_id is not None
    async with UnitOfWork(db.sessionmaker, tenant) as uow:
        # Only a run still in charge ends it: a second run of the same import (a retry after a stall) that finds
        # it ended changes nothing and tells nobody again.
        ended = await uow.session.execute(
            update(Import)
            .where(Import.user_id == tenant.user_id, Import.id == import_id, Import.state == ImportState.running.value)
            .returning(Import.id)
            .values(
                state=ImportState.failed.value,
                phase=None,
                error_code=code,
                error_detail=detail,
                completed_at=func.clock_timestamp(),
            )
        )
        # Told in the transaction that fails it; the email says the code in words, never `detail` (it may quote
        # the archive). A dry run tells nobody: it writes nothing, and its report is the answer.
        if ended.first() is not None and not dry_run:
            await notifications.import_failed(
                uow, queue, user_id=tenant.user_id, import_id=import_id, name=name, error_code=code
            )
        await upload.drop(uow.session, tenant.user_id, import_id)
    discard(path)
