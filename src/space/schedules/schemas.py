"""Payloads of schedules: the create and change requests, the schedule as shown, and one of its runs."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Annotated, Any, Literal

import msgspec

from space.schedules.models import Every, PausedReason
from space.schemas import Input, Output

ScheduledKind = Literal["snapshot", "tickets_csv", "tickets_xlsx", "archive"]
INCREMENTAL_KINDS = frozenset({"snapshot", "tickets_csv", "tickets_xlsx"})
"""The kinds whose runs can hold only what changed since the previous run (SPEC §21)."""
At = Annotated[str, msgspec.Meta(pattern=r"^([01][0-9]|2[0-3]):[0-5][0-9]$", examples=["06:30"])]
Weekday = Annotated[int, msgspec.Meta(ge=1, le=7)]


class ScheduleCreate(Input):
    """`{kind, filters?, delimiter?, every, at?, weekday?, incremental?, destinationId?}`: what each run exports
    (as an export request of that kind would) and when (UTC)."""

    kind: ScheduledKind
    every: Every
    filters: dict[str, Any] | None = None
    delimiter: Literal[",", ";"] | None = None
    at: At | None = None
    weekday: Weekday | None = None
    incremental: bool = False
    destination_id: uuid.UUID | None = None


class ScheduleUpdate(Input, omit_defaults=True):
    """`{paused?, every?, at?, weekday?, destinationId?}`: the fields a schedule's managers may change."""

    paused: bool | msgspec.UnsetType = msgspec.UNSET
    every: Every | msgspec.UnsetType = msgspec.UNSET
    at: At | msgspec.UnsetType | None = msgspec.UNSET
    weekday: Weekday | msgspec.UnsetType | None = msgspec.UNSET
    destination_id: uuid.UUID | msgspec.UnsetType | None = msgspec.UNSET


class ScheduleOut(Output):
    """A schedule as SPEC §21 shows it."""

    id: uuid.UUID
    kind: str
    filters: dict[str, Any]
    delimiter: str
    every: Every
    at: str | None
    weekday: int | None
    incremental: bool
    destination_id: uuid.UUID | None
    paused: bool
    paused_reason: PausedReason | None
    created_by: uuid.UUID
    created_at: dt.datetime
    next_run_at: dt.datetime
    last_run_at: dt.datetime | None
    last_export_id: uuid.UUID | None
    consecutive_failures: int


class ScheduleRun(Output):
    """One run of a schedule: the export it made, as its managers may see it (metadata, never content)."""

    export_id: uuid.UUID
    state: str
    error_code: str | None
    created_at: dt.datetime
    completed_at: dt.datetime | None
    row_count: int | None
    byte_size: int | None
    since: dt.datetime | None
    since_export_id: uuid.UUID | None
