"""Fixtures of the fault tests: a database of their own (so no other test's queue entries reach their
workers), one real API process on it, and the worker processes each test starts."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from space.db import Database
from tests.faults.procs import Owner, Procs
from tests.helpers import Api, UserFactory, app_database, fresh_database


@pytest.fixture(scope="session")
def faults_url(owner_url: str) -> Iterator[str]:
    """A second fresh database on the test server, migrated: the fault tests' workers see only their jobs."""
    with fresh_database(owner_url, "space_faults") as url:
        yield url


@pytest.fixture(scope="session")
async def faults_db(faults_url: str) -> AsyncIterator[Database]:
    """The app role on the faults database (seeding, and calling the cleanup job)."""
    async with app_database(faults_url, "space-faults-tests") as database:
        yield database


@pytest.fixture(scope="session")
def owner(faults_url: str) -> Owner:
    """The faults database as its owner sees it."""
    return Owner(faults_url)


@pytest.fixture(scope="session")
async def api_base(faults_url: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    """One real `space api` process on the faults database, with the same settings as the workers."""
    procs = Procs(faults_url, tmp_path_factory.mktemp("faults-api"))
    _, base = await procs.api()
    try:
        yield base
    finally:
        await procs.close()


@pytest.fixture
async def fapi(api_base: str, faults_db: Database) -> AsyncIterator[Api]:
    """The `api` helper, over real HTTP to the API process."""
    async with httpx.AsyncClient(base_url=api_base, timeout=30) as client:
        yield Api(client, UserFactory(faults_db))  # type: ignore[arg-type]


@pytest.fixture
async def procs(faults_url: str, tmp_path: Path, owner: Owner, api_base: str) -> AsyncIterator[Procs]:
    """Worker processes of one test; every one still running is killed at the end.

    Before the test, leftovers of earlier tests (unfinished exports, their queue entries) are cancelled so
    that this test's workers only ever see this test's exports. That includes the cron entries an earlier
    test's workers left queued: one already due (say the reconciler's, every lease) would be dequeued ahead
    of this test's export (SAQ takes the oldest `scheduled` first) and, while a `MidRead` pause holds the
    org lock, wait on it in a worker slot (the reconciler wakes the org under that lock) for up to the cron
    job's 60 s timeout, which leaves a one-slot worker nothing to claim the export with. Each worker queues
    its own cron entries at start, due at their next tick, after any export queued before it started.
    """
    await owner.fetch(
        "UPDATE export_jobs SET state = 'cancelled', error_code = 'cancelled', lease_expires_at = NULL"
        " WHERE state IN ('queued', 'running')"
    )
    await owner.fetch("DELETE FROM saq.saq_jobs WHERE status NOT IN ('complete', 'failed', 'aborted')")
    running = Procs(faults_url, tmp_path)
    try:
        yield running
    finally:
        await running.close()
