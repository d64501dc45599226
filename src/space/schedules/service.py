"""Schedules as the API sees them (owners and admins): create (within the org's limit), list, read, change,
delete, and each schedule's runs. Every query names `org_id` beside the RLS policy; nothing here runs a schedule
(that is `jobs`)."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import msgspec
from sqlalchemy import delete, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from space.destinations import service as destinations
from space.errors import InvalidRequest, NotFound, ScheduleLimitReached
from space.exports.models import ExportJob
from space.exports.schemas import ExportCreate
from space.orgs import service as orgs
from space.schedules.cadence import format_at, next_slot, parse_at
from space.schedules.models import Every, PausedReason, Schedule
from space.schedules.schemas import INCREMENTAL_KINDS, ScheduleCreate, ScheduleOut, ScheduleRun, ScheduleUpdate

RUNS_SHOWN = 50
"""A schedule's runs its page lists, newest first."""


def schedule_out(s: Schedule) -> ScheduleOut:
    """The API shape of a schedule."""
    every = Every(s.every)
    return ScheduleOut(
        id=s.id,
        kind=s.kind,
        filters=s.filters or {},
        delimiter=s.delimiter,
        every=every,
        at=None if every is Every.hour else format_at(s.at_minute),
        weekday=s.weekday,
        incremental=s.incremental,
        destination_id=s.destination_id,
        paused=s.paused,
        paused_reason=PausedReason(s.paused_reason) if s.paused_reason else None,
        created_by=s.created_by,
        created_at=s.created_at,
        next_run_at=s.next_run_at,
        last_run_at=s.last_run_at,
        last_export_id=s.last_export_id,
        consecutive_failures=s.consecutive_failures,
    )


def _cadence(every: Every, at: str | None, weekday: int | None) -> tuple[int, int | None]:
    if every is Every.hour and at is not None:
        raise InvalidRequest("at: an hourly schedule runs at the top of every hour.", errors=[{"key": "at"}])
    if every is not Every.week and weekday is not None:
        raise InvalidRequest("weekday: only a weekly schedule has one.", errors=[{"key": "weekday"}])
    return parse_at(at), (weekday or 1) if every is Every.week else None


def _request(data: ScheduleCreate) -> tuple[dict[str, Any], str]:
    """The runs' export request, checked as the create route checks one: its filters and delimiter as kept."""
    body: dict[str, Any] = {"kind": data.kind}
    if data.filters is not None:
        body["filters"] = data.filters
    if data.delimiter is not None:
        body["delimiter"] = data.delimiter
    try:
        request = msgspec.convert(body, ExportCreate)
    except msgspec.ValidationError as exc:
        raise InvalidRequest(f"The export a run makes is not valid: {exc}", errors=[{"key": "filters"}]) from None
    if data.incremental and data.kind not in INCREMENTAL_KINDS:
        raise InvalidRequest("incremental: an archive is always complete.", errors=[{"key": "incremental"}])
    return request.ledger_filters(), request.ledger_delimiter()


async def _destination_of_org(session: AsyncSession, org_id: uuid.UUID, destination_id: uuid.UUID | None) -> None:
    """A schedule names only a destination of its own org (SPEC §22): 400 otherwise, never a foreign key's 500."""
    if destination_id is not None and not await destinations.exists_in(session, org_id, destination_id):
        raise InvalidRequest(
            "destinationId: this organization has no such destination.", errors=[{"key": "destinationId"}]
        )


async def _now(session: AsyncSession) -> dt.datetime:
    now: dt.datetime = (await session.execute(select(func.now()))).scalar_one()
    return now


