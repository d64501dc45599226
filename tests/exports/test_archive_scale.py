"""An archive of 1,000,000 tickets and 1,000,000 projects and tasks, built by a real `space worker` process,
keeps the worker's memory flat: its peak resident set (VmHWM, reset before each export) grows by little more
than a small archive's, and the ZIP it stores is whole (every CRC checked, the manifest's rows right)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import AsyncTestClient

from space.app import create_app
from space.config import load_settings
from space.demo import DemoUser
from space.exports.storage import PgResultStore, ResultKey
from tests.exports.fixtures import job_row, uid, wait_for
from tests.helpers import app_database
from tests.million import TASKS, Million

GROWTH_MIB = 40
"""How much more the 1M archive's peak may be than the small one's: buffers bounded by batch and chunk sizes."""
WAIT = 600.0


def _mib(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field} for {pid}")


def _reset_peak(pid: int) -> None:
    # Linux: VmHWM := the current resident set.
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def _owner(people: list[DemoUser]) -> dict[str, str]:
    token = next(p.token for p in people if p.role == "owner")
    return {"Authorization": f"Bearer {token}"}


async def _archive(client: AsyncTestClient, org_id: str, auth: dict[str, str]) -> dict[str, Any]:  # type: ignore[type-arg]
    r = await client.post(f"/orgs/{org_id}/exports", json={"kind": "archive"}, headers=auth)
    assert r.status_code == 202, r.text
    export_id = r.json()["id"]

    async def finished() -> dict[str, Any] | None:
        body: dict[str, Any] = (await client.get(f"/orgs/{org_id}/exports/{export_id}", headers=auth)).json()
        return body if body["state"] in ("completed", "failed", "cancelled") else None

    done: dict[str, Any] = await wait_for(finished, f"archive {export_id}", within=WAIT)
    assert done["state"] == "completed", done
    return done


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc to read peak memory")
async def test_a_million_row_archive_keeps_the_worker_memory_flat(million: Million, tmp_path: Path) -> None:
    url, small, big = million.url, million.small, million.big
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPACE_")}
    rows = million.tickets + TASKS + 20
    # The archive's rows count as a whole against the row limit: the worker runs with room for both parts.
    env.update(DATABASE_URL=url, SPACE_EXPORT_ROW_LIMIT=str(rows))
    worker = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "from space.cli import main; main()",
        "worker",
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        async with AsyncTestClient(app=create_app(load_settings({}, database_url=url))) as client:
            orgs = {o["name"]: o["id"] for o in (await client.get("/orgs", headers=_owner(big))).json()["items"]}
            small_orgs = (await client.get("/orgs", headers=_owner(small))).json()["items"]
            small_id, big_id = small_orgs[0]["id"], orgs["Big"]
            # The small archive warms the worker up (pools, imports, the chunk buffers) and is the baseline.
            await _archive(client, small_id, _owner(small))
            _reset_peak(worker.pid)
            await _archive(client, small_id, _owner(small))
            small_peak = _mib(worker.pid, "VmHWM")
            _reset_peak(worker.pid)
            done = await _archive(client, big_id, _owner(big))
            big_peak = _mib(worker.pid, "VmHWM")
        print(f"OBSERVED worker peak: small archive {small_peak:.1f} MiB, 1M archive {big_peak:.1f} MiB")
        assert done["rowCount"] == rows
        assert big_peak - small_peak < GROWTH_MIB, (small_peak, big_peak)
    finally:
        if worker.returncode is None:
            worker.terminate()
            try:
                await asyncio.wait_for(worker.wait(), 30)
            except TimeoutError:
                worker.kill()
                await worker.wait()
    # The stored ZIP is whole: copied out of the store a part at a time, every member's CRC checked.
    async with app_database(url, "space-tests-archive-read") as db:
        job = await job_row(db, big_id, done["id"])
        assert job.execution_id is not None
        key = ResultKey(uid(big_id), job.id, job.execution_id)
        path = tmp_path / "big.zip"
        with path.open("wb") as f:
            async for part in PgResultStore(db.sessionmaker).read(key):
                f.write(part)
    assert path.stat().st_size == done["byteSize"]
    with zipfile.ZipFile(path) as archive:
        assert archive.testzip() is None
        files = {f["name"]: f for f in json.loads(archive.read("manifest.json"))["files"]}
        assert files["tickets.csv"]["rows"] == million.tickets and files["snapshot.json"]["rows"] == TASKS + 20
        for name, entry in files.items():
            assert archive.getinfo(name).file_size == entry["bytes"], name
