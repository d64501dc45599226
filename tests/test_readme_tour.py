"""The README's `## Try it` tour, run as a reader pastes it (SPEC §27): its shell lines, in order, in one `bash -e`
beside a real `space up` on a free port of a database of its own, the tour's variables taken from the commands' own
output. Each step's effect is then checked against the database: North's id, its owner's token, the export
completed, the result downloaded whole with the token and again through the link."""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from space.auth.tokens import hash_token
from tests.helpers import free_port, fresh_database, space_env

pytestmark = pytest.mark.slow

README = Path(__file__).resolve().parents[1] / "README.md"
SPACE = Path(sys.executable).with_name("space")
"""The installed console script; the tour calls it as `.venv/bin/space`."""
WAIT = 90.0
"""Seconds `space up` may take to answer /health, and the tour to run (it polls the export's state itself)."""
VARIABLES = ("BASE", "TOKEN", "ORG", "EXPORT", "STATE", "URL", "IMPORT", "RESTORE", "DEST", "DELIVERY")
"""The tour's variables the checks read afterwards."""


def tour_lines(readme: str) -> list[str]:
    """The shell lines of the code blocks in the README's `## Try it` section, in order."""
    section = readme.split("\n## Try it\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```(?:sh|bash|shell)\n(.*?)^```", section, re.S | re.M)
    return [line for block in blocks for line in block.splitlines() if line.strip() and not line.startswith("#")]


def test_the_tour_has_the_steps_the_checks_read() -> None:
    lines = tour_lines(README.read_text())
    assigned = {m.group(1) for line in lines if (m := re.match(r"([A-Z]+)=", line))}
    assert set(VARIABLES) <= assigned, (VARIABLES, assigned)
    # Nothing the reader must edit first: no fixed port, and nothing taken from a value they would have to copy.
    assert not any(re.search(r":8000\b", line) for line in lines), lines


@pytest.fixture(scope="module")
def tour_database(owner_url: str) -> Iterator[str]:
    """A database of the tour's own: `space demo` makes North and South there, and the tour's worker sees no other
    test's queue."""
    with fresh_database(owner_url, "space_tour") as url:
        yield url


