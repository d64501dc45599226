"""What one export delivers: its files, each with the name, size, SHA-256, rows and media type the manifest lists,
and a way to read its bytes.

Most kinds deliver their one result file (`space-export-<exportId>.<ext>`), whose SHA-256 the ledger holds. The
complete archive delivers its members instead (`snapshot.json`, `tickets.csv`, `schemas/...`, and whatever later
versions add), as a loader wants files, not a ZIP: the archive is copied once to a temporary file (a ZIP is read
from its end), and its own `manifest.json` gives each member's size and SHA-256, which every copy is checked
against. The delivery writes its own manifest last, in the same shape.
"""

from __future__ import annotations

import contextlib
import tempfile
import zipfile
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import IO

import msgspec

from space.exports.formats.archive import MANIFEST_MEMBER
from space.exports.formats.registry import KINDS, ExportKind
from space.exports.models import ExportJob
from space.exports.storage.protocol import READ_PIECE_BYTES, ResultKey, ResultStore


class Delivered(msgspec.Struct):
    """One file as the delivery's manifest lists it."""

    name: str
    size: int
    sha256: str
    media_type: str
    rows: int | None = None


class _Member(msgspec.Struct, rename="camel"):
    """A member as an archive's manifest lists it (any schemaVersion: unknown fields are let be)."""

    name: str
    size: int = msgspec.field(name="bytes")
    sha256: str = ""
    media_type: str = "application/octet-stream"
    rows: int | None = None


class _Listing(msgspec.Struct):
    files: list[_Member]


@dataclass(frozen=True)
class File:
    """One file to deliver: what the manifest says of it, and its bytes, read when asked."""

    delivered: Delivered
    pieces: Callable[[], AsyncIterator[bytes]]

    @property
    def name(self) -> str:
        """Its name under the run's folder."""
        return self.delivered.name

    @property
    def media_type(self) -> str:
        """Its Content-Type."""
        return self.delivered.media_type

    @property
    def sha256(self) -> str:
        """What its bytes must hash to."""
        return self.delivered.sha256


def _key(export: ExportJob) -> ResultKey:
    assert export.execution_id is not None
    return ResultKey(export.org_id, export.id, export.execution_id)


@contextlib.asynccontextmanager
async def files_of(export: ExportJob, store: ResultStore) -> AsyncIterator[list[File]]:
    """The export's files, readable until the block ends."""
    kind = ExportKind(export.kind)
    if kind is not ExportKind.archive:
        assert export.sha256 is not None and export.byte_size is not None
        entry = Delivered(
            name=f"space-export-{export.id}.{KINDS[kind].extension}",
            size=export.byte_size,
            sha256=export.sha256,
            media_type=KINDS[kind].media_type,
            rows=export.row_count,
        )
        yield [File(entry, lambda: store.read(_key(export), 0, export.byte_size))]
        return
    with tempfile.TemporaryFile() as spool:
        async for piece in store.read(_key(export), 0, export.byte_size):
            spool.write(piece)
        spool.seek(0)
        with zipfile.ZipFile(spool) as archive:
            listed = msgspec.json.decode(archive.read(MANIFEST_MEMBER), type=_Listing)
            yield [
                File(
                    Delivered(name=f.name, size=f.size, sha256=f.sha256, media_type=f.media_type, rows=f.rows),
                    _member_reader(archive, f.name),
                )
                for f in listed.files
            ]


def _member_reader(archive: zipfile.ZipFile, name: str) -> Callable[[], AsyncIterator[bytes]]:
    async def pieces() -> AsyncIterator[bytes]:
        member: IO[bytes]
        with archive.open(name) as member:
            while piece := member.read(READ_PIECE_BYTES):
                yield piece

    return pieces
