"""`make bench` case `workers_scaling`: what a second worker process buys (issue 18).

ORGS orgs of TICKETS tickets each, one CSV export per org asked at once, run by one `space worker` process and
then by two (SPACE_WORKER_CONCURRENCY=1 each, one `space api`). Per phase: the total time from the first
export's createdAt to the last one's completedAt (the ledger's clock), and where the CPU went: the database
backends of the run's database, the worker processes and the API, read from /proc (the server must be on this
host; otherwise the CPU figures are nan).

A backend that ends between two samples (SAMPLE_SECONDS) loses its last interval: the chunk writers' short-lived
connections are counted up to their last sample.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg

from benchmarks.run import TIMEOUT, Org, _ts, free_port, log, spawn, stop, wait_healthy

SAMPLE_SECONDS = 0.2
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of a process, in seconds (None when it is gone or not readable)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # After the command: state is field 3; utime and stime are fields 14 and 15 (1-based, see proc(5)).
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


@dataclass
class CpuMeter:
    """CPU seconds spent by the database's backends (sampled) and by given processes, over one phase."""

    url: str
    pids: list[int]
    _first: dict[int, float] | None = None
    _last: dict[int, float] | None = None
    _own_first: float = 0.0
    _own_last: float = 0.0

    def _backends(self, conn: psycopg.Connection[Any]) -> list[int]:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
        return [int(r[0]) for r in rows]

    def _own(self) -> float:
        return sum(cpu_seconds(p) or 0.0 for p in self.pids)

    async def run(self, stop_event: asyncio.Event) -> None:
        """Sample until `stop_event` is set."""
        first: dict[int, float] = {}
        last: dict[int, float] = {}
        self._own_first = self._own()
        with psycopg.connect(self.url, autocommit=True, application_name="space-bench-meter") as conn:
            started = True
            while True:
                for pid in self._backends(conn):
                    value = cpu_seconds(pid)
                    if value is None:
                        continue
                    # A backend already there when the phase began counts from then; a new one from its start.
                    first.setdefault(pid, value if started else 0.0)
                    last[pid] = value
                started = False
                if stop_event.is_set():
                    # While the processes still run: a process that has exited has no /proc entry to read.
                    self._own_last = self._own()
                    break
                await asyncio.sleep(SAMPLE_SECONDS)
        self._first, self._last = first, last

    @property
    def readable(self) -> bool:
        """Whether any backend's /proc entry could be read (the server runs on this host)."""
        return bool(self._last)

    def database_seconds(self) -> float:
        """CPU seconds of the run database's backends during the phase."""
        assert self._first is not None and self._last is not None
        return sum(self._last[p] - self._first[p] for p in self._last)

    def processes_seconds(self) -> float:
        """CPU seconds of the given processes (workers, API) during the phase."""
        return self._own_last - self._own_first


def _workers(url: str) -> set[str]:
    with psycopg.connect(url, autocommit=True) as conn:
        if conn.execute("SELECT to_regclass('saq.saq_stats')").fetchone() == (None,):
            return set()
        rows = conn.execute("SELECT worker_id FROM saq.saq_stats WHERE expire_at >= extract(epoch FROM now())")
        return {str(r[0]) for r in rows}


async def _until_workers(url: str, before: set[str], n: int) -> None:
    """Until `n` workers have joined since `before` (SAQ lists a worker once it takes jobs)."""
    deadline = time.monotonic() + 120
    while len(_workers(url) - before) < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{n} workers did not start")
        await asyncio.sleep(0.2)


async def phase(url: str, orgs: list[Org], workers: int) -> dict[str, float]:
    """One export per org, all asked at once, with `workers` worker processes of concurrency 1."""
    port = free_port()
    # The owners ask for one export each; nothing else is running.
    before = _workers(url)
    api = spawn("api", url, port)
    procs = [spawn("worker", url, port, SPACE_WORKER_CONCURRENCY="1") for _ in range(workers)]
    stop_event = asyncio.Event()
    meter = CpuMeter(url, [api.pid, *(p.pid for p in procs)])
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=TIMEOUT) as client:
            await wait_healthy(client, api)
            # Measured from when every process is up: their start-up (imports, pools) is not the exports' cost.
            await _until_workers(url, before, workers)
            sampling = asyncio.create_task(meter.run(stop_event))
            wall = time.perf_counter()
            posts = [
                client.post(
                    f"/orgs/{org.id}/exports",
                    json={"kind": "tickets_csv"},
                    headers={"Authorization": f"Bearer {org.people['owner']}"},
                )
                for org in orgs
            ]
            ids = []
            for r in await asyncio.gather(*posts):
                r.raise_for_status()
                ids.append(r.json()["id"])
            done: list[dict[str, Any]] = []
            deadline = time.monotonic() + TIMEOUT
            for org, export_id in zip(orgs, ids, strict=True):
                auth = {"Authorization": f"Bearer {org.people['owner']}"}
                while True:
                    status = (await client.get(f"/orgs/{org.id}/exports/{export_id}", headers=auth)).json()
                    if status["state"] in ("completed", "failed", "cancelled"):
                        break
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"export not finished: {status}")
                    await asyncio.sleep(0.25)
                if status["state"] != "completed":
                    raise RuntimeError(f"export {status['state']}: {status['errorCode']}")
                done.append(status)
            wall = time.perf_counter() - wall
            stop_event.set()
            await sampling
    finally:
        stop_event.set()
        for p in procs:
            stop(p)
        stop(api)
    total = max(_ts(s["completedAt"]) for s in done) - min(_ts(s["createdAt"]) for s in done)
    nan = float("nan")
    db_cpu = meter.database_seconds() if meter.readable else nan
    own_cpu = meter.processes_seconds()
    cores = os.cpu_count() or 1
    return {
        "seconds": round(total, 3),
        "each_export_seconds": round(sum(_ts(s["completedAt"]) - _ts(s["startedAt"]) for s in done) / len(done), 3),
        "db_cpu_seconds": round(db_cpu, 2),
        "space_cpu_seconds": round(own_cpu, 2),
        # The database's part of the CPU the run used, and how busy the run kept the machine's cores.
        "db_cpu_share": round(db_cpu / (db_cpu + own_cpu), 3) if db_cpu == db_cpu else nan,
        "machine_busy": round((db_cpu + own_cpu) / (wall * cores), 3) if db_cpu == db_cpu else nan,
    }


async def workers_scaling(url: str, orgs: list[Org], tickets: int) -> dict[str, Any]:
    """Both phases: one worker, then two; their figures and the time ratio."""
    log(f"workers_scaling: {len(orgs)} exports of {tickets} tickets with 1 worker ...")
    one = await phase(url, orgs, 1)
    log(f"workers_scaling: 1 worker: {one}")
    log("workers_scaling: the same with 2 workers ...")
    two = await phase(url, orgs, 2)
    log(f"workers_scaling: 2 workers: {two}")
    line: dict[str, Any] = {"case": "workers_scaling", "exports": len(orgs), "rows_each": tickets}
    for name, figures in (("one_worker", one), ("two_workers", two)):
        line.update({f"{name}_{k}": v for k, v in figures.items()})
    line["time_ratio"] = round(two["seconds"] / one["seconds"], 3)
    line["speedup"] = round(one["seconds"] / two["seconds"], 3)
    return line
