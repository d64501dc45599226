"""The `s3` destination type: a client for the customer's bucket, the test write on save, and writes that never
overwrite (SPEC §22).

Every object is written with `If-None-Match: *` (a PUT, or the completion of a multipart upload), which S3 and
moto both honour: a key that exists already is refused (412), never replaced. A refusal is then looked at: an
object carrying the same `x-amz-meta-sha256` is this delivery's own, written by an earlier attempt that failed
after it (the attempt is safe to run twice); anything else is someone else's object and fails the delivery.

The client gets its endpoint, region and credentials from the destination only: never from botocore's standard
variables, which name Space's own result store. Its retries are off (the outbox retries, with backoff, and counts
them); its timeouts bound every request.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from aiobotocore.config import AioConfig
from aiobotocore.session import AioSession
from botocore.exceptions import BotoCoreError, ClientError

if TYPE_CHECKING:
    from types_aiobotocore_s3 import S3Client

CONNECT_TIMEOUT_SECONDS = 5.0
READ_TIMEOUT_SECONDS = 30.0
PART_BYTES = 8 * 1024 * 1024
"""An object larger than this goes up as a multipart upload of parts this size."""
PROBE_PREFIX = ".space-check-"
DEFAULT_REGION = "us-east-1"
RETRYABLE_4XX = frozenset({408, 429})
"""Client-error statuses that are the store's moment, not the customer's configuration."""


@dataclass(frozen=True)
class Bucket:
    """Where a destination's objects go, and the credentials to write them (the secret opened for this use only)."""

    bucket: str
    prefix: str
    region: str | None
    endpoint_url: str | None
    access_key_id: str
    secret_access_key: str

    def __repr__(self) -> str:  # never the secret, should a Bucket reach a log line or a traceback
        return f"Bucket({self.bucket!r}, prefix={self.prefix!r}, endpoint={self.endpoint_url!r})"


class StoreRefused(Exception):
    """The store answered no. `final`: its 4xx (credentials, missing bucket, a key that is someone else's): trying
    again changes nothing; else a 5xx, a timeout or a broken connection, worth another attempt later."""

    def __init__(self, reason: str, *, final: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.final = final


def reason_of(exc: BaseException) -> str:
    """What the store said, in a line: its error code and message (never a credential: botocore puts none there)."""
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return f"{error.get('Code', '?')} {error.get('Message', '')} (HTTP {status})".strip()[:500]
    return (str(exc) or type(exc).__name__)[:500]


def refused(exc: BaseException) -> StoreRefused:
    """The StoreRefused an error of botocore's means: a 4xx is final, anything else is retried."""
    if isinstance(exc, ClientError):
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        return StoreRefused(reason_of(exc), final=400 <= status < 500 and status not in RETRYABLE_4XX)
    return StoreRefused(reason_of(exc), final=False)


@contextlib.asynccontextmanager
async def client(target: Bucket) -> AsyncIterator[S3Client]:
    """A client of the destination's bucket alone, with no retries of its own and bounded timeouts."""
    region = target.region or DEFAULT_REGION
    endpoint = target.endpoint_url or f"https://s3.{region}.amazonaws.com"
    config = AioConfig(
        retries={"total_max_attempts": 1},
        connect_timeout=CONNECT_TIMEOUT_SECONDS,
        read_timeout=READ_TIMEOUT_SECONDS,
        signature_version="s3v4",
        s3={"addressing_style": "path"} if target.endpoint_url else None,
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    session = AioSession()
    async with session.create_client(
        "s3",
        region_name=region,
        endpoint_url=endpoint,
        aws_access_key_id=target.access_key_id,
        aws_secret_access_key=target.secret_access_key,
        config=config,
    ) as s3:
        yield s3


def object_key(target: Bucket, *parts: str) -> str:
    """The destination's prefix, then `parts`, joined by slashes."""
    return "/".join(p for p in (target.prefix.strip("/"), *parts) if p)


async def probe(target: Bucket) -> None:
    """Write and delete a small test object under the prefix; StoreRefused with the store's reason otherwise."""
    key = object_key(target, f"{PROBE_PREFIX}{uuid.uuid4().hex}")
    try:
        async with client(target) as s3:
            await s3.put_object(Bucket=target.bucket, Key=key, Body=b"space destination check\n", IfNoneMatch="*")
            await s3.delete_object(Bucket=target.bucket, Key=key)
    except (ClientError, BotoCoreError) as exc:
        raise refused(exc) from None


async def put_new(
    s3: S3Client, target: Bucket, key: str, pieces: AsyncIterator[bytes], *, media_type: str, sha256: str
) -> None:
    """Write `pieces` at `key` unless the key exists. `sha256` is what they must hash to (the ledger's digest of a
    result, or the digest of an archive member read before): it travels as the object's metadata from the start,
    and bytes that hash to anything else are never completed into an object."""
    digest = hashlib.sha256()
    buffer = io.BytesIO()
    upload_id: str | None = None
    parts: list[Any] = []
    meta = {"sha256": sha256}
    try:
        async for piece in pieces:
            digest.update(piece)
            buffer.write(piece)
            if buffer.tell() >= PART_BYTES:
                if upload_id is None:
                    started = await s3.create_multipart_upload(
                        Bucket=target.bucket, Key=key, ContentType=media_type, Metadata=meta
                    )
                    upload_id = started["UploadId"]
                parts.append(await _part(s3, target, key, upload_id, len(parts) + 1, buffer))
                buffer = io.BytesIO()
        if digest.hexdigest() != sha256:
            raise StoreRefused(f"{key}: the bytes read do not have the digest the manifest names", final=False)
        if upload_id is None:
            await s3.put_object(
                Bucket=target.bucket,
                Key=key,
                Body=buffer.getvalue(),
                ContentType=media_type,
                Metadata=meta,
                IfNoneMatch="*",
            )
            return
        if buffer.tell():
            parts.append(await _part(s3, target, key, upload_id, len(parts) + 1, buffer))
        await s3.complete_multipart_upload(
            Bucket=target.bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}, IfNoneMatch="*"
        )
        upload_id = None
    except ClientError as exc:
        if _status(exc) != 412:
            raise
        await _ours_already(s3, target, key, sha256)
    finally:
        if upload_id is not None:
            with contextlib.suppress(ClientError, BotoCoreError):
                await s3.abort_multipart_upload(Bucket=target.bucket, Key=key, UploadId=upload_id)


async def _part(s3: S3Client, target: Bucket, key: str, upload_id: str, number: int, buffer: io.BytesIO) -> Any:
    buffer.seek(0)
    done = await s3.upload_part(
        Bucket=target.bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=cast(Any, buffer)
    )
    return {"PartNumber": number, "ETag": done["ETag"]}


async def _ours_already(s3: S3Client, target: Bucket, key: str, sha: str) -> None:
    """A key that exists: fine when it is this very object (an earlier attempt wrote it), refused otherwise."""
    head = await s3.head_object(Bucket=target.bucket, Key=key)
    if head.get("Metadata", {}).get("sha256") != sha:
        raise StoreRefused(
            f"{key} exists already in the bucket and is not this delivery's; not overwritten", final=True
        )


def _status(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
