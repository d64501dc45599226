"""The registry of export kinds agrees with itself and with the database: every kind has one row, its request is
tagged with its name, and `export_jobs.kind`'s CHECK admits exactly the registry's names (a new kind's migration)."""

from __future__ import annotations

import re
from typing import Any

import msgspec
import psycopg

from space.exports.formats.registry import KINDS, ExportKind, kind_of


def test_every_kind_has_one_row_whose_request_carries_its_name() -> None:
    assert list(KINDS) == list(ExportKind)
    for name, kind in KINDS.items():
        request = msgspec.json.decode(b'{"kind": "%s"}' % name.encode(), type=kind.request)
        assert kind_of(request) is name
    assert len({kind.request for kind in KINDS.values()}) == len(KINDS)


def test_the_kind_column_admits_exactly_the_registered_kinds(owner: psycopg.Connection[Any]) -> None:
    check = owner.execute(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'export_jobs_kind_check'"
    ).fetchone()
    assert check is not None
    assert set(re.findall(r"'(\w+)'", check[0])) == {kind.value for kind in ExportKind}
