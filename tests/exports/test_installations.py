"""Two installations (two databases) on one Redis database (issue 18): each queue is named after its
installation, so neither installation's worker ever takes the other's job; and when two are given the same
queue name anyway, a worker hands the other's job back rather than dropping it (every job it registers: an
export's run, a webhook delivery, a cron entry).

Real pieces throughout: two migrated databases, two apps as the app role, two real workers (`run_worker`),
one real Redis (SPACE_TEST_SHARED_REDIS_URL, default db 5; only that database is flushed). Skipped when Redis
is unreachable.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import msgspec
import psycopg
import pytest
from litestar.testing import AsyncTestClient
from saq import Queue
from saq.job import Status

from space.app import create_app
from space.config import Settings, SettingsError, load_settings
from space.db import Database
from space.db.migrate import upgrade
from space.queue import INSTALLATION, QueueIdentity, is_guarded, make_queue, queue_identity, read_installation_id
from space.worker import build_workers, run_worker
from tests.exports.fixtures import WAIT, add_tickets, create_export, download, parse_csv, wait_for
from tests.helpers import Api, Org, UserFactory, app_database, fresh_database, redis_reachable
from tests.orgs.fixtures import request_deletion
from tests.webhooks.receiver import receiver

REDIS_URL = os.environ.get("SPACE_TEST_SHARED_REDIS_URL", "redis://127.0.0.1:6379/5")


needs_redis = pytest.mark.skipif(not redis_reachable(REDIS_URL), reason="no Redis to share between two installations")


@dataclass
class Installation:
    """One installation: its database (owner URL), the app role's engine, and an API over its own app."""

    name: str
    owner_url: str
    db: Database
    settings: Settings
    api: Api | None = None

    async def identity(self) -> QueueIdentity:
        """Its queue identity, as the API and the worker read it at start-up."""
        return await queue_identity(self.settings, self.db)

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[Api]:
        """Its app (lifespan included) and an API caller on it."""
        async with AsyncTestClient(app=create_app(self.settings)) as client:
            self.api = Api(client, UserFactory(self.db))
            try:
                yield self.api
            finally:
                self.api = None

    @contextlib.asynccontextmanager
    async def worker(self) -> AsyncIterator[None]:
        """Its real worker, in this event loop, until the block ends."""
        started = asyncio.Event()
        task = asyncio.create_task(run_worker(self.settings, started=started), name=f"worker-{self.name}")
        try:
            done, _ = await asyncio.wait(
                [task, asyncio.create_task(started.wait())], timeout=WAIT, return_when="FIRST_COMPLETED"
            )
            if task in done:
                task.result()
            assert started.is_set(), f"the worker of {self.name} did not start"
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(task, WAIT)

    async def queue(self) -> Queue:
        """Its queue as the API and the worker build it, connected (the caller disconnects)."""
        queue = make_queue(self.settings, await self.identity(), application_name="space-tests-installation")
        await queue.connect()
        return queue


async def _flush() -> None:
    import redis.asyncio as redis

    client = redis.from_url(REDIS_URL)
    try:
        await client.flushdb()
    finally:
        await client.aclose()


async def _keys() -> list[str]:
    import redis.asyncio as redis

    client = redis.from_url(REDIS_URL)
    try:
        return [k.decode() for k in await client.keys("*")]
    finally:
        await client.aclose()


@pytest.fixture(scope="module")
def second_url(owner_url: str) -> Iterator[str]:
    """A second installation's database on the same server, migrated (so with an id of its own)."""
    with fresh_database(owner_url, "space_second") as url:
        yield url


@pytest.fixture
async def two(owner_url: str, second_url: str) -> AsyncIterator[tuple[Installation, Installation]]:
    """Installations `a` (the session's test database) and `b` (the second one), both on the shared Redis."""
    await _flush()
    async with app_database(owner_url, "space-tests-a") as db_a, app_database(second_url, "space-tests-b") as db_b:
        yield (
            Installation("a", owner_url, db_a, load_settings({}, database_url=owner_url, queue_url=REDIS_URL)),
            Installation("b", second_url, db_b, load_settings({}, database_url=second_url, queue_url=REDIS_URL)),
        )
    await _flush()