@pytest.fixture(scope="module")
def space_up(tour_database: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path]]:
    """`space up` (API and in-process worker) on a free port, as `make run` starts it; its port and log."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("tour") / "space-up.log"
    # As the tour says to start it: a destination may name this machine (the tour's moto S3) only with this setting.
    env = space_env(
        tour_database,
        SPACE_HOST="127.0.0.1",
        SPACE_PORT=str(port),
        SPACE_WORKER_METRICS_PORT="0",
        SPACE_WEBHOOK_ALLOW_PRIVATE="1",
    )
    with log_path.open("wb") as log:
        proc = subprocess.Popen([str(SPACE), "up"], env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + WAIT
        while True:
            assert proc.poll() is None, f"space up exited {proc.returncode}\n{log_path.read_text()}"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, (
                f"space up did not answer /health in {WAIT:.0f} s\n{log_path.read_text()}"
            )
            time.sleep(0.1)  # between polls of /health: the loop waits for its answer, with a deadline
        yield port, log_path
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_the_readme_tour_runs_as_pasted(space_up: tuple[int, Path], tour_database: str, tmp_path: Path) -> None:
    port, log_path = space_up
    # "Paste these lines into a shell in this folder": a folder whose .venv/bin/space is the installed one, so the
    # files the tour writes land there and not in the checkout.
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "space").symlink_to(SPACE)
    (tmp_path / ".venv" / "bin" / "moto_server").symlink_to(SPACE.with_name("moto_server"))
    variables = tmp_path / "tour-variables"
    script = "\n".join([*tour_lines(README.read_text()), f"declare -p {' '.join(VARIABLES)} > {variables}"])
    env = space_env(tour_database, SPACE_PORT=str(port))
    done = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        timeout=WAIT,
    )
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr, log_path.read_text()[-4000:])
    seen = _declared(variables.read_text())
    out = done.stdout.decode()  # bytes first: text mode would turn the CSV's CRLF into LF

    # The base URL is the running app's, on whatever port it was given.
    assert seen["BASE"] == f"http://127.0.0.1:{port}"
    assert '"status"' in out.splitlines()[0], out
    with psycopg.connect(tour_database) as db:
        # ORG is North's id, and TOKEN its owner's.
        [(name,)] = db.execute("SELECT name FROM organizations WHERE id = %s", (uuid.UUID(seen["ORG"]),)).fetchall()
        assert name == "North"
        roles = db.execute(
            "SELECT m.role FROM api_tokens t JOIN memberships m ON m.user_id = t.user_id"
            " WHERE m.org_id = %s AND t.revoked_at IS NULL AND t.token_hash = %s",
            (uuid.UUID(seen["ORG"]), hash_token(seen["TOKEN"])),
        ).fetchall()
        # The export it asked for ran to the end in North, as the owner's.
        [row] = db.execute(
            "SELECT e.org_id::text, e.kind, e.state, e.sha256, e.byte_size, e.row_count, m.role"
            " FROM export_jobs e JOIN memberships m ON m.org_id = e.org_id AND m.user_id = e.creator_id"
            " WHERE e.id = %s",
            (uuid.UUID(seen["EXPORT"]),),
        ).fetchall()
    org_id, kind, state, sha256, byte_size, row_count, creator_role = row
    assert roles == [("owner",)], roles
    assert (org_id, kind, state, creator_role) == (seen["ORG"], "tickets_csv", "completed", "owner"), row
    assert seen["STATE"] == "completed" and "completed" in out.split()
    assert row_count > 0
    # The result downloaded with the token is the published one, whole; the link gave the same bytes, and a range.
    body = (tmp_path / "tickets.csv").read_bytes()
    assert len(body) == byte_size and hashlib.sha256(body).hexdigest() == sha256
    assert (tmp_path / "tickets-via-link.csv").read_bytes() == body
    assert "same bytes through the link" in out
    assert body[:100].decode() in out  # `curl -r 0-99`
    assert seen["URL"].startswith("/")
    # The archive came back as a new org, verified (SPEC §23).
    assert seen["RESTORE"] == "completed" and "verified: True" in out, out
    with psycopg.connect(tour_database) as db:
        [(state, restored, report)] = db.execute(
            "SELECT state, restored_org_id, report FROM imports WHERE id = %s", (uuid.UUID(seen["IMPORT"]),)
        ).fetchall()
        [(restored_name,)] = db.execute("SELECT name FROM organizations WHERE id = %s", (restored,)).fetchall()
    assert (state, restored_name, report["verified"]) == ("completed", "North restored", True)
    # The export was delivered to the tour's bucket: its CSV and the manifest are there (SPEC §22).
    assert seen["DELIVERY"] == "delivered", out
    assert f"<Key>{seen['ORG']}/manual/" in out and f"-{seen['EXPORT']}/manifest.json</Key>" in out, out
    with psycopg.connect(tour_database) as db:
        [(bucket, secret_sealed)] = db.execute(
            "SELECT bucket, secret_sealed IS NOT NULL FROM destinations WHERE id = %s", (uuid.UUID(seen["DEST"]),)
        ).fetchall()
    assert (bucket, secret_sealed) == ("north-exports", True)
    assert out.rstrip().splitlines()[-1] == f"Now open {seen['BASE']}/ in a browser and sign in with {seen['TOKEN']}"


def _declared(text: str) -> dict[str, Any]:
    """Values of `declare -p` lines (`declare -- NAME="value"`)."""
    values = dict(re.findall(r'^declare -\S* (\w+)="(.*)"$', text, re.M))
    assert set(VARIABLES) <= set(values), text
    return values
