"""Base payload types shared by every domain: camelCase on the wire, unknown input fields rejected."""

from __future__ import annotations

from typing import Annotated, Generic, TypeVar

import msgspec

# No NUL anywhere (PostgreSQL text can't hold it) and at least one visible character; no lookahead, so that a
# schema-driven generator (the OpenAPI document carries the pattern) draws matching text instead of filtering.
_TEXT = r"^[^\x00]*[^\s\x00][^\x00]*$"
_ANY_TEXT = r"^[^\x00]*$"

Name = Annotated[str, msgspec.Meta(min_length=1, max_length=200, pattern=_TEXT)]
Title = Annotated[str, msgspec.Meta(min_length=1, max_length=500, pattern=_TEXT)]
Body = Annotated[str, msgspec.Meta(max_length=100_000, pattern=_ANY_TEXT)]
Query = Annotated[str, msgspec.Meta(max_length=200, pattern=_ANY_TEXT)]
Email = Annotated[str, msgspec.Meta(min_length=3, max_length=320, pattern=r"^[^\s@\x00]+@[^\s@\x00]+$")]


class Output(msgspec.Struct, rename="camel", kw_only=True):
    """A response payload."""


class Input(msgspec.Struct, rename="camel", kw_only=True, forbid_unknown_fields=True):
    """A request payload: unknown fields are an error, not silently dropped."""


T = TypeVar("T")


class Items(Output, Generic[T]):
    """Every list answers {"items": [...]}."""

    items: list[T]