async def _org_with_tickets(api: Api, db: Database, name: str) -> Org:
    org = await api.org(name)
    await add_tickets(db, org.id, org.member, [f"{name}-{i}" for i in range(3)])
    return org


async def _completed(api: Api, org: Org, export_id: str) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        r = await api.call("GET", org.path(f"/exports/{export_id}"), org.member)
        body: dict[str, Any] = r.json()
        return body if body["state"] in ("completed", "failed", "cancelled") else None

    done: dict[str, Any] = await wait_for(check, f"export {export_id} to finish", WAIT)
    return done


# --- the installation id -------------------------------------------------------------------------------------


async def test_the_installation_id_is_made_once_by_migrate_and_names_the_queue(
    owner_url: str, second_url: str, db: Database
) -> None:
    first = await read_installation_id(db)
    upgrade(owner_url)  # `space migrate` again: the id stays
    assert await read_installation_id(db) == first
    async with app_database(second_url, "space-tests-b") as db_b:
        other = await read_installation_id(db_b)
    assert other != first
    default = load_settings({}, database_url=owner_url)
    assert (await queue_identity(default, db)) == QueueIdentity(first, f"space-{first}")
    named = load_settings({"SPACE_QUEUE_NAME": "staging.eu-1"}, database_url=owner_url)
    assert (await queue_identity(named, db)) == QueueIdentity(first, "staging.eu-1")
    # The app role reads the id and can't change it (only `space migrate`, as the owner, makes it).
    async with db.engine.connect() as conn:
        driver = await conn.get_raw_connection()
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            await driver.driver_connection.execute("UPDATE installation SET id = gen_random_uuid()")  # type: ignore[union-attr]
        await conn.rollback()


@pytest.mark.parametrize("value", ["with space", "a/b", "x" * 60, "saq:job"])
def test_a_malformed_queue_name_stops_start_up_naming_the_variable(value: str) -> None:
    with pytest.raises(SettingsError, match="SPACE_QUEUE_NAME"):
        load_settings({"SPACE_QUEUE_NAME": value})


# --- two installations on one Redis --------------------------------------------------------------------------


@needs_redis
async def test_two_installations_on_one_redis_each_run_only_their_own_jobs(
    two: tuple[Installation, Installation],
) -> None:
    a, b = two
    ids = {x.name: await x.identity() for x in two}
    assert ids["a"].name != ids["b"].name
    exports: dict[str, list[tuple[Org, str, str]]] = {"a": [], "b": []}
    async with a.serving() as api_a, b.serving() as api_b, a.worker(), b.worker():
        for inst, api in ((a, api_a), (b, api_b)):
            for i in range(3):
                name = f"{inst.name}{i}"
                org = await _org_with_tickets(api, inst.db, name)
                export = await create_export(api, org, org.member, {"kind": "tickets_csv"})
                exports[inst.name].append((org, name, export["id"]))
        # Every export of each installation completes from its first queue entry, run once, by its own worker.
        queues = {x.name: await x.queue() for x in two}
        try:
            for inst, api in ((a, api_a), (b, api_b)):
                workers = (await queues[inst.name].info())["workers"]
                assert workers and {w["metadata"][INSTALLATION] for w in workers.values()} == {
                    str(ids[inst.name].installation)
                }, workers
                for org, name, export_id in exports[inst.name]:
                    done = await _completed(api, org, export_id)
                    assert done["state"] == "completed", done
                    records = parse_csv((await download(api, org, org.member, export_id)).content)
                    assert sorted(r[1] for r in records[1:]) == [f"{name}-{i}" for i in range(3)]
                    # The ledger's publish comes first; SAQ records the finished entry right after.
                    entry = await _finished_entry(queues[inst.name], export_id)
                    # One dequeue in the entry's life, by a worker of this installation, and the run completed.
                    assert entry.attempts == 1 and entry.result == "completed", entry.info(True)
                    assert entry.worker_id in workers, (entry.worker_id, workers)
                    assert entry.meta[INSTALLATION] == str(ids[inst.name].installation)
                    # The other installation's queue never held it.
                    other = "b" if inst.name == "a" else "a"
                    assert await queues[other].job(export_id) is None
        finally:
            for q in queues.values():
                await q.disconnect()
    # Redis holds nothing outside the two queues' namespaces, and each export only in its own.
    keys = await _keys()
    for name, identity in ids.items():
        for _, _, export_id in exports[name]:
            assert [k for k in keys if export_id in k] == [f"saq:job:{identity.name}:{export_id}"], keys
    # Each installation's two queues: its own and its outbound lane's.
    names = [q.name for i in ids.values() for q in (i, i.outbound())]
    assert all(any(k.startswith((f"saq:{n}:", f"saq:job:{n}:")) for n in names) for k in keys), keys


