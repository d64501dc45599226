"""Expected failures of the `space` command, as an operator meets them: one line on stderr, a non-zero exit.

Every test runs the real console script as a subprocess against real servers (or none listening).
"""

from __future__ import annotations

import importlib.metadata
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
from sqlalchemy import make_url

from tests.helpers import free_port, fresh_database

SPACE = str(Path(sys.executable).with_name("space"))


def _env(**extra: str) -> dict[str, str]:
    # Nothing of the caller's Space settings leaks in; PYTHONUNBUFFERED so a line is readable once printed.
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPACE_") and k != "DATABASE_URL"}
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


def _run(args: list[str], env: dict[str, str], timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SPACE, *args], env=env, capture_output=True, text=True, timeout=timeout)


def _one_line(out: subprocess.CompletedProcess[str], *needles: str) -> str:
    """The failure is exactly one non-empty stderr line holding every needle (case-insensitive), no traceback."""
    assert out.returncode != 0, (out.stdout, out.stderr)
    assert "Traceback" not in out.stderr, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, out.stderr
    for needle in needles:
        assert needle.lower() in lines[0].lower(), (needle, lines[0])
    return lines[0]


def _url(owner_url: str, **parts: str | int | None) -> str:
    return make_url(owner_url).set(**parts).render_as_string(hide_password=False)  # type: ignore[arg-type]


@pytest.fixture
def empty_db(owner_url: str) -> Iterator[str]:
    """A database that exists on the test server but was never migrated; dropped at the end."""
    with fresh_database(owner_url, "space_empty", migrate=False) as url:
        yield url


def _tcp_owner_url(owner_url: str) -> str:
    """The test server as TCP 127.0.0.1 (skips when it is only reachable over a Unix socket)."""
    u = make_url(owner_url)
    if not u.host:
        pytest.skip("the test server listens on a Unix socket only")
    return owner_url


def test_unreachable_database_is_one_line_for_every_command(owner_url: str) -> None:
    port = free_port()  # bound and released: nothing listens there
    env = _env(DATABASE_URL=f"postgresql://postgres@127.0.0.1:{port}/space", SPACE_PORT=str(free_port()))
    for args in (
        ["migrate"],
        ["users", "add", "a@example.test", "--name", "A"],
        ["api"],
        ["worker"],
        ["up"],
    ):
        line = _one_line(_run(args, env), f"127.0.0.1:{port}", "connection refused", "DATABASE_URL")
        assert "sqlalche.me" not in line, line


def test_credentials_refused_names_the_role_and_the_setting(owner_url: str) -> None:
    url = _tcp_owner_url(owner_url)
    nobody = f"space_nobody_{uuid.uuid4().hex[:8]}"
    out = _run(["migrate"], _env(DATABASE_URL=_url(url, username=nobody)))
    _one_line(out, nobody, "does not exist", "DATABASE_URL")
    # The app role's own URL is named when it is the one refused (the owner is fine, the schema is there).
    out = _run(
        ["api"],
        _env(DATABASE_URL=url, SPACE_APP_DATABASE_URL=_url(url, username=nobody), SPACE_PORT=str(free_port())),
    )
    _one_line(out, nobody, "SPACE_APP_DATABASE_URL")


def test_missing_database_says_so(owner_url: str) -> None:
    name = f"space_missing_{uuid.uuid4().hex[:8]}"
    out = _run(["migrate"], _env(DATABASE_URL=_url(owner_url, database=name)))
    _one_line(out, f"database {name} does not exist", "DATABASE_URL")


def test_serving_an_unmigrated_database_says_run_space_migrate(empty_db: str) -> None:
    env = _env(DATABASE_URL=empty_db, SPACE_PORT=str(free_port()))
    for args in (["api"], ["worker"]):
        _one_line(_run(args, env), "not migrated", "run `space migrate`")
    # Nothing was created on the way: the database is as empty as before.
    with psycopg.connect(empty_db) as conn:
        row = conn.execute("SELECT count(*) FROM pg_class WHERE relnamespace = 'public'::regnamespace").fetchone()
        assert row == (0,)


