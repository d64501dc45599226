"""The incremental case (SPEC §21, §24): a schedule's complete first run over an org of `--tickets` tickets
(the full export), then `--changed` of them updated, then its incremental run, both through the real pipeline
(`run_export`, in this process) on a fresh database. The incremental run is made `--rounds` times (each after
`--changed` more changes); the case is their median. Prints `case=incremental_<size> ...` with both times and
their ratio (target under 0.05), and writes results/incremental.json.

    python -m benchmarks.incremental --tickets 1000000 --changed 1000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid

import psycopg

from benchmarks.run import RESULTS, _fmt, fresh_database, log, seed, server
from space.config import load_settings
from space.db import Database, app_url
from space.exports.pipeline import ExportRunner, run_export
from space.exports.storage.factory import open_result_store
from space.schedules.jobs import make_run


async def measure(tickets: int, changed: int, rounds: int = 3) -> dict[str, object]:
    """Both runs' seconds and rows, and their ratio."""
    with server() as admin, fresh_database(admin) as url:
        log(f"seeding {tickets} tickets ...")
        org = (await seed(url, {"BenchInc": (tickets, 0)}))["BenchInc"]
        org_id = uuid.UUID(org.id)
        settings = load_settings({}, database_url=url)
        schedule_id = uuid.uuid4()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO schedules (id, org_id, kind, every, incremental, created_by, next_run_at)"
                " SELECT %s, %s, 'tickets_csv', 'hour', true, user_id, now() - interval '1 hour'"
                " FROM memberships WHERE org_id = %s AND role = 'owner'",
                (schedule_id, org_id, org_id),
            )
        db = Database(app_url(url), application_name="space-bench-incremental")
        try:
            async with open_result_store(settings, db) as store:
                runner = ExportRunner(settings, db, store)
                seconds: list[float] = []
                rows: list[int] = []
                for step in range(1 + rounds):
                    if step >= 1:
                        with psycopg.connect(url, autocommit=True) as conn:
                            every = max(1, tickets // changed)
                            conn.execute(
                                "UPDATE tickets SET priority = %s, updated_at = now()"
                                " WHERE org_id = %s AND number %% %s = 0 AND number <= %s",
                                ("urgent" if step % 2 else "low", org_id, every, every * changed),
                            )
                            conn.execute("UPDATE schedules SET next_run_at = now() - interval '1 hour' WHERE id = %s",
                                         (schedule_id,))  # fmt: skip
                            conn.execute("VACUUM ANALYZE tickets")
                    export_id = await make_run(settings, db, None, org_id, schedule_id)
                    assert export_id is not None
                    started = time.perf_counter()
                    outcome = await run_export(runner, export_id, org_id)
                    seconds.append(time.perf_counter() - started)
                    assert outcome == "completed", outcome
                    with psycopg.connect(url) as conn:
                        row = conn.execute("SELECT row_count FROM export_jobs WHERE id = %s", (export_id,)).fetchone()
                    assert row is not None
                    rows.append(int(row[0]))
                    log(f"run {step + 1}: {rows[-1]} rows in {seconds[-1]:.3f} s")
            incremental = statistics.median(seconds[1:])
        finally:
            await db.dispose()
    size = f"{tickets // 1_000_000}m" if tickets >= 1_000_000 else f"{tickets // 1000}k"
    return {
        "case": f"incremental_{size}",
        "rows": tickets,
        "changed_rows": rows[1],
        "full_seconds": round(seconds[0], 3),
        "incremental_seconds": round(incremental, 3),
        "incremental_rounds": [round(s, 3) for s in seconds[1:]],
        "ratio": round(incremental / seconds[0], 4),
    }


def main(argv: list[str] | None = None) -> None:
    """Run the case and print its line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--tickets", type=int, default=1_000_000)
    parser.add_argument("--changed", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3, help="incremental runs; the case is their median (3)")
    args = parser.parse_args(argv)
    result = asyncio.run(measure(args.tickets, args.changed, args.rounds))
    print(" ".join(f"{k}={_fmt(v)}" for k, v in result.items()))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "incremental.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
