"""Every export kind, one row each: its request, its media type and extension, who may request it, how the worker
opens its format, the limits it runs under, whether it is a final export, and the share of the chunk size its
result is stored in. The service, the create route's request union, the ledger and the worker read this table;
nothing else branches on a kind.

A new kind is a module (its request, its format and its opener) and a row here: its name in `ExportKind` and its
`Kind`. `export_jobs.kind` is constrained by a CHECK (migrations 0001, 0010), so a new kind also needs a
migration that admits its name (tests/exports/test_kinds.py compares the two).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from space.config import Settings
from space.exports.formats.archive import ArchiveRequest, open_archive
from space.exports.formats.base import ExportRequest, Opener
from space.exports.formats.snapshot import SnapshotRequest, open_snapshot
from space.exports.formats.tickets_csv import TicketsCsvRequest, open_tickets_csv
from space.exports.formats.tickets_xlsx import CHUNK_SHARE as XLSX_CHUNK_SHARE
from space.exports.formats.tickets_xlsx import MEDIA_TYPE as XLSX_MEDIA_TYPE
from space.exports.formats.tickets_xlsx import TicketsXlsxRequest, open_tickets_xlsx
from space.exports.limits import Limits, archive, one_export


class ExportKind(enum.StrEnum):
    """What an export produces."""

    snapshot = "snapshot"
    tickets_csv = "tickets_csv"
    archive = "archive"
    """One ZIP of the snapshot, every ticket as CSV, a manifest and the snapshot's schema (SPEC §13)."""
    tickets_xlsx = "tickets_xlsx"
    """The tickets of a tickets_csv export as an Excel workbook (SPEC §20)."""


@dataclass(frozen=True)
class Kind:
    """One export kind: `request` is its create body (tagged with its name); `media_type` the whole Content-Type
    of its result; `customers`: whether a customer may request it (else staff only, SPEC §5); `open` builds its
    format in the worker's snapshot transaction; `limits` the bounds of its run, from the settings; `final`:
    whether a completed one satisfies the final-export rule of a deletion request (SPEC §3, §13); `chunk_share`:
    the share of SPACE_EXPORT_CHUNK_BYTES its chunks hold (1 but for a kind whose bytes are compressed already)."""

    request: type[ExportRequest]
    media_type: str
    extension: str
    customers: bool
    open: Opener
    limits: Callable[[Settings], Limits]
    final: bool
    chunk_share: float = 1.0


SNAPSHOT_HINT = (
    "The complete archive (kind archive) has limits of its own, far higher; the operator of this Space can also"
    " raise that setting."
)
TICKETS_HINT = "Narrow the filters, or ask the operator of this Space to raise that setting."


# In the order of the create body's union (the OpenAPI document's oneOf).
KINDS: dict[ExportKind, Kind] = {
    ExportKind.snapshot: Kind(
        SnapshotRequest,
        "application/json",
        "json",
        customers=False,
        open=open_snapshot,
        limits=partial(one_export, hint=SNAPSHOT_HINT),
        final=True,
    ),
    ExportKind.tickets_csv: Kind(
        TicketsCsvRequest,
        "text/csv; charset=utf-8",
        "csv",
        customers=True,
        open=open_tickets_csv,
        limits=partial(one_export, hint=TICKETS_HINT),
        final=False,
    ),
    ExportKind.archive: Kind(
        ArchiveRequest, "application/zip", "zip", customers=False, open=open_archive, limits=archive, final=True
    ),
    ExportKind.tickets_xlsx: Kind(
        TicketsXlsxRequest,
        XLSX_MEDIA_TYPE,
        "xlsx",
        customers=True,
        open=open_tickets_xlsx,
        limits=partial(one_export, hint=TICKETS_HINT),
        final=False,
        chunk_share=XLSX_CHUNK_SHARE,
    ),
}

FINAL_KINDS = tuple(name.value for name, kind in KINDS.items() if kind.final)
"""Kinds that satisfy the final-export rule of a deletion request (SPEC §3, §13)."""

_NAMES = {kind.request: name for name, kind in KINDS.items()}


def kind_of(request: ExportRequest) -> ExportKind:
    """The kind a create body asks for."""
    return _NAMES[type(request)]
