"""The `archive` kind, the complete archive (SPEC §13): one ZIP of the snapshot, every ticket as CSV, a manifest and a schema.

The ZIP's structures are written by zipstream-ng (docs/decisions/0053-the-archive-writer.md): members are
stored (no compression) with a data descriptor, so each is streamed as it is read, never held whole. A member
whose size is unknown when its header goes out (the snapshot and the CSV) gets ZIP64 fields, since it might
pass 4 GiB; members of known size (the schema, the manifest) and the central directory use ZIP64 only when
their sizes or offsets need it.

Members, in this order: `snapshot.json`, `tickets.csv`, the lossless data files of schemaVersion 2
(`data/*.jsonl`, SPEC §23, written by `datafiles`), `schemas/snapshot.schema.json`, `manifest.json`.
The manifest goes last because it carries the size and SHA-256 of every member before it; ZIP readers find
members through the central directory at the end, so the order costs a reader nothing.

zipstream-ng pulls member data from plain iterators; the data comes from the database asynchronously. The
bridge has no thread: a member's iterator first yields an empty piece, which zipstream-ng passes straight
through (adding nothing to the CRC or the sizes); the driver, seeing the member ask, awaits the next batch
and resumes the generator, which hands it on. Memory stays at one batch.

The JSON Schemas (2020-12) of the snapshot and the manifest are generated from the msgspec types that write
them, once per process, and served at `/schemas/snapshot-v1.json` and `/schemas/manifest-v1.json`.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import hashlib
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from typing import Annotated, Any, Literal

import msgspec
from sqlalchemy.ext.asyncio import AsyncSession
from zipstream import ZIP_STORED, ZipStream

from space.exports.formats.base import BATCH_BYTES, Batch, ExportRequest, Format, Order, rfc3339
from space.exports.formats.datafiles import FILES as DATA_FILES
from space.exports.formats.datafiles import MEDIA_TYPE as DATA_MEDIA_TYPE
from space.exports.formats.datafiles import DataFile
from space.exports.formats.snapshot import FILE as SNAPSHOT_FILE
from space.exports.formats.snapshot import Id, Snapshot, SnapshotDocument, Stamp
from space.exports.formats.tickets_csv import FILE as TICKETS_FILE
from space.exports.formats.tickets_csv import TicketsCsv
from space.orgs import service as orgs
from space.tickets.filters import TicketFilters

SNAPSHOT_MEMBER = SNAPSHOT_FILE
TICKETS_MEMBER = TICKETS_FILE
SCHEMA_MEMBER = "schemas/snapshot.schema.json"
MANIFEST_MEMBER = "manifest.json"
SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
_INLINE_HASH_BYTES = 64 * 1024
"""Smaller pieces are hashed in the event loop; larger ones in a thread (hashlib lets go of the GIL)."""


class ArchiveRequest(ExportRequest, tag="archive"):
    """`{"kind": "archive"}`: one ZIP with the snapshot, every ticket, a manifest and schemas (staff only)."""


async def open_archive(session: AsyncSession, order: Order, membership_id: uuid.UUID) -> Archive:
    """The org's archive (its name read in the snapshot); its CSV holds every ticket, whatever the order says."""
    return Archive(order.org_id, await orgs.org_name(session, order.org_id))


class ManifestFile(msgspec.Struct, rename="camel", forbid_unknown_fields=True, omit_defaults=True):
    """One other member of the archive: its name, size, SHA-256, records (data members) and media type."""

    name: str
    size: Annotated[int, msgspec.Meta(ge=0)] = msgspec.field(name="bytes")
    sha256: Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")] = ""
    media_type: str = ""
    rows: Annotated[int, msgspec.Meta(ge=0)] | msgspec.UnsetType = msgspec.UNSET


