"""The mail settings (SPEC §19, §26): what SPACE_SMTP_URL, SPACE_MAIL_FROM and SPACE_PUBLIC_URL accept, that the
SMTP password is never repeated, and what `space check` says of email, off and on (against a real server)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from space.config import SettingsError, load_settings
from space.notifications.smtp import parse_smtp_url
from tests.helpers import free_port, space_env
from tests.notifications.smtp_server import SmtpServer, smtp_server

SPACE = str(Path(sys.executable).with_name("space"))
SECRET = "hunter2-s3cret"


@pytest.fixture(scope="module")
def smtp() -> Iterator[SmtpServer]:
    """This module's SMTP server."""
    with smtp_server() as server:
        yield server


def test_defaults() -> None:
    s = load_settings({})
    assert s.smtp_url is None and s.mail_from == "Space <space@localhost>"
    assert s.public_base == "http://127.0.0.1:8000"
    s = load_settings({"SPACE_HOST": "0.0.0.0", "SPACE_PORT": "9000"})
    assert s.public_base == "http://0.0.0.0:9000"
    s = load_settings({"SPACE_PUBLIC_URL": "https://space.example.com/"})
    assert s.public_base == "https://space.example.com"


@pytest.mark.parametrize(
    ("url", "host", "port", "implicit_tls", "starttls", "user", "password"),
    [
        ("smtp://mail.example.com", "mail.example.com", 25, False, False, None, None),
        ("smtp://mail.example.com:2525", "mail.example.com", 2525, False, False, None, None),
        ("smtp://bob:p%40ss@mail.example.com:587?starttls=1", "mail.example.com", 587, False, True, "bob", "p@ss"),
        ("smtps://bob:pw@mail.example.com", "mail.example.com", 465, True, False, "bob", "pw"),
        ("smtp://127.0.0.1:1025?starttls=0", "127.0.0.1", 1025, False, False, None, None),
    ],
)
def test_smtp_urls_that_parse(
    url: str, host: str, port: int, implicit_tls: bool, starttls: bool, user: str | None, password: str | None
) -> None:
    target = parse_smtp_url(url)
    assert (target.host, target.port, target.implicit_tls, target.starttls) == (host, port, implicit_tls, starttls)
    assert (target.username, target.password) == (user, password)
    assert SECRET not in repr(parse_smtp_url(f"smtp://bob:{SECRET}@mail.example.com"))
    assert "bob" not in target.shown and "@" not in target.shown


@pytest.mark.parametrize(
    "url",
    [
        f"http://bob:{SECRET}@mail.example.com",
        f"smtp://bob:{SECRET}@",
        f"smtp://bob:{SECRET}@mail.example.com:99999",
        f"smtp://bob:{SECRET}@mail.example.com/path",
        f"smtp://bob:{SECRET}@mail.example.com?tls=1",
        f"smtp://bob:{SECRET}@mail.example.com?starttls=yes",
        f"smtps://bob:{SECRET}@mail.example.com?starttls=1",
    ],
)
def test_a_malformed_smtp_url_is_refused_without_repeating_it(url: str) -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings({"SPACE_SMTP_URL": url})
    assert "SPACE_SMTP_URL" in str(caught.value)
    assert SECRET not in str(caught.value) and "bob" not in str(caught.value)


@pytest.mark.parametrize("value", ["", "nobody", "Space <>", "a@b\nBcc: x@y"])
def test_a_mail_from_without_an_address_is_refused(value: str) -> None:
    with pytest.raises(SettingsError, match="SPACE_MAIL_FROM"):
        load_settings({}, mail_from=value)


@pytest.mark.parametrize(
    "value", ["space.example.com", "ftp://space.example.com", "https://x.test/?a=1", "https://x.test/#/"]
)
def test_a_public_url_that_can_not_carry_links_is_refused(value: str) -> None:
    with pytest.raises(SettingsError, match="SPACE_PUBLIC_URL"):
        load_settings({"SPACE_PUBLIC_URL": value})


def _check(owner_url: str, **env: str) -> dict[str, str]:
    out = subprocess.run([SPACE, "check"], env=space_env(owner_url, **env), capture_output=True, text=True, timeout=120)
    assert "Traceback" not in out.stderr, out.stderr
    lines = {}
    for line in out.stdout.splitlines():
        status, _, rest = line.partition(" ")
        if status in ("ok", "FAIL"):
            lines[rest.strip().split(":", 1)[0]] = line
    return lines


def test_space_check_says_email_is_off_without_smtp(owner_url: str) -> None:
    line = _check(owner_url)["email"]
    assert line.startswith("ok") and "off: SPACE_SMTP_URL is unset" in line


def test_space_check_sees_the_smtp_server_and_never_shows_the_password(owner_url: str, smtp: SmtpServer) -> None:
    url = f"smtp://{smtp.host}:{smtp.port}"
    line = _check(owner_url, SPACE_SMTP_URL=url)["email"]
    assert line.startswith("ok") and f"{url} answers" in line
    dead = f"smtp://bob:{SECRET}@127.0.0.1:{free_port()}"
    line = _check(owner_url, SPACE_SMTP_URL=dead)["email"]
    assert line.startswith("FAIL") and "127.0.0.1" in line and "SPACE_SMTP_URL" in line
    assert SECRET not in line and "bob" not in line
