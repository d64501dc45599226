"""The complete archive (SPEC §13): one ZIP with manifest.json, snapshot.json, tickets.csv and the snapshot's
schema, built by the real worker from one snapshot, checked with Python's zipfile, `unzip -t` (where
installed) and the `jsonschema` library against the schemas the API serves."""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import io
import json
import shutil
import zipfile
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from space.config import Settings
from space.db import Database
from space.exports.pipeline import run_export
from tests.exports.fixtures import (
    add_project,
    add_tickets,
    chunk_count,
    completed_export,
    create_export,
    download,
    job_row,
    parse_csv,
    runner,
    tuned,
    uid,
)
from tests.helpers import Api, Org, assert_problem

DATA = ["data/members.jsonl", "data/projects.jsonl", "data/tasks.jsonl", "data/tickets.jsonl"]
MEMBERS = ["snapshot.json", "tickets.csv", *DATA, "schemas/snapshot.schema.json", "manifest.json"]
MEDIA_TYPES = {
    "snapshot.json": "application/json",
    "tickets.csv": "text/csv; charset=utf-8",
    **dict.fromkeys(DATA, "application/x-ndjson"),
    "schemas/snapshot.schema.json": "application/schema+json",
}


async def _seeded(api: Api, db: Database) -> Org:
    org = await api.org('Archive "Co", Ltd.')
    await add_project(db, org.id, "Launch", ["Plan", "=cmd()", 'say "hi"\nthen go'])
    await add_project(db, org.id, "Later", [])
    await add_project(db, org.id, "Gone", ["never exported"], deleted=True)
    await add_tickets(db, org.id, org.member, ["Printer on fire", "=HYPERLINK()", 'a "quoted"\r\nline'])
    await add_tickets(db, org.id, org.customer, ["Customer's own"], status="closed", priority="urgent")
    await add_tickets(db, org.id, org.customer2, ["Another customer's"], status="pending")
    return org


async def _archive(api: Api, org: Org) -> tuple[dict[str, Any], bytes, zipfile.ZipFile]:
    r = await api.call("GET", org.path("/exports"), org.owner)
    export = next(e for e in r.json()["items"] if e["kind"] == "archive")
    r = await download(api, org, org.owner, export["id"])
    assert r.status_code == 200, r.text
    return export, r.content, zipfile.ZipFile(io.BytesIO(r.content))


async def _served(api: Api, name: str) -> dict[str, Any]:
    r = await api.call("GET", f"/schemas/{name}")  # no token: the schemas are public
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/schema+json")
    schema: dict[str, Any] = r.json()
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    return schema