class Manifest(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    """What a Space archive holds (schemaVersion 1): every member but this one, with sizes and SHA-256."""

    schema_version: Literal[1]
    organization_id: Id
    organization_name: str
    snapshot_at: Stamp
    files: list[ManifestFile]


class ManifestV2(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    """What a Space archive holds (schemaVersion 2, SPEC §23): the v1 members and the lossless data files
    (`data/*.jsonl`, each with its rows), every member but this one, with sizes and SHA-256."""

    schema_version: Literal[2]
    organization_id: Id
    organization_name: str
    snapshot_at: Stamp
    files: list[ManifestFile]


def _schema(kind: type[msgspec.Struct], title: str) -> bytes:
    # msgspec writes the types under "$defs" and "$ref"s the top one, which 2020-12 allows beside "$schema".
    schema: dict[str, Any] = {"$schema": SCHEMA_DIALECT, "title": title, **msgspec.json.schema(kind)}
    return msgspec.json.format(msgspec.json.encode(schema), indent=2) + b"\n"


@functools.cache
def snapshot_schema() -> bytes:
    """The JSON Schema (2020-12) of `snapshot.json` and of every snapshot export."""
    return _schema(SnapshotDocument, "Space snapshot, schemaVersion 1")


@functools.cache
def manifest_schema() -> bytes:
    """The JSON Schema (2020-12) of an archive's `manifest.json`."""
    return _schema(Manifest, "Space archive manifest, schemaVersion 1")


@functools.cache
def manifest_v2_schema() -> bytes:
    """The JSON Schema (2020-12) of the manifest an archive of schemaVersion 2 carries (what Space writes now)."""
    return _schema(ManifestV2, "Space archive manifest, schemaVersion 2")


class _Member:
    """A data member as it is written: where its pieces come from, and what the manifest will say of it."""

    def __init__(self, name: str, media_type: str, source: AsyncGenerator[Batch]) -> None:
        self.name = name
        self.media_type = media_type
        self.source = source
        self.size = 0
        self.rows = 0
        self.digest = hashlib.sha256()
        self.piece: bytes | bytearray | memoryview | None = None

    def entry(self) -> ManifestFile:
        return ManifestFile(self.name, self.size, self.digest.hexdigest(), self.media_type, self.rows)


class _Feed:
    """Hands the driver's pieces to zipstream-ng's pull, one at a time (see the module's docstring)."""

    def __init__(self) -> None:
        self.asking: _Member | None = None

    def pieces(self, member: _Member) -> Iterator[bytes | bytearray | memoryview]:
        while True:
            self.asking = member
            yield b""  # passed through untouched: tells the driver this member wants its next piece
            piece, member.piece = member.piece, None
            if piece is None:
                return
            yield piece


async def _pieces(
    fmt: Format, session: AsyncSession, bounds: tuple[int, int], snapshot_at: dt.datetime
) -> AsyncGenerator[Batch]:
    yield Batch(rows=0, last=None, data=fmt.header(snapshot_at))
    # Closed with this generator: a format's reads (their cursors, a read-ahead task) end before the transaction.
    async with contextlib.aclosing(fmt.batches(session, *bounds)) as batches:  # type: ignore[type-var]
        async for batch in batches:
            yield batch
    yield Batch(rows=0, last=None, data=fmt.footer())


class Archive:
    """SPEC §13's ZIP, read in the export's one snapshot transaction. A Format whose batches are ZIP bytes:
    each carries the rows of the snapshot or CSV batches it holds, so progress counts both parts."""

    def __init__(self, org_id: uuid.UUID, org_name: str) -> None:
        self.org_id = org_id
        self.org_name = org_name
        self.snapshot = Snapshot(org_id, org_name)
        # Every ticket of the org, `,`: the same writer, filters and order as a tickets_csv export (team scope).
        self.tickets = TicketsCsv(org_id, TicketFilters(), None, ",")
        self.snapshot_at: dt.datetime | None = None

    async def count(self, session: AsyncSession) -> dict[str, int]:
        """Rows of each data member: live projects and their tasks (snapshot.json), every ticket (tickets.csv), and
        every row of each data file."""
        counts = {**await self.snapshot.count(session), **await self.tickets.count(session)}
        for name in DATA_FILES:
            counts.update(await DataFile(self.org_id, name).count(session))
        return counts

    def header(self, snapshot_at: dt.datetime) -> bytes:
        """Nothing: the ZIP begins with its first member. Keeps the moment the snapshot stands for."""
        self.snapshot_at = snapshot_at
        return b""

    async def batches(self, session: AsyncSession, size: int, budget: int = BATCH_BYTES) -> AsyncIterator[Batch]:
        """The ZIP's bytes as they are made, members streamed from the snapshot transaction in turn (each read in
        batches of at most `size` rows and about `budget` bytes)."""
        assert self.snapshot_at is not None, "header() gives the snapshot's moment first"
        snapshot_at = self.snapshot_at
        feed = _Feed()
        members = [
            _Member(SNAPSHOT_MEMBER, "application/json", _pieces(self.snapshot, session, (size, budget), snapshot_at)),
            _Member(
                TICKETS_MEMBER, "text/csv; charset=utf-8", _pieces(self.tickets, session, (size, budget), snapshot_at)
            ),
            *(
                _Member(
                    name, DATA_MEDIA_TYPE, _pieces(DataFile(self.org_id, name), session, (size, budget), snapshot_at)
                )
                for name in DATA_FILES
            ),
        ]
        schema = snapshot_schema()
        schema_entry = ManifestFile(
            SCHEMA_MEMBER, len(schema), hashlib.sha256(schema).hexdigest(), "application/schema+json"
        )
        zip_ = ZipStream(compress_type=ZIP_STORED)
        for member in members:
            zip_.add(feed.pieces(member), member.name)
        zip_.add(schema, SCHEMA_MEMBER)
        try:
            async for batch in self._zip(zip_, feed, members, snapshot_at, schema_entry):
                yield batch
        finally:
            # Also when the export stops midway: nothing may read on the snapshot's connection afterwards.
            for member in members:
                await member.source.aclose()

    async def _zip(
        self,
        zip_: ZipStream,
        feed: _Feed,
        members: list[_Member],
        snapshot_at: dt.datetime,
        schema_entry: ManifestFile,
    ) -> AsyncIterator[Batch]:
        left = len(members)
        rows = 0
        for chunk in zip_:
            asking, feed.asking = feed.asking, None
            if asking is not None:
                batch = await anext(asking.source, None)
                if batch is None:
                    left -= 1
                    if not left:
                        # Queued behind the schema; written once the last data member's hash is known.
                        zip_.add(
                            self._manifest(snapshot_at, [*(m.entry() for m in members), schema_entry]), MANIFEST_MEMBER
                        )
                    continue
                await _hash(asking, batch.data)
                asking.piece = batch.data
                rows += batch.rows
                asking.rows += batch.rows
            elif chunk:
                yield Batch(rows=rows, last=None, data=chunk)
                rows = 0

    def _manifest(self, snapshot_at: dt.datetime, files: list[ManifestFile]) -> bytes:
        manifest = ManifestV2(2, str(self.org_id), self.org_name, rfc3339(snapshot_at), files)
        return msgspec.json.format(msgspec.json.encode(manifest), indent=2) + b"\n"

    def footer(self) -> bytes:
        """Nothing: the ZIP's central directory is the last of its batches."""
        return b""


async def _hash(member: _Member, data: bytes | bytearray | memoryview) -> None:
    member.size += len(data)
    if len(data) < _INLINE_HASH_BYTES:
        member.digest.update(data)
    else:
        await asyncio.to_thread(member.digest.update, data)