async def create_schedule(
    session: AsyncSession, org_id: uuid.UUID, actor_id: uuid.UUID, data: ScheduleCreate, *, limit: int
) -> ScheduleOut:
    """Under the org lock: the caller's role again, then the org's count (at most `limit`)."""
    at_minute, weekday = _cadence(data.every, data.at, data.weekday)
    filters, delimiter = _request(data)
    await orgs.lock_org(session, org_id)
    await orgs.authority(session, org_id, actor_id, orgs.MANAGERS)
    count = await session.scalar(select(func.count()).select_from(Schedule).where(Schedule.org_id == org_id))
    await _destination_of_org(session, org_id, data.destination_id)
    if (count or 0) >= limit:
        raise ScheduleLimitReached(f"This organization has {count} schedules; at most {limit} are allowed.")
    schedule = Schedule(
        id=uuid.uuid4(),
        org_id=org_id,
        kind=data.kind,
        filters=filters,
        delimiter=delimiter,
        every=data.every.value,
        at_minute=at_minute,
        weekday=weekday,
        incremental=data.incremental,
        destination_id=data.destination_id,
        created_by=actor_id,
        next_run_at=next_slot(data.every, at_minute, weekday, await _now(session)),
    )
    session.add(schedule)
    await session.flush()
    await session.refresh(schedule)
    return schedule_out(schedule)


async def _get(session: AsyncSession, org_id: uuid.UUID, schedule_id: uuid.UUID, *, lock: bool = False) -> Schedule:
    query = select(Schedule).where(Schedule.org_id == org_id, Schedule.id == schedule_id)
    found = await session.scalar(query.with_for_update() if lock else query)
    if found is None:
        raise NotFound()
    return found


async def list_schedules(session: AsyncSession, org_id: uuid.UUID) -> list[ScheduleOut]:
    """The org's schedules, oldest first."""
    rows = await session.scalars(
        select(Schedule).where(Schedule.org_id == org_id).order_by(Schedule.created_at, Schedule.id)
    )
    return [schedule_out(s) for s in rows]


async def get_schedule(session: AsyncSession, org_id: uuid.UUID, schedule_id: uuid.UUID) -> ScheduleOut:
    """One schedule of the org."""
    return schedule_out(await _get(session, org_id, schedule_id))


async def update_schedule(
    session: AsyncSession, org_id: uuid.UUID, schedule_id: uuid.UUID, data: ScheduleUpdate
) -> ScheduleOut:
    """Pause or resume (a resumed schedule starts counting failures again), or change its cadence or
    destination; the next run is counted again from now."""
    s = await _get(session, org_id, schedule_id, lock=True)
    every = Every(s.every) if data.every is msgspec.UNSET else data.every
    at = (None if every is Every.hour else format_at(s.at_minute)) if data.at is msgspec.UNSET else data.at
    weekday = (s.weekday if every is Every.week else None) if data.weekday is msgspec.UNSET else data.weekday
    s.at_minute, s.weekday = _cadence(every, at, weekday)
    s.every = every.value
    if data.destination_id is not msgspec.UNSET:
        await _destination_of_org(session, org_id, data.destination_id)
        s.destination_id = data.destination_id
    if data.paused is not msgspec.UNSET and data.paused != s.paused:
        s.paused = data.paused
        s.paused_reason = PausedReason.user.value if data.paused else None
        s.consecutive_failures = 0
    s.next_run_at = next_slot(every, s.at_minute, s.weekday, await _now(session))
    await session.flush()
    return schedule_out(s)


async def delete_schedule(session: AsyncSession, org_id: uuid.UUID, schedule_id: uuid.UUID) -> None:
    """Remove a schedule; its runs stay the exports they are (their `scheduleId` is cleared)."""
    result = await session.execute(
        delete(Schedule).where(Schedule.org_id == org_id, Schedule.id == schedule_id).returning(Schedule.id)
    )
    if result.first() is None:
        raise NotFound()


async def list_runs(session: AsyncSession, org_id: uuid.UUID, schedule_id: uuid.UUID) -> list[ScheduleRun]:
    """The schedule's latest runs, newest first."""
    await _get(session, org_id, schedule_id)
    jobs = await session.scalars(
        select(ExportJob)
        .where(ExportJob.org_id == org_id, ExportJob.schedule_id == schedule_id)
        .order_by(ExportJob.created_at.desc(), ExportJob.id.desc())
        .limit(RUNS_SHOWN)
    )
    return [
        ScheduleRun(
            export_id=j.id,
            state=j.state,
            error_code=j.error_code,
            created_at=j.created_at,
            completed_at=j.completed_at,
            row_count=j.row_count,
            byte_size=j.byte_size,
            since=j.since,
            since_export_id=j.since_export_id,
        )
        for j in jobs
    ]