@needs_redis
async def test_a_worker_hands_back_another_installations_job_when_they_share_a_queue_name(
    two: tuple[Installation, Installation],
) -> None:
    # Misconfigured on purpose: both installations are given the same SPACE_QUEUE_NAME.
    shared = f"shared-{uuid.uuid4().hex[:8]}"
    a, b = (dataclasses.replace(x, settings=msgspec.structs.replace(x.settings, queue_name=shared)) for x in two)
    async with a.serving() as api_a, _records("saq", "space.exports") as records:
        org = await _org_with_tickets(api_a, a.db, "mine")
        export_id = (await create_export(api_a, org, org.member, {"kind": "tickets_csv"}))["id"]
        queue = await a.queue()
        try:
            # Only b's worker runs: it is handed a's job again and again, and puts it back every time.
            async with b.worker():

                def retried() -> int:
                    return sum(
                        1
                        for r in records
                        if r.name == "saq" and r.getMessage().startswith("Retrying") and export_id in r.getMessage()
                    )

                async def twice() -> bool:
                    return retried() >= 2

                await wait_for(twice, "b's worker to hand a's job back twice", WAIT)
            entry = await queue.job(export_id)
            assert entry is not None and entry.status in (Status.QUEUED, Status.ACTIVE), entry
            warnings = [r for r in records if r.name == "space.exports" and export_id in r.getMessage()]
            assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING, warnings
            assert shared in warnings[0].getMessage()
            # Not an error: SAQ's traceback for the hand-back is filtered out.
            assert not [r for r in records if r.name == "saq" and r.levelno >= logging.ERROR], records
            row = await _row(a.owner_url, export_id)
            assert (row["state"], row["attempt"]) == ("queued", 0), row

            # a's own worker then takes it: completed on the first claim; the hand-backs used no attempt.
            async with a.worker():
                done = await _completed(api_a, org, export_id)
                entry = await _finished_entry(queue, export_id)
            assert done["state"] == "completed", done
            assert (await _row(a.owner_url, export_id))["attempt"] == 1
            assert entry.attempts == 1 and entry.result == "completed", entry.info(True)
            rows = parse_csv((await download(api_a, org, org.member, export_id)).content)
            assert sorted(r[1] for r in rows[1:]) == [f"mine-{i}" for i in range(3)]
        finally:
            await queue.disconnect()


