"""When a schedule runs: the first slot of its cadence (hour, day at HH:MM, week on a weekday at HH:MM; UTC)
strictly after a moment. Runs missed while no worker ran are made once: the next slot is counted from now."""

from __future__ import annotations

import datetime as dt

from space.schedules.models import Every


def next_slot(every: Every, at_minute: int, weekday: int | None, after: dt.datetime) -> dt.datetime:
    """The first slot strictly after `after` (an aware datetime), in UTC."""
    t = after.astimezone(dt.UTC)
    if every is Every.hour:
        slot = t.replace(minute=0, second=0, microsecond=0)
        return slot + dt.timedelta(hours=1)
    day = t.replace(hour=at_minute // 60, minute=at_minute % 60, second=0, microsecond=0)
    if every is Every.day:
        return day if day > t else day + dt.timedelta(days=1)
    # ISO weekday: Monday is 1.
    ahead = ((weekday or 1) - t.isoweekday()) % 7
    slot = day + dt.timedelta(days=ahead)
    return slot if slot > t else slot + dt.timedelta(days=7)


def parse_at(value: str | None) -> int:
    """`HH:MM` as minutes after midnight (none: 0)."""
    if value is None:
        return 0
    hours, minutes = value.split(":")
    return int(hours) * 60 + int(minutes)


def format_at(at_minute: int) -> str:
    """Minutes after midnight as `HH:MM`."""
    return f"{at_minute // 60:02d}:{at_minute % 60:02d}"
