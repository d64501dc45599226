"""The customer's own bucket for the tests: a second moto S3 server (real HTTP, on its own 127.0.0.1 port) that
checks credentials (moto's IAM: its first requests, which make the user, its key and the bucket, are the only
unauthenticated ones), behind a small proxy that logs every request in order and can answer 503 a set number of
times (to the object writes of a run's folder) before passing requests on."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import boto3
import pytest
from aiohttp import ClientSession, web

from tests.exports.s3_fixtures import moto_server
from tests.helpers import free_port

BUCKET = "customer-bucket"
SETUP_ACTIONS = 4
"""The unauthenticated requests moto allows: create the user, its key, its policy, and the bucket."""


@dataclass
class Store:
    """The customer's store as the tests see it: the proxy's endpoint (what destinations name), a client of the
    test's own straight to moto, the customer's credentials, and the proxy's log and fault switch."""

    endpoint: str
    client: Any
    iam: Any
    access_key_id: str
    secret_access_key: str
    log: list[tuple[str, str]] = field(default_factory=list)
    fail_next: int = 0
    """How many object writes under a run's folder still answer 503."""
    failed: int = 0
    loop: Any = None
    stop: Any = None

    def new_access_key(self) -> dict[str, str]:
        """A key of the customer's own beside the base one (IAM allows two per user: an earlier test's extra key
        is removed first)."""
        for k in self.iam.list_access_keys(UserName="customer")["AccessKeyMetadata"]:
            if k["AccessKeyId"] != self.access_key_id:
                self.iam.delete_access_key(UserName="customer", AccessKeyId=k["AccessKeyId"])
        key: dict[str, str] = self.iam.create_access_key(UserName="customer")["AccessKey"]
        return key

    def keys(self, prefix: str = "") -> list[str]:
        """Every object key under `prefix`."""
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
        return [o["Key"] for page in pages for o in page.get("Contents", [])]

    def body(self, key: str) -> bytes:
        """One object's bytes."""
        data: bytes = self.client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
        return data

    def destination(self, **overrides: Any) -> dict[str, Any]:
        """A create body for this store."""
        return {
            "type": "s3",
            "bucket": BUCKET,
            "endpointUrl": self.endpoint,
            "region": "us-east-1",
            "accessKeyId": self.access_key_id,
            "secretAccessKey": self.secret_access_key,
            **overrides,
        }


@contextlib.contextmanager
def _authenticating_moto() -> Iterator[str]:
    # moto checks credentials (IAM) once its first SETUP_ACTIONS requests, the fixture's own set-up, are done.
    with moto_server(INITIAL_NO_AUTH_ACTION_COUNT=str(SETUP_ACTIONS)) as endpoint:
        yield endpoint


def _setup(endpoint: str) -> tuple[Any, Any, str, str]:
    boot = {
        "endpoint_url": endpoint,
        "region_name": "us-east-1",
        "aws_access_key_id": "AKIASETUP",
        "aws_secret_access_key": "setup",
    }
    iam = boto3.client("iam", **boot)
    iam.create_user(UserName="customer")
    key = iam.create_access_key(UserName="customer")["AccessKey"]
    policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
    iam.put_user_policy(UserName="customer", PolicyName="all", PolicyDocument=json.dumps(policy))
    boto3.client("s3", **boot).create_bucket(Bucket=BUCKET)
    own = {
        "endpoint_url": endpoint,
        "region_name": "us-east-1",
        "aws_access_key_id": key["AccessKeyId"],
        "aws_secret_access_key": key["SecretAccessKey"],
    }
    return boto3.client("s3", **own), boto3.client("iam", **own), key["AccessKeyId"], key["SecretAccessKey"]


def _serve_proxy(
    store: Store, upstream: str, port: int, ready: threading.Event, stop: asyncio.Event | None = None
) -> None:
    """The proxy, in a thread and an event loop of its own: the tests' API client blocks the tests' loop while
    the app (in yet another thread) answers, and the app's test write goes through this proxy."""

    async def main() -> None:
        async with ClientSession(auto_decompress=False) as session:

            async def forward(request: web.Request) -> web.StreamResponse:
                store.log.append((request.method, request.path_qs))
                body = await request.read()
                run_object = request.method in {"PUT", "POST"} and "/manual/" in request.path
                if run_object and store.fail_next > 0:
                    store.fail_next -= 1
                    store.failed += 1
                    return web.Response(status=503, text="<Error><Code>SlowDown</Code></Error>")
                headers = {k: v for k, v in request.headers.items() if k.lower() != "content-length"}
                async with session.request(
                    request.method, f"{upstream}{request.path_qs}", data=body, headers=headers
                ) as answer:
                    data = await answer.read()
                    skip = {"content-length", "transfer-encoding", "content-encoding"}
                    out = {k: v for k, v in answer.headers.items() if k.lower() not in skip}
                    return web.Response(status=answer.status, body=data, headers=out)

            app = web.Application(client_max_size=1 << 30)
            app.router.add_route("*", "/{tail:.*}", forward)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            store.stop = asyncio.Event()
            store.loop = asyncio.get_running_loop()
            ready.set()
            try:
                await store.stop.wait()
            finally:
                await runner.cleanup()

    asyncio.run(main())


@pytest.fixture(scope="session")
def customer_store() -> Iterator[Store]:
    """The customer's store for the session (a second moto, beside the result store's), behind the proxy."""
    with _authenticating_moto() as upstream:
        client, iam, key_id, secret = _setup(upstream)
        port = free_port()
        store = Store(f"http://127.0.0.1:{port}", client, iam, key_id, secret)
        ready = threading.Event()
        thread = threading.Thread(target=_serve_proxy, args=(store, upstream, port, ready), daemon=True)
        thread.start()
        assert ready.wait(30), "the proxy did not start"
        try:
            yield store
        finally:
            assert store.loop is not None and store.stop is not None
            store.loop.call_soon_threadsafe(store.stop.set)
            thread.join(10)