@needs_redis
async def test_a_worker_hands_back_another_installations_webhook_delivery_when_they_share_a_queue_name(
    two: tuple[Installation, Installation],
) -> None:
    # The guard wraps every job the worker registers, not only export runs: a delivery of a's is not run by b.
    shared = f"shared-{uuid.uuid4().hex[:8]}"
    a, b = (
        dataclasses.replace(
            x, settings=msgspec.structs.replace(x.settings, queue_name=shared, webhook_allow_private=True)
        )
        for x in two
    )
    with receiver() as rx:
        async with a.serving() as api_a, _records("saq", "space.webhooks") as records:
            org = await api_a.org()
            created = await api_a.call(
                "POST", org.path("/webhooks"), org.owner, json={"url": rx.url, "events": ["org.deletion_requested"]}
            )
            assert created.status_code == 201, created.text
            async with b.worker():
                await request_deletion(api_a, org)
                delivery_id = await _delivery_of(a.owner_url, created.json()["id"])
                key = f"webhook:{delivery_id}:1"

                def retried() -> int:
                    return sum(
                        1
                        for rec in records
                        if rec.name == "saq" and rec.getMessage().startswith("Retrying") and key in rec.getMessage()
                    )

                async def twice() -> bool:
                    return retried() >= 2

                await wait_for(twice, "b's worker to hand a's delivery back twice", WAIT)
            assert rx.count == 0
            assert await _delivery_row(a.owner_url, delivery_id) == ("pending", 0)
            warnings = [r for r in records if r.name == "space.webhooks" and key in r.getMessage()]
            assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING, warnings
            assert not [r for r in records if r.name == "saq" and r.levelno >= logging.ERROR], records

            # a's own worker then sends it, as its first attempt: the hand-backs used none.
            async with a.worker():
                got = await rx.next()
                assert json.loads(got.body)["data"] == {"orgId": org.id}

                async def delivered() -> tuple[str, int] | None:
                    row = await _delivery_row(a.owner_url, delivery_id)
                    return row if row[0] == "delivered" else None

                assert await wait_for(delivered, "a's delivery to be recorded", WAIT) == ("delivered", 1)


@needs_redis
async def test_installations_given_one_queue_name_keep_cron_entries_of_their_own(
    two: tuple[Installation, Installation],
) -> None:
    # Crons pass the guard too: with one key between them, one installation's entry would be put back by the
    # other's workers forever once its own stopped, and the other's cron never scheduled.
    shared = f"shared-{uuid.uuid4().hex[:8]}"
    a, b = (dataclasses.replace(x, settings=msgspec.structs.replace(x.settings, queue_name=shared)) for x in two)
    keys: list[str] = []
    for inst in (a, b):
        queue = await inst.queue()
        try:
            job = await queue.enqueue("sweep_webhooks_job", key="cron:sweep_webhooks_job", scheduled=2**31)
            assert job is not None
            keys.append(job.key)
        finally:
            await queue.disconnect()
    assert len(set(keys)) == 2 and all(k.startswith(f"cron:{shared}:") for k in keys), keys


async def test_every_job_and_cron_the_worker_registers_is_guarded(settings: Settings) -> None:
    lanes = await build_workers(settings)
    try:
        # Exports in their lane; outbound attempts (and their sweeper) in theirs, never on an export's slots.
        assert set(lanes.exports.functions) >= {
            "run_export_job",
            "reconcile_exports_job",
            "cleanup_exports_job",
            "purge_due_job",
            "run_due_schedules_job",
            "run_import_job",
            "reconcile_imports_job",
        }, lanes.exports.functions
        assert set(lanes.outbound.functions) >= {
            "deliver_webhook_job",
            "sweep_webhooks_job",
            "send_email_job",
            "sweep_emails_job",
            "deliver_export_job",
            "sweep_deliveries_job",
        }, lanes.outbound.functions
        assert not set(lanes.exports.functions) & set(lanes.outbound.functions)
        assert len(lanes.exports.cron_jobs) + len(lanes.outbound.cron_jobs) == 8
        assert lanes.outbound.queue.name == lanes.exports.queue.name + "-outbound"
        unguarded = [
            name for worker in lanes.workers for name, function in worker.functions.items() if not is_guarded(function)
        ]
        assert unguarded == []
    finally:
        # What the workers' stop would run: the export lane's shutdown, then the app role's pool closes.
        assert callable(lanes.exports.shutdown)
        await lanes.exports.shutdown(lanes.exports.context)
        await lanes.close()


async def _delivery_of(owner_url: str, endpoint_id: str) -> str:
    async with await psycopg.AsyncConnection.connect(owner_url, autocommit=True) as conn:
        cur = await conn.execute("SELECT id FROM webhook_deliveries WHERE endpoint_id = %s", (endpoint_id,))
        row = await cur.fetchone()
        assert row is not None
        return str(row[0])


