"""Reading an uploaded archive (SPEC §23): everything is checked before any row is written, at constant memory.

`check` opens the spooled ZIP and refuses, as `ArchiveInvalid` naming the member and line: a file that is not a
ZIP; names that are duplicated, absolute, hold `..` or a backslash; a ZIP bomb (a member or the whole past
`max_bytes` uncompressed, or a compressed member that would grow more than MAX_RATIO times); members other
than exactly the manifest's; a manifest that is not schemaVersion 2; a member whose size or SHA-256 differs
from the manifest's; a data file line that is not valid against its type (msgspec decodes each into it), out of
the writer's order (which also rules out duplicates) or whose reference does not resolve (a task's project, a
ticket's assignee); a data file whose line count is not the manifest's `rows`.

Only what restore needs whole is kept: the members (one line per membership) and the project ids. The lines
are read again, one at a time, when they are written (`lines`).
"""

from __future__ import annotations

import hashlib
import uuid
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any

import msgspec

from space.exports.formats.archive import MANIFEST_MEMBER, ManifestV2
from space.exports.formats.datafiles import FILES, MEMBERS, PROJECTS, TASKS, TICKETS
from space.exports.formats.lines import LINE_TYPES, MemberLine, ProjectLine, TaskLine, TicketLine

MAX_RATIO = 100
"""A compressed member may grow at most this many times (Space writes members stored, ratio 1)."""
MAX_LINE_BYTES = 512 * 1024
MAX_MANIFEST_BYTES = 1024 * 1024
_PIECE = 1024 * 1024


class ArchiveInvalid(Exception):
    """The upload is not a restorable archive; `detail` names the member (and line) and what is wrong."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


@dataclass
class Checked:
    """A valid archive: its manifest, its members, the project ids, and the rows of each data file."""

    manifest: ManifestV2
    members: list[MemberLine]
    project_ids: set[uuid.UUID] = field(default_factory=set)
    rows: dict[str, int] = field(default_factory=dict)


def _names(archive: zipfile.ZipFile, max_bytes: int) -> dict[str, zipfile.ZipInfo]:
    infos: dict[str, zipfile.ZipInfo] = {}
    total = 0
    for info in archive.infolist():
        name = info.filename
        parts = name.replace("\\", "/").split("/")
        if name.startswith(("/", "\\")) or "\\" in name or ".." in parts or (len(name) > 1 and name[1] == ":"):
            raise ArchiveInvalid(f"{name}: a member's name may not be absolute or hold '..' or '\\'.")
        if name in infos:
            raise ArchiveInvalid(f"{name}: the archive holds this member twice.")
        if info.flag_bits & 0x1:
            raise ArchiveInvalid(f"{name}: the member is encrypted.")
        total += info.file_size
        grows = info.compress_type != zipfile.ZIP_STORED and info.file_size > MAX_RATIO * max(info.compress_size, 1)
        if grows or info.file_size > max_bytes or total > max_bytes:
            raise ArchiveInvalid(f"{name}: the member would uncompress past the archive's bounds (a ZIP bomb?).")
        infos[name] = info
    return infos


def _manifest(archive: zipfile.ZipFile, infos: dict[str, zipfile.ZipInfo]) -> ManifestV2:
    info = infos.get(MANIFEST_MEMBER)
    if info is None:
        raise ArchiveInvalid(f"{MANIFEST_MEMBER}: the archive has no manifest.")
    if info.file_size > MAX_MANIFEST_BYTES:
        raise ArchiveInvalid(f"{MANIFEST_MEMBER}: the manifest is too large.")
    raw = archive.read(info)
    try:
        version = msgspec.json.decode(raw, type=dict[str, Any]).get("schemaVersion")
        if version != 2:
            raise ArchiveInvalid(
                f"{MANIFEST_MEMBER}: schemaVersion {version} is not supported; restore needs an archive of"
                " schemaVersion 2 (with its data/*.jsonl files)."
            )
        return msgspec.json.decode(raw, type=ManifestV2)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ArchiveInvalid(f"{MANIFEST_MEMBER}: {exc}") from None


def _lines(stream: IO[bytes], name: str) -> Iterator[tuple[int, bytes]]:
    number = 0
    while line := stream.readline(MAX_LINE_BYTES + 1):
        number += 1
        if not line.endswith(b"\n"):
            what = "is too long" if len(line) > MAX_LINE_BYTES else "does not end with a newline"
            raise ArchiveInvalid(f"{name}, line {number}: the line {what}.")
        yield number, line


def lines(archive: zipfile.ZipFile, name: str) -> Iterator[Any]:
    """The data file's lines, decoded (the archive passed `check`)."""
    decoder = msgspec.json.Decoder(LINE_TYPES[name])
    with archive.open(name) as stream:
        for _, line in _lines(stream, name):
            yield decoder.decode(line)


