"""The webhook address rules of SPEC §25 (issue 29): IPv6 forms that carry an IPv4 address and site-local addresses
are refused, and a refusal never says what a host resolved to. Nothing here is ever sent anywhere: refused URLs are
never registered, and the names used resolve on this machine only."""

from __future__ import annotations

import ipaddress
import json
import socket

import pytest

from space.errors import InvalidRequest
from space.webhooks import guard
from tests.helpers import Api, assert_problem

CARRYING_IPV4 = [
    "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1
    "64:ff9b::a00:7",  # NAT64 of 10.0.0.7
    "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254, the cloud's metadata address
    "64:ff9b::5db8:d822",  # NAT64 of a public address: where the gateway sends it is not Space's to check
    "64:ff9b:1::a00:7",  # NAT64, local-use prefix
    "64:ff9b:1:ffff::1",
    "2002:7f00:1::1",  # 6to4 of 127.0.0.1
    "2002:a00:7::",  # 6to4 of 10.0.0.7
    "2002:5db8:d822::1",  # 6to4 of a public address
    "::7f00:1",  # IPv4-compatible 127.0.0.1
    "::a00:7",  # IPv4-compatible 10.0.0.7
    "::5db8:d822",  # IPv4-compatible public address
    "2001:0:4136:e378:8000:63bf:3fff:fdd2",  # Teredo
    "::ffff:7f00:1",  # IPv4-mapped 127.0.0.1
    "::ffff:a9fe:a9fe",  # IPv4-mapped metadata address
]
SITE_LOCAL = ["fec0::1", "fec0:0:0:ffff::1", "feff:ffff::1"]


@pytest.mark.parametrize("address", CARRYING_IPV4 + SITE_LOCAL)
def test_ipv6_forms_that_carry_ipv4_and_site_local_are_not_public(address: str) -> None:
    assert guard.is_public(ipaddress.ip_address(address)) is False


@pytest.mark.parametrize(
    "address", ["2606:2800:220:1:248:1893:25c8:1946", "2a00:1450:4001:82a::200e", "::ffff:5db8:d822"]
)
def test_public_ipv6_stays_public(address: str) -> None:
    # The neighbours of the refused ranges are not caught by them.
    assert guard.is_public(ipaddress.ip_address(address)) is True


@pytest.mark.parametrize("address", CARRYING_IPV4 + SITE_LOCAL)
async def test_each_form_is_refused_as_a_url_literal(address: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        await guard.resolve(f"https://[{address}]:8443/hook", allow_private=False)
    assert "not allowed" in refused.value.detail
    _assert_names_no_ipv4(refused.value.detail)


def _loopback_names() -> dict[str, set[str]]:
    """Names this machine resolves to loopback only, with every address they resolve to (what must not be said)."""
    names: dict[str, set[str]] = {}
    for name in ("localhost", "localhost.", "LOCALHOST", "ip6-localhost", "ip6-loopback"):
        try:
            infos = socket.getaddrinfo(name, 80, type=socket.SOCK_STREAM)
        except OSError:
            continue
        found = {str(sockaddr[0]).split("%")[0] for *_, sockaddr in infos}
        if found and all(ipaddress.ip_address(a).is_loopback for a in found):
            names[name] = found
    assert "localhost" in names, names
    return names


async def test_a_loopback_name_is_refused_without_its_addresses() -> None:
    for name, addresses in _loopback_names().items():
        with pytest.raises(InvalidRequest) as refused:
            await guard.resolve(f"http://{name}:8000/hook", allow_private=False)
        said = refused.value.detail + json.dumps(refused.value.extra)
        assert "not allowed" in said
        for address in addresses | {"127.0.0.1", "::1"}:
            assert address not in said, (name, said)


async def test_a_name_that_does_not_resolve_reads_like_one_that_is_private() -> None:
    """Nor is it said whether a name exists: an unknown name and a private one get the same words."""
    with pytest.raises(InvalidRequest) as unknown:
        await guard.resolve("http://no-such-host.invalid/hook", allow_private=False)
    with pytest.raises(InvalidRequest) as private:
        await guard.resolve("http://localhost/hook", allow_private=False)
    assert unknown.value.detail.replace("no-such-host.invalid", "HOST") == private.value.detail.replace(
        "localhost", "HOST"
    )


# --- through the API: 400 and its code, no resolved address anywhere in the body -------------------------------


@pytest.mark.parametrize(
    "url",
    [f"https://[{a}]/hook" for a in CARRYING_IPV4 + SITE_LOCAL]
    + ["http://localhost:8000/hook", "http://localhost./hook", "https://LOCALHOST/hook"],
)
async def test_the_api_refuses_each_form_and_names_no_resolved_address(api: Api, url: str) -> None:
    org = await api.org()
    r = await api.call("POST", org.path("/webhooks"), org.owner, json={"url": url, "events": ["export.completed"]})
    body = assert_problem(r, 400, "invalid_request")
    assert "not allowed" in body["detail"] and body["errors"][0]["key"] == "url", body
    _assert_names_no_ipv4(r.text)
    for resolved in {a for addresses in _loopback_names().values() for a in addresses}:
        assert resolved not in r.text, r.text
    listed = await api.call("GET", org.path("/webhooks"), org.owner)
    assert listed.json() == {"items": []}


def _assert_names_no_ipv4(text: str) -> None:
    """No dotted IPv4 address in `text` (the carried ones, spelled out, would be a resolved address)."""
    for word in text.replace('"', " ").replace(",", " ").split():
        try:
            ipaddress.IPv4Address(word.strip(":.()[]"))
        except ValueError:
            continue
        raise AssertionError(f"{word} named in {text}")
