"""The `space` command as a user runs it: a real subprocess against the test database."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from asyncio.subprocess import PIPE
from pathlib import Path

import httpx
import pytest

from tests.helpers import Api, free_port

SPACE = str(Path(sys.executable).with_name("space"))


def _env(owner_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPACE_")}
    return {**env, "DATABASE_URL": owner_url, **extra}


def test_users_add_prints_a_working_token(owner_url: str) -> None:
    email = f"cli-{os.getpid()}-{time.monotonic_ns()}@example.test"
    out = subprocess.run(
        [SPACE, "users", "add", email, "--name", "Cli User"], env=_env(owner_url), capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    token = out.stdout.strip().splitlines()[-1]
    assert token.startswith("spc_") and len(token) >= 43
    port = free_port()
    # The token works against a real API process, and `tokens revoke` ends it.
    with _running(owner_url, port, "api"):
        r = httpx.get(f"http://127.0.0.1:{port}/me", headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200 and r.json()["email"] == email
        rev = subprocess.run([SPACE, "tokens", "revoke", email], env=_env(owner_url), capture_output=True, text=True)
        assert rev.returncode == 0 and "revoked 1" in rev.stdout, rev
        r = httpx.get(f"http://127.0.0.1:{port}/me", headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 401 and r.json()["code"] == "unauthenticated"


def test_users_add_twice_is_a_clear_error(owner_url: str) -> None:
    email = f"dup-{time.monotonic_ns()}@example.test"
    first = subprocess.run([SPACE, "users", "add", email, "--name", "A"], env=_env(owner_url), capture_output=True)
    assert first.returncode == 0
    again = subprocess.run(
        [SPACE, "users", "add", email, "--name", "A"], env=_env(owner_url), capture_output=True, text=True
    )
    assert again.returncode != 0 and "already exists" in again.stderr and "Traceback" not in again.stderr


def test_invalid_setting_stops_startup_naming_the_variable(owner_url: str) -> None:
    out = subprocess.run(
        [SPACE, "migrate"], env=_env(owner_url, SPACE_EXPORT_ROW_LIMIT="lots"), capture_output=True, text=True
    )
    assert out.returncode != 0 and "SPACE_EXPORT_ROW_LIMIT" in out.stderr
    out = subprocess.run([SPACE, "migrate"], env=_env(owner_url, SPACE_PROT="1"), capture_output=True, text=True)
    assert out.returncode != 0 and "SPACE_PROT" in out.stderr


def test_space_up_answers_health_and_stops(owner_url: str) -> None:
    port = free_port()
    with _running(owner_url, port, "up") as proc:
        r = httpx.get(f"http://127.0.0.1:{port}/health")
        assert r.status_code == 200 and r.json() == {"status": "ok", "database": "ok"}
    assert proc.returncode == 0, proc.stdout.read().decode() if proc.stdout else ""


async def _demo(owner_url: str) -> dict[tuple[str, str], str]:
    """Run `space demo` as a user does; its lines `  <org> <what> ... <value>` by (org, what)."""
    proc = await asyncio.create_subprocess_exec(
        SPACE, "demo", "--tickets", "50", "--tasks", "10", env=_env(owner_url), stdout=PIPE, stderr=PIPE
    )
    stdout, stderr = await proc.communicate()
    assert proc.returncode == 0, stderr.decode()
    rows = [line.split() for line in stdout.decode().splitlines() if line.startswith("  ")]
    return {(r[0], r[1]): r[-1] for r in rows}


async def test_demo_makes_two_orgs_with_every_role_once_however_often_it_runs(owner_url: str, api: Api) -> None:
    first = await _demo(owner_url)
    assert {("North", "owner"), ("South", "customer2"), ("North", "org"), ("South", "org")} <= set(first)
    north = {"Authorization": f"Bearer {first['North', 'owner']}"}
    r = await api.client.get("/orgs", headers=north)
    assert [(o["id"], o["name"]) for o in r.json()["items"]] == [(first["North", "org"], "North")]
    me = (await api.client.get("/me", headers=north)).json()

    again = await _demo(owner_url)
    # The same orgs and people: the ids printed again, and new tokens of the same users.
    assert again.keys() == first.keys()
    assert (again["North", "org"], again["South", "org"]) == (first["North", "org"], first["South", "org"])
    north = {"Authorization": f"Bearer {again['North', 'owner']}"}
    assert again["North", "owner"] != first["North", "owner"]
    assert (await api.client.get("/me", headers=north)).json() == me
    r = await api.client.get("/orgs", headers=north)
    assert [o["name"] for o in r.json()["items"]] == ["North"]
    members = (await api.client.get(f"/orgs/{again['North', 'org']}/members", headers=north)).json()["items"]
    assert sorted(m["role"] for m in members) == ["admin", "customer", "customer", "member", "owner"]
    tickets = await api.client.get(f"/orgs/{again['North', 'org']}/tickets?pageSize=1", headers=north)
    assert tickets.json()["total"] == 50, "the second run added no rows"


class _running:
    """Start `space <cmd>` on a port, wait until /health answers (bounded), stop it with SIGTERM on exit."""

    def __init__(self, owner_url: str, port: int, cmd: str) -> None:
        self.args = [SPACE, cmd]
        self.env = _env(owner_url, SPACE_PORT=str(port))
        self.url = f"http://127.0.0.1:{port}/health"

    def __enter__(self) -> subprocess.Popen[bytes]:
        # Its log goes to a file, not a pipe nobody reads: a full pipe would block the process (a shutdown that logs
        # then never ends). Jobs other tests left on the session's queue make it log a good deal.
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(self.args, env=self.env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                pytest.fail(f"space exited early: {self.log.read().decode(errors='replace')}")
            try:
                httpx.get(self.url, timeout=1)
                return self.proc
            except httpx.TransportError:
                time.sleep(0.1)  # polling a real state (the port accepting), bounded by the deadline
        self.proc.kill()
        pytest.fail("space did not answer /health within 30 s")

    def __exit__(self, *exc: object) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        finally:
            self.log.close()


def test_the_api_listener_hands_out_connections_without_nagle() -> None:
    """Every connection the API accepts has TCP_NODELAY: with Nagle, the body after the headers waited for the
    client's delayed ACK, about 40 ms per request on a kept-alive connection (asyncio sets the option itself
    only on sockets whose proto is IPPROTO_TCP, and `socket.create_server` makes proto 0)."""
    from space.cli import _listen
    from space.config import load_settings

    with (
        _listen(load_settings({}, host="127.0.0.1", port=0)) as listener,
        socket.create_connection(listener.getsockname()[:2]),
    ):
        accepted, _ = listener.accept()
        with accepted:
            assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
