"""Inputs that once answered 500 (issue 29, SPEC §25): a forwarded address that does not parse, a NUL or other invalid
byte in a path. Each is answered 4xx (or, for the forwarded address, as if the header were absent), never 5xx."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import uuid
from collections.abc import AsyncIterator

import httpx
import pytest
import uvicorn

from space.audit.service import client_ip
from space.cli import server_config
from space.config import Settings
from tests.exports.fixtures import tuned, wait_for
from tests.helpers import Api, Org, assert_problem


@contextlib.asynccontextmanager
async def served(settings: Settings) -> AsyncIterator[str]:
    """The real app behind uvicorn on a local port, so the peer is a real address (127.0.0.1); its base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(server_config(settings, log_level="warning"))
    task = asyncio.create_task(server.serve(sockets=[sock]))

    async def started() -> bool:
        if task.done():
            task.result()  # a start-up failure: raise it here
        return server.started

    try:
        await wait_for(started, "the API to listen")
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 15)
        sock.close()


async def _audit_ip(api: Api, org: Org) -> str | None:
    r = await api.call("GET", org.path("/audit"), org.owner, params={"limit": 1})
    assert r.status_code == 200, r.text
    top = r.json()["items"][0]
    assert top["action"] == "org.suspended", top
    ip: str | None = top["ip"]
    return ip


# --- a forwarded address that does not parse ------------------------------------------------------------------

UNPARSABLE_FORWARDED = [
    "fe80::1%eth0",  # an IPv6 zone: Python parses it, PostgreSQL's inet does not
    "fe80::1%25eth0",
    "::ffff:10.0.0.1%eth0",
    "[2001:db8::1]:443",
    "198.51.100.7:8080",
    "garbage",
    "unknown",
    "\u00e9\u00e9".encode(),  # not ASCII: bytes as a client may send them
    "1.2.3.4.5",
    "203.0.113.9, fe80::1%eth0",  # the nearest hop is the unparsable one
]


@pytest.mark.parametrize("forwarded", UNPARSABLE_FORWARDED)
async def test_an_unparsable_forwarded_address_from_a_trusted_proxy_is_ignored(
    api: Api, settings: Settings, forwarded: str | bytes
) -> None:
    """The request succeeds and is audited from the peer (the proxy), as if the header said nothing."""
    org = await api.org()
    trusting = tuned(settings, trusted_proxies="127.0.0.1")
    async with served(trusting) as base, httpx.AsyncClient(base_url=base) as http:
        r = await http.post(org.path("/suspend"), headers={**org.owner.headers, "X-Forwarded-For": forwarded})
        assert r.status_code == 200, r.text
    assert await _audit_ip(api, org) == "127.0.0.1"


def test_client_ip_never_returns_a_zone() -> None:
    nets = [ipaddress.ip_network("10.0.0.0/8")]
    assert client_ip("10.1.2.3", ["fe80::1%eth0"], nets) == "10.1.2.3"
    assert client_ip("10.1.2.3", ["192.0.2.1, fe80::1%eth0"], nets) == "10.1.2.3"
    # A peer on a link-local address is a real address: its zone (which link) is not part of it.
    assert client_ip("fe80::7%eth0", [], nets) == "fe80::7"


# --- a NUL or other invalid byte in a path --------------------------------------------------------------------

BAD_SEGMENTS = ["%00", "a%00b.js", "%00.css", "%ff", "%c0%80", "%01", "%7f", "%0d%0a", "%e2%80%ae"]


def _paths(org_id: str) -> list[str]:
    export_id, project_id = uuid.uuid4(), uuid.uuid4()
    paths = []
    for bad in BAD_SEGMENTS:
        paths += [
            f"/static/{bad}",
            f"/static/js/{bad}",
            f"/{bad}",
            f"/schemas/{bad}",
            f"/health{bad}",
            f"/orgs/{bad}",
            f"/orgs/{org_id}/{bad}",
            f"/orgs/{org_id}/projects/{bad}",
            f"/orgs/{org_id}/projects/{project_id}/{bad}",
            f"/orgs/{org_id}/exports/{bad}",
            f"/orgs/{org_id}/exports/{bad}/result",
            f"/orgs/{org_id}/exports/{export_id}/result{bad}",
            f"/orgs/{org_id}/tickets/{bad}",
            f"/orgs/{org_id}/webhooks/{bad}",
            f"/orgs/{org_id}/members/{bad}",
        ]
    return paths


async def test_invalid_bytes_in_any_path_are_404_or_400(api: Api) -> None:
    """In process (the ASGI scope's decoded path), with and without a token."""
    org = await api.org()
    for path in _paths(org.id):
        for user in (None, org.owner):
            for method in ("GET", "HEAD", "DELETE"):
                r = await api.call(method, path, user)
                assert r.status_code in (400, 401, 404, 405), (method, path, user is not None, r.status_code, r.text)
                if method != "HEAD":
                    assert r.headers["content-type"].startswith("application/problem+json"), (path, r.text)


async def test_static_nul_is_404_over_a_real_socket(api: Api, settings: Settings) -> None:
    """Through uvicorn, as the issue's reproduction: `GET /static/%00` without a token."""
    org = await api.org()
    async with served(settings) as base, httpx.AsyncClient(base_url=base) as http:
        assert_problem(await http.get("/static/%00"), 404, "not_found")
        assert_problem(await http.get("/static/%00", headers=org.owner.headers), 404, "not_found")
        for path in _paths(org.id)[:15]:
            r = await http.get(path, headers=org.owner.headers)
            assert r.status_code in (400, 404), (path, r.status_code, r.text)
        # The page itself is still served.
        assert (await http.get("/")).status_code == 200
