"""Standard Webhooks signatures: `whsec_<base64 key>` secrets and `v1,<base64 HMAC-SHA256 of id.timestamp.body>`."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

SECRET_PREFIX = "whsec_"
SECRET_BYTES = 24
"""Key length of a new secret (192 bits; the Standard Webhooks convention allows 24 to 64 bytes)."""


def new_secret() -> str:
    """A fresh signing secret in the convention's `whsec_<base64>` form."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def signature(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` value: `v1,` and the base64 HMAC-SHA256 of `<id>.<timestamp>.<body>`."""
    # The key is the secret's decoded bytes, not its text: what the convention's libraries expect.
    key = base64.b64decode(secret.removeprefix(SECRET_PREFIX))
    mac = hmac.new(key, f"{message_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def signed_headers(secret: str, message_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The three Standard Webhooks headers of one attempt."""
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature(secret, message_id, timestamp, body),
    }
