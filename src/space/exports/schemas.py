"""Payloads of exports: the create request is a tagged union on `kind`; the resource is SPEC §5's shape."""

from __future__ import annotations

import datetime as dt
import functools
import operator
import uuid
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeAlias, TypeVar

from space.destinations.schemas import Delivery
from space.exports.formats.base import ExportRequest
from space.exports.formats.registry import KINDS, ExportKind
from space.exports.models import ExportScope, ExportState
from space.schemas import Output

# The tagged union on `kind` of every kind's request, in the registry's order. mypy sees the requests' base (a
# union built at run time is no type to it); Litestar and msgspec see the union itself.
if TYPE_CHECKING:
    ExportCreate: TypeAlias = ExportRequest
else:
    ExportCreate = functools.reduce(operator.or_, (kind.request for kind in KINDS.values()))


class Export(Output):
    """An export as its owner sees it."""

    id: uuid.UUID
    kind: ExportKind
    state: ExportState
    progress: int
    error_code: str | None
    error_detail: str | None
    """Why it failed, in words: which limit it passed and the setting that raises it (None: the code says it all)."""
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
    schedule_id: uuid.UUID | None
    """The schedule that made it (SPEC §21), or None."""
    since: dt.datetime | None
    """An incremental run's start: the previous run's `snapshotAt` (None: the run is complete)."""
    since_export_id: uuid.UUID | None
    """The previous run an incremental run continues from."""
    delivery: Delivery | None
    """The latest delivery of this export to a destination (SPEC §22), or None."""


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


E = TypeVar("E", bound=Export)


class ExportPage(Output, Generic[E], omit_defaults=True):
    """A page of an export list, newest first; `next` is the cursor of the older page (pass it as `before`), absent
    at the list's end (so a list that fits one page answers `{"items": [...]}` as it always did)."""

    items: list[E]
    next: str | None = None
