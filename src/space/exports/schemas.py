"""Payloads of exports: the create request is a tagged union on `kind`; the resource is SPEC §5's shape."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any, Literal

import msgspec

from space.exports.models import ExportKind, ExportScope, ExportState
from space.schemas import Input, Output
from space.tickets.filters import TicketFilters


class SnapshotRequest(Input, tag="snapshot", tag_field="kind"):
    """`{"kind": "snapshot"}`: the org's live projects and tasks as JSON (staff only)."""


class TicketsCsvRequest(Input, tag="tickets_csv", tag_field="kind"):
    """`{"kind": "tickets_csv", "filters": {...}, "delimiter": "," | ";"}`: tickets matching the filters."""

    filters: TicketFilters = msgspec.field(default_factory=TicketFilters)
    delimiter: Literal[",", ";"] = ","


class ArchiveRequest(Input, tag="archive", tag_field="kind"):
    """`{"kind": "archive"}`: one ZIP with the snapshot, every ticket, a manifest and schemas (staff only)."""


ExportCreate = SnapshotRequest | TicketsCsvRequest | ArchiveRequest

STAFF_ONLY = (SnapshotRequest, ArchiveRequest)
"""Requests that read the whole org: staff only (SPEC §5, §13)."""


class Export(Output):
    """An export as its owner sees it."""

    id: uuid.UUID
    kind: ExportKind
    state: ExportState
    progress: int
    error_code: str | None
    filters: dict[str, Any]
    delimiter: Literal[",", ";"]
    """The CSV's column separator (a tickets CSV as requested; an archive's tickets.csv is always `,`)."""
    scope: ExportScope
    created_at: dt.datetime
    started_at: dt.datetime | None
    snapshot_at: dt.datetime | None
    completed_at: dt.datetime | None
    expires_at: dt.datetime | None
    row_count: int | None
    byte_size: int | None
    sha256: str | None
    can_download: bool


class Link(Output):
    """A download link: the result route with a signed `token=`, working until `expiresAt`."""

    url: str
    expires_at: dt.datetime


class ExportCreator(Output):
    """Who requested an export (the org-wide list)."""

    user_id: uuid.UUID
    name: str


class OrgExport(Export):
    """An export in the org-wide list of owners and admins: metadata and its creator, never its content."""

    creator: ExportCreator
