"""What notifications say, in the page's own words (web/static/words.js: KINDS, EXPORT_REASONS, IMPORT_REASONS,
size, count), so
an email and the page never tell one failure two ways; tests/notifications/test_words.py holds the two together."""

from __future__ import annotations

import datetime as dt

KINDS = {
    "snapshot": "Snapshot (JSON)",
    "archive": "Complete archive (ZIP)",
    "tickets_csv": "Tickets (CSV)",
    "tickets_xlsx": "Tickets (Excel workbook)",
}

EXPORT_REASONS = {
    "cancelled": "You cancelled this export.",
    "cancelled_by_admin": "An owner or administrator of the organization cancelled this export.",
    "access_revoked": "Your role in the organization changed, so this export was stopped: you may no longer take this data.",
    "org_deleting": "The organization is being deleted, so this export was stopped.",
    "too_many_rows": "Too many rows for one export. Narrow the filters and request it again.",
    "too_large": "The file would be too large. Narrow the filters and request it again.",
    "quota_exceeded": "The organization's storage for exports is full. Delete older exports, then request it again.",
    "worker_lost": "The export was interrupted several times and could not finish. Request it again.",
    "timeout": "Reading the data took too long. Request it again, perhaps with narrower filters.",
    "export_revoked": "An owner or administrator of the organization removed this export's file. Request a new one if you still need it.",
}

IMPORT_REASONS = {
    "archive_invalid": "The file is not a complete Space archive as it was made: a member is missing, extra or changed, or a line is not valid. Nothing of it was kept.",
    "ids_in_use": "The archive's projects and tasks are still here (is the original organization still here?). Restore it with new ids.",
    "org_limit_reached": "You have created as many organizations as one person may.",
    "too_large": "The archive is larger than this Space accepts for a restore.",
    "restore_failed": "The restore stopped on an unexpected error; nothing of it was kept. Try again.",
}


def kind(value: str | None) -> str:
    """An export kind as the page names it."""
    return KINDS.get(value or "", value or "export")


def reason(error_code: str | None) -> str:
    """Why an export ended without a result, as the page says it."""
    if not error_code:
        return ""
    return EXPORT_REASONS.get(error_code, f"The export stopped ({error_code}).")


def import_reason(error_code: str | None) -> str:
    """Why a restore failed, as the page says it (never the import's `errorDetail`: that may quote the archive)."""
    return IMPORT_REASONS.get(error_code or "", f"The restore stopped ({error_code}); nothing of it was kept.")


def size(n: int | None) -> str:
    """ "812 bytes", "2.4 KiB", as the page writes sizes."""
    if n is None:
        return ""
    units = ["bytes", "KiB", "MiB", "GiB", "TiB"]
    value = float(n)
    unit = 0
    while value >= 1024 and unit < len(units) - 1:
        value /= 1024
        unit += 1
    return f"{n} bytes" if unit == 0 else f"{value:.1f} {units[unit]}"


def count(n: int) -> str:
    """ "1 row", "1,205 rows"."""
    return "1 row" if n == 1 else f"{n:,} rows"


def when(at: dt.datetime) -> str:
    """A moment in UTC, spelled out: "4 Dec 2026, 13:50 UTC"."""
    utc = at.astimezone(dt.UTC)
    return f"{utc.day} {utc:%b %Y, %H:%M} UTC"
