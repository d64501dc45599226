"""The types of the archive's data file lines (SPEC §23): what `datafiles` writes, what restore decodes each line
into (msgspec validates it there), and the JSON Schemas served at `/schemas/<name>-v2.json`.

Each line is one object with exactly these keys (`forbid_unknown_fields`); ids are UUIDs, timestamps RFC 3339
in UTC. Texts are bounded as the API bounds them, so a line can't smuggle in what no request could write.
"""

from __future__ import annotations

import datetime as dt
import functools
import uuid
from typing import Annotated, Any, Literal

import msgspec

from space.exports.formats.datafiles import MEMBERS, PROJECTS, TASKS, TICKETS

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
_NO_NUL = "^[^\\x00]*$"
Text = Annotated[str, msgspec.Meta(max_length=100_000, pattern=_NO_NUL)]
Name = Annotated[str, msgspec.Meta(min_length=1, max_length=100_000, pattern=_NO_NUL)]


class _Line(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    """One line of a data file."""


class MemberLine(_Line):
    """A membership of the org: the user it belongs to, by id and by email (restore matches by email)."""

    membership_id: uuid.UUID
    user_id: uuid.UUID
    email: Annotated[str, msgspec.Meta(min_length=3, max_length=320, pattern="^[^@\\s]+@[^@\\s]+$")]
    name: Text
    role: Literal["owner", "admin", "member", "customer"]


class ProjectLine(_Line):
    """A project, deleted ones included (`deletedAt`)."""

    id: uuid.UUID
    name: Name
    version: Annotated[int, msgspec.Meta(ge=1, le=2**31 - 1)]
    deleted_at: dt.datetime | None
    created_at: dt.datetime
    updated_at: dt.datetime


class TaskLine(_Line):
    """A task of one of the org's projects."""

    id: uuid.UUID
    project_id: uuid.UUID
    title: Name
    status: Literal["todo", "doing", "done"]
    due_date: dt.date | None
    created_at: dt.datetime
    updated_at: dt.datetime


class TicketLine(_Line):
    """A ticket: its per-org number, texts as written, creator (a user id), assignee (a membership id)."""

    number: Annotated[int, msgspec.Meta(ge=1, le=2**63 - 1)]
    title: Name
    body: Text
    status: Literal["open", "pending", "solved", "closed"]
    priority: Literal["low", "normal", "high", "urgent"]
    creator_id: uuid.UUID
    assignee_id: uuid.UUID | None
    created_at: dt.datetime
    updated_at: dt.datetime


LINE_TYPES: dict[str, type[_Line]] = {MEMBERS: MemberLine, PROJECTS: ProjectLine, TASKS: TaskLine, TICKETS: TicketLine}
SCHEMA_NAMES = {"members": MEMBERS, "projects": PROJECTS, "tasks": TASKS, "tickets": TICKETS}
"""`/schemas/<name>-v2.json` -> the data file whose lines it describes."""


@functools.cache
def line_schema(name: str) -> bytes:
    """The JSON Schema (2020-12) of one line of the data file `name` (`SCHEMA_NAMES`' keys)."""
    kind = LINE_TYPES[SCHEMA_NAMES[name]]
    schema: dict[str, Any] = {
        "$schema": SCHEMA_DIALECT,
        "title": f"Space archive {SCHEMA_NAMES[name]} line, schemaVersion 2",
        **msgspec.json.schema(kind),
    }
    return msgspec.json.format(msgspec.json.encode(schema), indent=2) + b"\n"