def test_port_in_use_fails_before_any_banner(owner_url: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = _env(DATABASE_URL=owner_url, SPACE_PORT=str(port))
        for cmd in ("up", "api"):
            out = _run([cmd], env)
            _one_line(out, f"127.0.0.1:{port}", "in use", "SPACE_PORT")
            assert "Space is running" not in out.stdout and "curl" not in out.stdout, out.stdout


def test_data_folder_not_writable(tmp_path: Path) -> None:
    # Tests run as root, for whom permission bits mean nothing: a regular file where a folder must be is a
    # folder no one can create.
    (tmp_path / "file").write_text("not a folder")
    data = tmp_path / "file" / "data"
    for args in (["migrate"], ["up"]):
        _one_line(
            _run(args, _env(SPACE_DATA_DIR=str(data), SPACE_PORT=str(free_port()))),
            str(data),
            "not writable",
            "SPACE_DATA_DIR",
        )


def test_rejected_setting_is_one_line(owner_url: str) -> None:
    out = _run(["migrate"], _env(DATABASE_URL=owner_url, SPACE_EXPORT_ROW_LIMIT="lots"))
    _one_line(out, "SPACE_EXPORT_ROW_LIMIT", "lots")
    out = _run(["check"], _env(DATABASE_URL=owner_url, SPACE_PROT="1"))
    _one_line(out, "unknown setting SPACE_PROT")


def test_debug_shows_the_traceback() -> None:
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/space"
    for args, extra in ((["--debug", "migrate"], {}), (["migrate"], {"SPACE_DEBUG": "1"})):
        out = _run(args, _env(DATABASE_URL=url, **extra))
        assert out.returncode != 0 and "Traceback" in out.stderr and "OperationalError" in out.stderr, out.stderr


def test_unexpected_errors_keep_their_traceback() -> None:
    # A command that fails in a way no operator could fix: the real CLI entry point, with one extra command.
    code = (
        "import sys\n"
        "from space import cli\n"
        "@cli.main.command('boom')\n"
        "def boom():\n"
        "    raise ValueError('a bug, not a setting')\n"
        "sys.argv = ['space', 'boom']\n"
        "cli.main()\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "Traceback" in out.stderr and "ValueError: a bug, not a setting" in out.stderr, out.stderr


def test_version() -> None:
    out = _run(["--version"], _env())
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"space {importlib.metadata.version('space')}"), out.stdout


def _read_until(proc: subprocess.Popen[str], needle: str, timeout: float) -> list[str]:
    """Lines of the child's stdout up to the one holding `needle`; fails if it exits or the deadline passes."""
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if not sel.select(timeout=deadline - time.monotonic()):
                break
            line = proc.stdout.readline()
            if line == "":
                pytest.fail(f"space exited before printing {needle!r}: {''.join(lines)}")
            lines.append(line)
            if needle in line:
                return lines
    pytest.fail(f"no {needle!r} within {timeout} s: {''.join(lines)}")


def test_up_banner_means_the_api_answers(owner_url: str) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [SPACE, "up"],
        env=_env(DATABASE_URL=owner_url, SPACE_PORT=str(port)),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        banner = _read_until(proc, "Space is running", timeout=60)
        assert f"http://127.0.0.1:{port}" in banner[-1]
        # Once, at once: the banner is a promise that the port accepts and the app answers.
        r = httpx.get(f"http://127.0.0.1:{port}/health", timeout=10)
        assert r.status_code == 200 and r.json()["status"] == "ok"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert proc.returncode == 0


def test_up_failing_after_the_embedded_start_stops_it(tmp_path: Path) -> None:
    # The queue is unreachable: `space up` gets as far as starting the embedded server and migrating, then
    # must stop that server again, print no banner, and exit non-zero with the one line that matters.
    redis_port = free_port()
    env = _env(
        SPACE_DATA_DIR=str(tmp_path / "data"),
        SPACE_QUEUE_URL=f"redis://127.0.0.1:{redis_port}/0",
        SPACE_PORT=str(free_port()),
    )
    out = _run(["up"], env, timeout=120)
    _one_line(out, "queue", f"127.0.0.1:{redis_port}", "SPACE_QUEUE_URL")
    assert "Space is running" not in out.stdout, out.stdout
    pgdata = tmp_path / "data" / "pgdata"
    assert (pgdata / "PG_VERSION").exists(), "the embedded server was started (the failure came after it)"
    assert not (pgdata / "postmaster.pid").exists(), "the embedded server was left running"