async def _delivery_row(owner_url: str, delivery_id: str) -> tuple[str, int]:
    async with await psycopg.AsyncConnection.connect(owner_url, autocommit=True) as conn:
        cur = await conn.execute("SELECT state, attempts FROM webhook_deliveries WHERE id = %s", (delivery_id,))
        state, attempts = await cur.fetchone()  # type: ignore[misc]
        return str(state), int(attempts)


async def _finished_entry(queue: Queue, export_id: str) -> Any:
    """The export's queue entry once SAQ has recorded it complete."""

    async def check() -> Any:
        entry = await queue.job(export_id)
        return entry if entry is not None and entry.status == Status.COMPLETE else None

    return await wait_for(check, f"the queue entry of {export_id} to be complete", WAIT)


class _ListHandler(logging.Handler):
    def __init__(self, into: list[logging.LogRecord]) -> None:
        super().__init__(logging.DEBUG)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(record)


@contextlib.asynccontextmanager
async def _records(*names: str) -> AsyncIterator[list[logging.LogRecord]]:
    """The records of these loggers (INFO and up) while the block runs.

    A handler on each logger itself: the app's logging set-up (Litestar's) replaces the root logger's handlers,
    pytest's capture among them.
    """
    into: list[logging.LogRecord] = []
    handler = _ListHandler(into)
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(logging.INFO)
    try:
        yield into
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.removeHandler(handler)
            lg.setLevel(level)


async def _row(owner_url: str, export_id: str) -> dict[str, Any]:
    async with await psycopg.AsyncConnection.connect(owner_url, autocommit=True) as conn:
        cur = await conn.execute("SELECT state, attempt FROM export_jobs WHERE id = %s", (export_id,))
        state, attempt = await cur.fetchone()  # type: ignore[misc]
        return {"state": state, "attempt": attempt}


# --- a database of an older release ---------------------------------------------------------------------------


async def test_an_older_database_is_refused_until_migrated_and_its_old_queue_entries_are_cleared(
    owner_url: str,
) -> None:
    from saq.queue.postgres import PostgresQueue

    from space.check import ready_to_serve
    from space.db import queue_conninfo
    from space.exports.formats.registry import ExportKind
    from space.exports.queue import export_job
    from space.failures import OperatorError
    from space.queue import open_queue

    with fresh_database(owner_url, "space_old", revision="0006") as url:
        settings = load_settings({}, database_url=url)
        with pytest.raises(OperatorError, match=r"no installation id .* run `space migrate`"):
            await ready_to_serve(settings)
        # The older release's queue, under its fixed name, holds an unfinished entry of an export and a cron entry.
        export_id, org_id = uuid.uuid4(), uuid.uuid4()
        old = PostgresQueue(url=queue_conninfo(url), name="space", min_size=1, max_size=2)
        await old.connect()
        try:
            assert await old.enqueue(export_job(settings, export_id, org_id, ExportKind.snapshot)) is not None
            assert (
                await old.enqueue("reconcile_exports_job", key="cron:reconcile_exports_job", scheduled=2**31)
                is not None
            )
        finally:
            await old.disconnect()

        upgrade(url)
        await ready_to_serve(settings)
        async with app_database(url, "space-tests-old") as db:
            queue = await open_queue(settings, db, application_name="space-tests-old-queue")
            await queue.connect()
            try:
                # The export's key is free again for the new queue (the reconciler's enqueue is not refused).
                assert await queue.enqueue(export_job(settings, export_id, org_id, ExportKind.snapshot)) is not None
                entry = await queue.job(str(export_id))
                assert entry is not None and entry.queue is not None and entry.queue.name == queue.name
            finally:
                await queue.disconnect()
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            cur = await conn.execute("SELECT count(*) FROM saq.saq_jobs WHERE queue = 'space'")
            assert await cur.fetchone() == (0,)
