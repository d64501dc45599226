"""The schedules' cron: each due schedule makes one run, an ordinary export (SPEC §5) owned by its creator with
`scheduleId`. Due schedules are found across orgs by `space_schedules_due` (ids only); each is then claimed under
its org's context with FOR UPDATE SKIP LOCKED, so two workers make one run. A run is made once however many slots
were missed: the next slot is counted from now. A schedule whose previous run is still queued or running waits
for it (an incremental run needs the previous one's snapshot), and is made by the first tick after it ended.
Runs do not count against the creator's rate limits; the org's concurrency (the claim) and result quota (the
publish) hold for them as for every export.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from saq import Queue
from sqlalchemy import select, text

from space.config import Settings
from space.db import Database, Tenant, UnitOfWork
from space.exports import ledger
from space.exports.formats.registry import ExportKind
from space.exports.models import ExportJob, ExportScope, ExportState
from space.exports.queue import enqueue_quietly
from space.orgs import service as orgs
from space.orgs.models import OrgState
from space.schedules.cadence import next_slot
from space.schedules.models import Every, Schedule

log = logging.getLogger("space.schedules")

DUE_LIMIT = 100
"""Schedules one tick looks at; the rest are due at the next."""


async def run_due_schedules_job(ctx: Any) -> dict[str, int]:
    """SAQ cron entry: make the runs of every due schedule."""
    made = await run_due(ctx["settings"], ctx["db"], ctx["worker"].queue)
    return {"runs": made}


async def run_due(settings: Settings, db: Database, queue: Queue | None) -> int:
    """Make one run of each due schedule; how many were made."""
    async with UnitOfWork(db.sessionmaker, Tenant()) as uow:
        due = (await uow.session.execute(text("SELECT * FROM space_schedules_due(:n)"), {"n": DUE_LIMIT})).all()
    made = 0
    for schedule_id, org_id in due:
        try:
            made += await make_run(settings, db, queue, org_id, schedule_id) is not None
        except Exception:
            log.exception("schedule %s of org %s: its run was not made; the next tick tries again", schedule_id, org_id)
    return made


async def make_run(
    settings: Settings, db: Database, queue: Queue | None, org_id: uuid.UUID, schedule_id: uuid.UUID
) -> uuid.UUID | None:
    """The due schedule's run (its export's id), or None: not due any more, taken by another worker, its previous
    run still active, or its org being deleted (then its slot passes without a run)."""
    async with UnitOfWork(db.sessionmaker, Tenant(org_id=org_id)) as uow:
        session = uow.session
        now = (await session.execute(text("SELECT now()"))).scalar_one()
        s = await session.scalar(
            select(Schedule)
            .where(Schedule.org_id == org_id, Schedule.id == schedule_id, ~Schedule.paused, Schedule.next_run_at <= now)
            .with_for_update(skip_locked=True)
        )
        if s is None:
            return None
        state = await orgs.org_state(session, org_id)
        if state in (OrgState.deleting.value, OrgState.deleted.value, None):
            s.next_run_at = next_slot(Every(s.every), s.at_minute, s.weekday, now)
            return None
        if await ledger.schedule_active(session, org_id, schedule_id):
            return None
        job = await ledger.add(
            session,
            ExportJob(
                id=uuid.uuid4(),
                org_id=org_id,
                creator_id=s.created_by,
                kind=s.kind,
                state=ExportState.queued.value,
                filters=s.filters or {},
                delimiter=s.delimiter,
                # A schedule is an owner's or admin's: its runs read what staff see (re-checked at claim and
                # publish, where a creator no longer owner or admin fails the run `access_revoked`).
                scope=ExportScope.team.value,
                schedule_id=s.id,
                incremental=s.incremental,
            ),
        )
        s.last_run_at = now
        s.last_export_id = job.id
        s.next_run_at = next_slot(Every(s.every), s.at_minute, s.weekday, now)
        export_id, kind = job.id, ExportKind(job.kind)
        if queue is not None and await ledger.active(session, org_id) <= settings.export_org_concurrency:

            async def enqueue() -> None:
                await enqueue_quietly(queue, settings, export_id, org_id, kind)

            uow.after_commit(enqueue)
    log.info("schedule %s of org %s made run %s", schedule_id, org_id, export_id)
    return export_id
