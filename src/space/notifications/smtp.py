"""Where email goes and how one message is handed over: SPACE_SMTP_URL parsed, one SMTP session per message
(aiosmtplib), and what the server's answer means for the next attempt.

The URL holds a password: nothing here puts it in an exception, a log line or a repr (`SmtpTarget.shown` is
what may be said of it). Imports nothing of Space, so the settings can check their values with it.
"""

from __future__ import annotations

import email.utils
import re
import ssl
from dataclasses import dataclass, field
from email.message import EmailMessage
from urllib.parse import parse_qsl, unquote, urlsplit

TIMEOUT_SECONDS = 30.0
"""Bound on each step of one SMTP session (connect, each command, the data), as aiosmtplib applies it."""

_PORTS = {"smtp": 25, "smtps": 465}


@dataclass(frozen=True)
class SmtpTarget:
    """SPACE_SMTP_URL, parsed: where to connect, how to secure it, whom to log in as."""

    host: str
    port: int
    implicit_tls: bool
    starttls: bool
    username: str | None = None
    password: str | None = field(default=None, repr=False)

    @property
    def shown(self) -> str:
        """What logs and `space check` may say of it: scheme, host and port, never the user or the password."""
        scheme = "smtps" if self.implicit_tls else "smtp"
        return f"{scheme}://{self.host}:{self.port}" + (" (STARTTLS)" if self.starttls else "")


def parse_smtp_url(url: str) -> SmtpTarget:
    """smtp://[user:pass@]host[:port][?starttls=1] or smtps://...; ValueError says what is wrong, without the URL."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise ValueError("SPACE_SMTP_URL is not a URL of the form smtp://[user:pass@]host[:port]") from None
    scheme = parts.scheme.lower()
    if scheme not in _PORTS:
        raise ValueError("SPACE_SMTP_URL must start with smtp:// or smtps://")
    if not parts.hostname:
        raise ValueError("SPACE_SMTP_URL names no host")
    if parts.path not in ("", "/") or parts.fragment:
        raise ValueError("SPACE_SMTP_URL takes no path: smtp://[user:pass@]host[:port][?starttls=1]")
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    if set(query) - {"starttls"} or query.get("starttls", "0") not in ("0", "1"):
        raise ValueError("SPACE_SMTP_URL knows one parameter, starttls=1 (or 0)")
    starttls = query.get("starttls") == "1"
    if starttls and scheme == "smtps":
        raise ValueError("SPACE_SMTP_URL: smtps:// is TLS already; starttls=1 is for smtp://")
    username = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password is not None else None
    return SmtpTarget(
        host=parts.hostname,
        port=port or _PORTS[scheme],
        implicit_tls=scheme == "smtps",
        starttls=starttls,
        username=username,
        password=password,
    )


def parse_mail_from(value: str) -> tuple[str, str]:
    """SPACE_MAIL_FROM as (display name, address); ValueError when it holds no address or a line break."""
    if "\r" in value or "\n" in value:
        raise ValueError("SPACE_MAIL_FROM must be one line")
    name, address = email.utils.parseaddr(value)
    if not re.fullmatch(r"[^@\s<>]+@[^@\s<>]+", address):
        raise ValueError(f"SPACE_MAIL_FROM holds no address: {value!r} (e.g. Space <space@example.com>)")
    return name, address


def check_public_url(value: str) -> None:
    """SPACE_PUBLIC_URL is an http(s) URL of a host, with no query or fragment (links are built on it)."""
    try:
        parts = urlsplit(value)
        _ = parts.port
    except ValueError:
        raise ValueError(f"SPACE_PUBLIC_URL is not a URL: {value!r}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise ValueError(f"SPACE_PUBLIC_URL must be http(s)://host[:port][/path]: {value!r}")


def check_mail_settings(smtp_url: str | None, mail_from: str, public_url: str | None) -> None:
    """The three mail settings parse (a start-up check); ValueError names the setting and never the SMTP password."""
    if smtp_url is not None:
        parse_smtp_url(smtp_url)
    parse_mail_from(mail_from)
    if public_url is not None:
        check_public_url(public_url)


# --- handing one message over -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """How an attempt went: `ok`, or why not and whether trying again may help (`final`: it can't)."""

    ok: bool
    code: int | None = None
    error: str | None = None
    final: bool = False


async def send(target: SmtpTarget, message: EmailMessage, sender: str, recipient: str) -> Answer:
    """Hand `message` to the server for `recipient` in one session; 4xx replies and connection failures may pass
    (retry), 5xx replies are final."""
    # Here, not at the top: every worker imports this module, and most installations send no email.
    import aiosmtplib

    try:
        await aiosmtplib.send(
            message,
            sender=sender,
            recipients=[recipient],
            hostname=target.host,
            port=target.port,
            username=target.username,
            password=target.password,
            use_tls=target.implicit_tls,
            # Only when asked: an opportunistic upgrade would fail on a server whose certificate does not verify,
            # and quietly send in clear text where it was not offered.
            start_tls=target.starttls,
            tls_context=ssl.create_default_context() if target.implicit_tls or target.starttls else None,
            timeout=TIMEOUT_SECONDS,
        )
    except aiosmtplib.SMTPRecipientsRefused as exc:
        codes = [r.code for r in exc.recipients]
        worst = max(codes, default=None)
        return _replied(worst, "; ".join(f"{r.code} {r.message}" for r in exc.recipients))
    except aiosmtplib.SMTPResponseException as exc:
        return _replied(exc.code, f"{exc.code} {exc.message}")
    except (aiosmtplib.SMTPException, OSError, TimeoutError) as exc:
        # No reply to judge (refused, reset, timed out, TLS failed): the server may be back later.
        return Answer(ok=False, error=f"{type(exc).__name__}: {exc}"[:500])
    return Answer(ok=True, code=250)


def _replied(code: int | None, text: str) -> Answer:
    # RFC 5321: 4yz is a transient negative completion, 5yz permanent.
    final = code is not None and 500 <= code < 600
    return Answer(ok=False, code=code, error=text[:500], final=final)


async def check_server(target: SmtpTarget) -> str | None:
    """Connect (TLS as configured), say EHLO, log in when a user is set, quit: None, or what went wrong (for
    `space check`; nothing is sent)."""
    import aiosmtplib

    client = aiosmtplib.SMTP(
        hostname=target.host,
        port=target.port,
        use_tls=target.implicit_tls,
        start_tls=target.starttls,
        tls_context=ssl.create_default_context() if target.implicit_tls or target.starttls else None,
        timeout=TIMEOUT_SECONDS,
    )
    try:
        await client.connect()
        if target.username is not None:
            await client.login(target.username, target.password or "")
        await client.quit()
    except (aiosmtplib.SMTPException, OSError, TimeoutError) as exc:
        return f"{type(exc).__name__}: {exc}"[:300]
    finally:
        client.close()
    return None
