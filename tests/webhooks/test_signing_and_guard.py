"""The pieces of a delivery without the network: the Standard Webhooks signature, the address rule, the backoff."""

from __future__ import annotations

import base64
import ipaddress

import pytest

from space.errors import InvalidRequest
from space.webhooks import guard
from space.webhooks.outbox import backoff
from space.webhooks.signing import new_secret, signature


def test_signature_matches_the_standard_webhooks_example() -> None:
    # The example of the Standard Webhooks specification (github.com/standard-webhooks/standard-webhooks).
    got = signature(
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, b'{"test": 2432232314}'
    )
    assert got == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_new_secrets_are_random_whsec_keys() -> None:
    a, b = new_secret(), new_secret()
    assert a != b and a.startswith("whsec_")
    assert len(base64.b64decode(a.removeprefix("whsec_"))) == 24


@pytest.mark.parametrize(
    ("address", "public"),
    [
        ("93.184.216.34", True),
        ("2606:2800:220:1:248:1893:25c8:1946", True),
        ("127.0.0.1", False),
        ("10.1.1.1", False),
        ("172.31.255.255", False),
        ("192.168.0.1", False),
        ("169.254.169.254", False),
        ("100.64.0.1", False),
        ("0.0.0.0", False),
        ("224.0.0.1", False),
        ("::1", False),
        ("fe80::1", False),
        ("fc00::1", False),
        ("::ffff:10.0.0.1", False),
        ("::ffff:93.184.216.34", True),
    ],
)
def test_public_addresses(address: str, public: bool) -> None:
    assert guard.is_public(ipaddress.ip_address(address)) is public


async def test_the_pinned_request_keeps_the_name() -> None:
    destination = await guard.resolve("https://93.184.216.34:8443/in?x=1", allow_private=False)
    assert destination.pinned_url(destination.addresses[0]) == "https://93.184.216.34:8443/in?x=1"
    assert destination.host_header == "93.184.216.34:8443"
    v6 = await guard.resolve("http://[::1]/", allow_private=True)
    assert v6.pinned_url(v6.addresses[0]) == "http://[::1]:80/" and v6.host_header == "[::1]"


async def test_localhost_resolves_and_is_refused() -> None:
    with pytest.raises(InvalidRequest, match="not a public address"):
        await guard.resolve("http://localhost/", allow_private=False)
    allowed = await guard.resolve("http://localhost/", allow_private=True)
    assert all(not guard.is_public(a) for a in allowed.addresses)


def test_backoff_grows_four_fold() -> None:
    assert [backoff(n, 10) for n in range(1, 5)] == [10, 40, 160, 640]
