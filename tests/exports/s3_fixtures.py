"""A real S3-protocol server for the tests: moto's standalone server, started on a free local port for the session.

The product's client talks HTTP to it exactly as to S3 (endpoint and credentials from the standard `AWS_*`
variables, which the session sets); nothing is patched in-process. The test's own checks use a separate plain
botocore client, so what they see is what the bucket holds, not what the product's client believes.
"""

from __future__ import annotations

import contextlib
import os
import queue
import subprocess
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any
from unittest import mock

import boto3
import httpx
import msgspec
import pytest
from httpx import Response

from space.config import Settings
from space.db import Database
from space.exports.storage.postgres import PgResultStore
from space.exports.storage.protocol import ResultStore
from space.exports.storage.s3 import S3Location, S3ResultStore
from tests.helpers import Api, Org, TestUser, free_port

BUCKET = "space-test"
START_TIMEOUT = 30.0
"""Seconds moto's server may take to listen."""
MOTO_ENV = {
    # Objects and parts in memory: by default moto spills every value over 5 MiB (every part) to a temporary file
    # and reads it back to complete an upload, a disk that S3 does not put in the upload's way.
    "MOTO_S3_DEFAULT_KEY_BUFFER_SIZE": str(1 << 30),
    # moto copies a whole object several times to complete an upload. glibc's malloc would map each copy fresh and
    # unmap it after, and on this kind of VM a page touched for the first time is the slowest thing there is (the
    # complete of 263 MB: 0.75-0.85 s, or 1.8-2.5 s once moto held more): one arena that keeps what it frees
    # makes each complete reuse pages already there (0.25-0.3 s). Costs of the stand-in, not of S3 or of Space.
    "MALLOC_ARENA_MAX": "1",
    "MALLOC_MMAP_MAX_": "0",
    "MALLOC_TRIM_THRESHOLD_": str(1 << 40),
}
"""moto's process environment on top of the tests' (its settings, and its allocator's)."""
AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1"}

_STORES: dict[str, S3ResultStore] = {}
"""One store per SPACE_RESULT_STORE value, shared by the tests' runners (one client, closed at the session's end)."""


@dataclass
class S3Server:
    """The running server, and a plain (synchronous) client of the test's own to look into the bucket."""

    endpoint: str
    client: Any

    def keys(self, prefix: str = "") -> list[str]:
        """Every object key under `prefix`."""
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
        return [o["Key"] for page in pages for o in page.get("Contents", [])]

    def uploads(self, prefix: str = "") -> list[dict[str, Any]]:
        """Unfinished multipart uploads under `prefix`."""
        got: list[dict[str, Any]] = self.client.list_multipart_uploads(Bucket=BUCKET, Prefix=prefix).get("Uploads", [])
        return got


def _wait_listening(proc: subprocess.Popen[str]) -> None:
    """Wait (with a timeout) until moto's server says it runs; it prints that line once it listens."""
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    while True:
        try:
            line = lines.get(timeout=START_TIMEOUT)
        except queue.Empty:
            raise RuntimeError("moto's server did not start") from None
        if line is None:
            raise RuntimeError("moto's server exited before listening")
        if "Running on" in line:
            return


@contextlib.contextmanager
def moto_server(**env: str) -> Iterator[str]:
    """moto's standalone server on a free port (with `env` beside MOTO_ENV), until the block ends; yields its
    endpoint."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **MOTO_ENV, **env},
    )
    try:
        _wait_listening(proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def aws_environment(**values: str) -> contextlib.AbstractContextManager[Any]:
    """The standard AWS variables set to `values` until the block ends, then the environment as it was."""
    return mock.patch.dict(os.environ, values)


@pytest.fixture(scope="session")
async def s3_server() -> AsyncIterator[S3Server]:
    """moto's S3 server for the whole session, the bucket created, the standard AWS variables pointing at it (the
    product and the worker processes the tests start read them as they would in production)."""
    with moto_server() as endpoint, aws_environment(**AWS_ENV, AWS_ENDPOINT_URL=endpoint):
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        yield S3Server(endpoint, client)
        # The runners' stores (their client connections), closed while the loop still runs.
        for store in _STORES.values():
            with contextlib.suppress(Exception):
                await store.aclose()
        _STORES.clear()


def s3_settings(settings: Settings, **overrides: Any) -> Settings:
    """`settings` with results in the test bucket, under a prefix of their own."""
    return msgspec.structs.replace(settings, result_store=f"s3://{BUCKET}/t-{uuid.uuid4().hex[:12]}", **overrides)


def store_for(settings: Settings, db: Database) -> ResultStore:
    """The store `settings` name: the database's chunks, or the session's S3 store for that bucket and prefix."""
    if not settings.result_store.startswith("s3://"):
        return PgResultStore(db)
    store = _STORES.get(settings.result_store)
    if store is None:
        store = _STORES[settings.result_store] = S3ResultStore(
            db, S3Location.parse(settings.result_store), redirect=settings.result_redirect
        )
    return store


async def follow(r: Response) -> Response:
    """The answer to a download: a 303 is followed to the object store over real HTTP, as a browser would
    (without the API's Authorization header: the presigned URL is the authorization). The 303 is then the
    answer's `history`, as httpx keeps the redirects it follows."""
    if r.status_code != 303:
        return r
    async with httpx.AsyncClient() as client:
        followed = await client.get(r.headers["location"])
    followed.history = [r]
    return followed


async def download_via(api: Api, org: Org, user: TestUser, export_id: str, **kw: Any) -> Response:
    """GET the result through the API, and through the redirect when there is one."""
    return await follow(
        await api.call("GET", org.path(f"/exports/{export_id}/result"), user, follow_redirects=False, **kw)
    )
