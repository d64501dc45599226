"""Where a webhook may be sent: http(s) to public addresses only (SPEC §12), checked after DNS resolution.

The check runs when an endpoint is created and again before every attempt, and the attempt then connects to
the very address that was checked (see `delivery`), so a name that later resolves to 127.0.0.1 or to the
cloud's metadata address (DNS rebinding) is refused, not requested.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from space.errors import InvalidRequest

RESOLVE_TIMEOUT_SECONDS = 5.0
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


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


def is_public(address: IPAddress) -> bool:
    """Not loopback, private, link-local, shared, reserved, unspecified or multicast (IPv4-mapped judged as IPv4)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_global and not address.is_multicast


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
    """Parse `url`, resolve its host and check every address; InvalidRequest names what is refused."""
    scheme, host, port, target = parse(url)
    try:
        addresses: tuple[IPAddress, ...] = (ipaddress.ip_address(host),)
    except ValueError:
        addresses = await _lookup(host, port)
    if not allow_private:
        for address in addresses:
            if not is_public(address):
                # Every address must pass: a client may connect to any of them.
                raise refused(f"{host} resolves to {address}, which is not a public address")
    return Destination(scheme, host, port, target, addresses)


async def _lookup(host: str, port: int) -> tuple[IPAddress, ...]:
    loop = asyncio.get_running_loop()
    try:
        infos = await asyncio.wait_for(
            loop.getaddrinfo(host, port, type=socket.SOCK_STREAM), timeout=RESOLVE_TIMEOUT_SECONDS
        )
    except (OSError, TimeoutError):
        raise refused(f"{host} does not resolve") from None
    found: dict[IPAddress, None] = {}
    for _family, _type, _proto, _name, sockaddr in infos:
        # An IPv6 scope ("fe80::1%eth0") is not part of the address.
        found[ipaddress.ip_address(str(sockaddr[0]).split("%")[0])] = None
    if not found:
        raise refused(f"{host} does not resolve")
    return tuple(found)