async def test_the_archive_holds_every_member_and_its_manifest_matches_them(
    api: Api, db: Database, settings: Settings, tmp_path: Path
) -> None:
    org = await _seeded(api, db)
    export_id = await completed_export(api, db, settings, org, {"kind": "archive"})
    r = await download(api, org, org.owner, export_id)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/zip"
    assert r.headers["content-disposition"] == f'attachment; filename="space-export-{export_id}.zip"'
    body = r.content
    export = (await api.call("GET", org.path(f"/exports/{export_id}"), org.owner)).json()
    # The export's own size, sha256 and ETag are the whole ZIP's (the ETag on the API's answer: with an object
    # store that redirects, the 303; the presigned GET's is the store's own).
    assert int(r.headers["content-length"]) == len(body) == export["byteSize"]
    api_answer = r.history[0] if r.history else r
    assert hashlib.sha256(body).hexdigest() == export["sha256"]
    assert api_answer.headers["etag"] == f'"{export["sha256"]}"'
    # Rows of both parts: 2 live projects + 3 tasks, and all 5 tickets (every creator's); and of the data files:
    # 5 members, 3 projects, 4 tasks, 5 tickets.
    assert export["rowCount"] == 27 and export["kind"] == "archive" and export["scope"] == "team"

    archive = zipfile.ZipFile(io.BytesIO(body))
    assert archive.testzip() is None
    assert archive.namelist() == MEMBERS
    manifest = json.loads(archive.read("manifest.json"))
    assert manifest["schemaVersion"] == 2 and manifest["organizationId"] == org.id
    assert manifest["organizationName"] == 'Archive "Co", Ltd.'
    assert dt.datetime.fromisoformat(manifest["snapshotAt"]) == dt.datetime.fromisoformat(export["snapshotAt"])
    # Every other member, once, with its real size, digest, media type and records.
    files = {f["name"]: f for f in manifest["files"]}
    assert sorted(files) == sorted(MEMBERS[:-1]) and len(manifest["files"]) == 7
    for name, entry in files.items():
        data = archive.read(name)
        assert entry["bytes"] == len(data), name
        assert entry["sha256"] == hashlib.sha256(data).hexdigest(), name
        assert entry["mediaType"] == MEDIA_TYPES[name], name
    assert files["tickets.csv"]["rows"] == 5 and files["snapshot.json"]["rows"] == 5
    assert "rows" not in files["schemas/snapshot.schema.json"]

    snapshot = json.loads(archive.read("snapshot.json"))
    assert snapshot["snapshotAt"] == manifest["snapshotAt"]
    assert sorted(p["name"] for p in snapshot["projects"]) == ["Later", "Launch"]
    assert "never exported" not in archive.read("snapshot.json").decode()
    records = parse_csv(archive.read("tickets.csv"))
    assert [rec[1] for rec in records[1:]] == [
        "Printer on fire",
        "'=HYPERLINK()",
        'a "quoted"\r\nline',
        "Customer's own",
        "Another customer's",
    ]
    # The schema member is the schema the API serves.
    assert json.loads(archive.read("schemas/snapshot.schema.json")) == await _served(api, "snapshot-v1.json")

    unzip = shutil.which("unzip")
    if unzip is not None:
        path = tmp_path / "archive.zip"
        path.write_bytes(body)
        proc = await asyncio.create_subprocess_exec(
            unzip, "-t", str(path), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, out.decode()
        assert "No errors detected" in out.decode()


async def test_the_archives_csv_is_byte_for_byte_a_tickets_csv_export(
    api: Api, db: Database, settings: Settings
) -> None:
    org = await _seeded(api, db)
    csv_id = await completed_export(api, db, settings, org, {"kind": "tickets_csv", "delimiter": ","})
    await completed_export(api, db, settings, org, {"kind": "archive"})
    csv_body = (await download(api, org, org.owner, csv_id)).content
    _, _, archive = await _archive(api, org)
    assert archive.read("tickets.csv") == csv_body


async def test_snapshots_and_manifests_validate_against_the_served_schemas(
    api: Api, db: Database, settings: Settings
) -> None:
    org = await _seeded(api, db)
    snapshot_schema = await _served(api, "snapshot-v1.json")
    manifest_schema = await _served(api, "manifest-v2.json")
    checker = jsonschema.FormatChecker()
    snap_id = await completed_export(api, db, settings, org, {"kind": "snapshot"})
    await completed_export(api, db, settings, org, {"kind": "archive"})
    _, _, archive = await _archive(api, org)
    plain = json.loads((await download(api, org, org.owner, snap_id)).content)
    inside = json.loads(archive.read("snapshot.json"))
    manifest = json.loads(archive.read("manifest.json"))
    for document in (plain, inside):
        jsonschema.validate(document, snapshot_schema, format_checker=checker)
    jsonschema.validate(manifest, manifest_schema, format_checker=checker)
    # The schemas say something: what the snapshot must never carry, or a malformed entry, fails them.
    leaked = {**plain, "projects": [{**plain["projects"][0], "ownerEmail": "a@b.example"}]}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(leaked, snapshot_schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**inside, "tasks": [{**inside["tasks"][0], "status": "lost"}]}, snapshot_schema)
    bad = {**manifest, "files": [{**manifest["files"][0], "sha256": "xyz"}]}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, manifest_schema)