def check(path: str, max_bytes: int) -> Checked:
    """Validate the whole archive at `path` (see the module's docstring); runs in a thread."""
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError) as exc:
        raise ArchiveInvalid(f"The upload is not a readable ZIP archive ({exc}).") from None
    with archive:
        try:
            return _check(archive, max_bytes)
        except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError) as exc:
            raise ArchiveInvalid(f"The archive could not be read ({exc}).") from None


def _check(archive: zipfile.ZipFile, max_bytes: int) -> Checked:
    infos = _names(archive, max_bytes)
    manifest = _manifest(archive, infos)
    listed = [f.name for f in manifest.files]
    if len(set(listed)) != len(listed) or MANIFEST_MEMBER in listed:
        raise ArchiveInvalid(f"{MANIFEST_MEMBER}: the manifest lists a member twice.")
    for name in infos:
        if name != MANIFEST_MEMBER and name not in listed:
            raise ArchiveInvalid(f"{name}: the member is not in the manifest.")
    for name in [*listed, *FILES]:
        if name not in infos:
            raise ArchiveInvalid(f"{name}: the member is missing from the archive.")
    checked = Checked(manifest, [])
    entries = {f.name: f for f in manifest.files}
    for name, entry in entries.items():
        if infos[name].file_size != entry.size:
            raise ArchiveInvalid(f"{name}: {infos[name].file_size} bytes, the manifest says {entry.size}.")
    for name in [n for n in listed if n not in FILES] + list(FILES):
        entry = entries[name]
        digest = hashlib.sha256()
        with archive.open(infos[name]) as stream:
            if name in FILES:
                rows = _data_file(checked, name, stream, digest)
                if entry.rows is not msgspec.UNSET and rows != entry.rows:
                    raise ArchiveInvalid(f"{name}: {rows} lines, the manifest says {entry.rows}.")
                checked.rows[name] = rows
            else:
                while piece := stream.read(_PIECE):
                    digest.update(piece)
        if digest.hexdigest() != entry.sha256:
            raise ArchiveInvalid(f"{name}: its SHA-256 is not the manifest's.")
    return checked


def _data_file(checked: Checked, name: str, stream: IO[bytes], digest: Any) -> int:
    decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(LINE_TYPES[name])
    members = {m.membership_id for m in checked.members}
    emails: set[str] = set()
    last: Any = None
    rows = 0
    for number, raw in _lines(stream, name):
        digest.update(raw)
        rows = number
        try:
            line: Any = decoder.decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise ArchiveInvalid(f"{name}, line {number}: {exc}") from None
        where = f"{name}, line {number}"
        key = line.number if isinstance(line, TicketLine) else line.membership_id if name == MEMBERS else line.id
        if last is not None and key <= last:
            raise ArchiveInvalid(f"{where}: the lines are out of order or repeat one ({key}).")
        last = key
        if isinstance(line, MemberLine):
            email = line.email.strip().lower()
            if email in emails:
                raise ArchiveInvalid(f"{where}: the email {email} is a member twice.")
            emails.add(email)
            checked.members.append(line)
        elif isinstance(line, ProjectLine):
            checked.project_ids.add(line.id)
        elif isinstance(line, TaskLine):
            if line.project_id not in checked.project_ids:
                raise ArchiveInvalid(f"{where}: the task's project {line.project_id} is not in {PROJECTS}.")
        elif line.assignee_id is not None and line.assignee_id not in members:
            raise ArchiveInvalid(f"{where}: the ticket's assignee {line.assignee_id} is not in {MEMBERS}.")
    assert name in (MEMBERS, PROJECTS, TASKS, TICKETS)
    return rows
