"""Payloads of imports: the resource of SPEC §23 (`report` is the restore's, or the dry run's, in words and counts)."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from space.imports.models import ImportState
from space.schemas import Output


class ImportOut(Output):
    """An import as its importer sees it: `progress` 0-100 (`phase` says which step), `orgId` once restored,
    `report` once done (counts, members matched and placeholders, id conflicts or the id map, `verified`),
    `errorCode` and `errorDetail` (the member and line) when it failed."""

    id: uuid.UUID
    name: str
    state: ImportState
    progress: int
    phase: str | None
    dry_run: bool
    new_ids: bool
    org_id: uuid.UUID | None
    report: dict[str, Any] | None
    error_code: str | None
    error_detail: str | None
    byte_size: int
    created_at: dt.datetime
    completed_at: dt.datetime | None