async def test_an_archive_stopped_in_its_first_member_stores_nothing(
    api: Api, db: Database, settings: Settings
) -> None:
    org = await _seeded(api, db)
    export = await create_export(api, org, org.owner, {"kind": "archive"})
    # 100 bytes: the build stops inside snapshot.json, its reads closed before the transaction ends.
    tiny = tuned(settings, archive_byte_limit=100)
    assert await run_export(runner(tiny, db), uid(export["id"]), uid(org.id)) == "too_large"
    job = await job_row(db, org.id, export["id"])
    assert job.state == "failed" and job.error_code == "too_large"
    assert await chunk_count(db, org.id, export["id"]) == 0
    # The worker's connections are fine afterwards: the next archive completes.
    assert await completed_export(api, db, settings, org, {"kind": "archive"})


async def test_customers_may_not_request_an_archive(api: Api, db: Database) -> None:
    org = await api.org()
    r = await api.call("POST", org.path("/exports"), org.customer, json={"kind": "archive"})
    assert_problem(r, 403, "forbidden")
    for user in (org.member, org.admin, org.owner):
        r = await api.call("POST", org.path("/exports"), user, json={"kind": "archive"})
        assert r.status_code == 202, r.text
    # An archive takes no filters or delimiter: the CSV inside is every ticket, with `,`.
    r = await api.call("POST", org.path("/exports"), org.owner, json={"kind": "archive", "delimiter": ";"})
    assert_problem(r, 400, "invalid_request")


async def test_the_data_files_are_lossless_byte_stable_and_match_their_schemas(
    api: Api, db: Database, settings: Settings
) -> None:
    # SPEC §23: raw values (never formula-guarded), deleted projects and their tasks included, each line valid
    # against its served schema; the same rows give the same bytes, so the same sha256.
    org = await _seeded(api, db)
    await completed_export(api, db, settings, org, {"kind": "archive"})
    _, _, first = await _archive(api, org)
    checker = jsonschema.FormatChecker()
    jsonschema.validate(json.loads(first.read("manifest.json")), await _served(api, "manifest-v2.json"))
    lines: dict[str, list[dict[str, Any]]] = {}
    for name in DATA:
        schema = await _served(api, name.removeprefix("data/").replace(".jsonl", "-v2.json"))
        raw = first.read(name)
        assert raw.endswith(b"\n") and b"\r\n" not in raw.replace(b"\\r\\n", b"")
        lines[name] = [json.loads(line) for line in raw.decode().splitlines()]
        for line in lines[name]:
            jsonschema.validate(line, schema, format_checker=checker)
    titles = [t["title"] for t in lines["data/tickets.jsonl"]]
    assert titles == ["Printer on fire", "=HYPERLINK()", 'a "quoted"\r\nline', "Customer's own", "Another customer's"]
    assert [t["number"] for t in lines["data/tickets.jsonl"]] == [1, 2, 3, 4, 5]
    assert {p["name"]: p["deletedAt"] is not None for p in lines["data/projects.jsonl"]} == {
        "Launch": False,
        "Later": False,
        "Gone": True,
    }
    assert "never exported" in {t["title"] for t in lines["data/tasks.jsonl"]}
    assert sorted(m["role"] for m in lines["data/members.jsonl"]) == sorted(
        ["owner", "admin", "member", "customer", "customer"]
    )
    await completed_export(api, db, settings, org, {"kind": "archive"})
    r = await api.call("GET", org.path("/exports"), org.owner)
    newest = next(e for e in r.json()["items"] if e["kind"] == "archive")
    second = zipfile.ZipFile(io.BytesIO((await download(api, org, org.owner, newest["id"])).content))

    def digests(archive: zipfile.ZipFile) -> dict[str, str]:
        return {f["name"]: f["sha256"] for f in json.loads(archive.read("manifest.json"))["files"] if f["name"] in DATA}

    assert digests(first) == digests(second) and len(digests(first)) == 4
