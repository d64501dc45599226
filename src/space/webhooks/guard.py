"""Where a webhook may be sent: http(s) to public addresses only (SPEC §12, §25), checked after DNS resolution.

The check runs when an endpoint is created and again before every attempt, and the attempt then connects to
the very address that was checked (see `delivery`), so a name that later resolves to 127.0.0.1 or to the
cloud's metadata address (DNS rebinding) is refused, not requested.

A refusal names the host as it was given, never an address it resolved to: the answer must not let anyone who
may register a webhook map the installation's internal DNS. And a webhook URL reaches a log line as its scheme
and host only (`loggable`): the path and query of a receiver's URL often are its secret (Slack's are).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import re
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from space.errors import InvalidRequest

RESOLVE_TIMEOUT_SECONDS = 5.0
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

CARRIES_IPV4 = tuple(
    ipaddress.IPv6Network(n)
    for n in (
        "64:ff9b::/96",  # NAT64, well-known prefix (RFC 6052): a gateway forwards to the IPv4 address it carries
        "64:ff9b:1::/48",  # NAT64, local use (RFC 8215)
        "2002::/16",  # 6to4 (RFC 3056): a relay forwards to the IPv4 address in bits 16-48
        "2001::/32",  # Teredo (RFC 4380): a relay, the IPv4 address obfuscated in the last 32 bits
        "::/96",  # IPv4-compatible (RFC 4291, deprecated): the IPv4 address in the last 32 bits
    )
)
"""IPv6 ranges whose addresses lead, through a translator or a relay, to an IPv4 address they carry. Refused
whatever that address is: where the packet ends up is the translator's choice (a NAT64 gateway inside a network
reaches its private addresses), not something Space can check. IPv4-mapped addresses (`::ffff:0:0/96`) are not
here: a socket connects to the IPv4 address itself, so they are judged as that address."""
SITE_LOCAL = ipaddress.IPv6Network("fec0::/10")
"""Deprecated (RFC 3879), yet still routed inside some networks, and Python's `is_global` says yes to it."""


@dataclass(frozen=True)
class Destination:
    """A parsed webhook URL and the addresses its host resolved to (every one of them allowed)."""

    scheme: str
    host: str
    port: int
    target: str
    """Path and query, as sent in the request line."""
    addresses: tuple[IPAddress, ...]

    @property
    def host_header(self) -> str:
        """The Host header: the name, with the port when it is not the scheme's default."""
        default = 443 if self.scheme == "https" else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == default else f"{host}:{self.port}"

    def pinned_url(self, address: IPAddress) -> str:
        """The URL with the checked address in place of the name, so no second lookup can differ."""
        literal = f"[{address}]" if address.version == 6 else str(address)
        return f"{self.scheme}://{literal}:{self.port}{self.target}"


def refused(detail: str) -> InvalidRequest:
    """The 400 of a URL that may not be used."""
    return InvalidRequest(f"url: {detail}", errors=[{"key": "url", "message": detail}])


def not_allowed(host: str, *, literal: bool) -> InvalidRequest:
    """The 400 of a host that is not public, in words only: what a name resolved to is never said (nor whether it
    resolved at all), so the answer maps nobody's internal DNS."""
    if literal:
        return refused(f"{host} is not allowed: it is not a public address")
    return refused(f"{host} is not allowed: it does not resolve, or one of its addresses is not a public address")


def is_public(address: IPAddress) -> bool:
    """Not loopback, private, link-local, site-local, shared, reserved, unspecified or multicast, and no IPv6 form
    that carries an IPv4 address (NAT64, 6to4, Teredo, IPv4-compatible); IPv4-mapped is judged as its IPv4."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        elif address in SITE_LOCAL or any(address in network for network in CARRIES_IPV4):
            return False
    return address.is_global and not address.is_multicast


def loggable(url: str) -> str:
    """A webhook URL as a log line may show it: scheme and host (and port) only, no path, query or credentials."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "[unparsable url]"
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    return f"{parts.scheme.lower()}://{host}" + (f":{port}" if port is not None else "")


def parse(url: str) -> tuple[str, str, int, str]:
    """Scheme, host, port and request target of a webhook URL; InvalidRequest when it is not an http(s) URL."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise refused(f"not a valid URL ({exc})") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise refused("must be an https:// or http:// URL")
    if parts.username is not None or parts.password is not None:
        raise refused("must not carry credentials")
    host = parts.hostname or ""
    if not host:
        raise refused("needs a host")
    try:
        host = host.encode("idna").decode("ascii")
    except UnicodeError:
        raise refused("the host is not a valid name") from None
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return scheme, host, port or (443 if scheme == "https" else 80), target


async def resolve(url: str, *, allow_private: bool) -> Destination:
    """Parse `url`, resolve its host and check every address; InvalidRequest says the host is not allowed, never
    what it resolved to."""
    scheme, host, port, target = parse(url)
    try:
        addresses: tuple[IPAddress, ...] = (ipaddress.ip_address(host),)
        literal = True
    except ValueError:
        addresses = await _lookup(host, port, allow_private=allow_private)
        literal = False
    # Every address must pass: a client may connect to any of them.
    if not allow_private and not all(is_public(address) for address in addresses):
        raise not_allowed(host, literal=literal)
    return Destination(scheme, host, port, target, addresses)


async def _lookup(host: str, port: int, *, allow_private: bool) -> tuple[IPAddress, ...]:
    loop = asyncio.get_running_loop()
    try:
        infos = await asyncio.wait_for(
            loop.getaddrinfo(host, port, type=socket.SOCK_STREAM), timeout=RESOLVE_TIMEOUT_SECONDS
        )
    except (OSError, TimeoutError):
        infos = []
    found: dict[IPAddress, None] = {}
    for _family, _type, _proto, _name, sockaddr in infos:
        # An IPv6 scope ("fe80::1%eth0") is not part of the address.
        found[ipaddress.ip_address(str(sockaddr[0]).split("%")[0])] = None
    if not found:
        # The words of a private name's refusal: whether an internal name exists is not to be learnt either. Only
        # where private addresses are allowed anyway (tests, a local setup) is it said plainly.
        raise refused(f"{host} does not resolve") if allow_private else not_allowed(host, literal=False)
    return tuple(found)


_URL = re.compile(r"(?i)\bhttps?://[^\s\"'<>]+")


def without_paths(text: str) -> str:
    """`text` with every http(s) URL in it cut to `loggable` form."""

    def cut(match: re.Match[str]) -> str:
        url = match.group(0)
        # Punctuation that ends the URL most likely ends the sentence: it stays (a URL inside keeps none of it).
        tail = url[len(url.rstrip(".,;:!?)")) :]
        return loggable(url) + tail

    return _URL.sub(cut, text)


class UrlsAsLoggable(logging.Filter):
    """Cuts the URLs of a record (its message and its arguments) to scheme and host."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Always keep the record; rewrite it in place, before any handler formats it."""
        if isinstance(record.msg, str):
            record.msg = without_paths(record.msg)
        if isinstance(record.args, tuple):
            # httpx passes its `URL` object, not a string: judged by what it prints.
            record.args = tuple(
                without_paths(str(arg)) if isinstance(arg, str) or type(arg).__name__ == "URL" else arg
                for arg in record.args
            )
        return True


# httpx logs every request it sends at INFO, with its whole URL ("HTTP Request: POST http://.../<secret path>"),
# and the delivery's URL is a webhook's. A logger's own filter runs before any handler (a test's caplog included),
# and whoever logs through httpx in this process gets the same treatment, which costs nothing.
logging.getLogger("httpx").addFilter(UrlsAsLoggable())
