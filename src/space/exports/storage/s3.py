"""`ResultStore` on an S3-compatible object store (SPEC §15), through aiobotocore.

One object per execution, at `<prefix>/<org>/<export>/<execution>`. The worker streams it as a multipart upload
(parts of at least 5 MiB, the last smaller; a result smaller than one part is one PUT), which S3 shows only once
it is completed: an execution that fails, loses its lease or is killed never becomes a visible object, and its
unfinished upload is aborted (by the worker on failure, by `sweep` after a crash). Whether a completed object may
be served is still the ledger's call: the download opens only the published execution's key, and `sweep` deletes
every object whose execution the ledger does not hold as running or completed.

Endpoint and credentials come from botocore's standard variables (`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`,
`AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, or an instance profile); nothing of them is a Space setting.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import logging
import uuid
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, Final, cast

from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import BotoCoreError, ClientError
from sqlalchemy import func, select

from space.db import Database, Tenant, UnitOfWork
from space.exports.models import ExportJob, ExportState
from space.exports.storage.protocol import READ_PIECE_BYTES, ChunkSink, ResultKey, ResultMissing

if TYPE_CHECKING:
    from types_aiobotocore_s3 import S3Client
    from types_aiobotocore_s3.type_defs import CompletedPartTypeDef, CreateMultipartUploadRequestTypeDef

log = logging.getLogger("space.exports")

MIN_PART_BYTES = 5 * 1024 * 1024
"""S3's smallest part of a multipart upload (except the last)."""
PART_BYTES = 8 * 1024 * 1024
"""The chunk the worker cuts for this store (at least): each chunk is then one part, uploaded from the writer's
buffer while the other buffer fills, with no copy of its own."""
PRESIGN_SECONDS = 60
"""How long a download's presigned GET is valid (SPEC §15: at most 60 s)."""
DELETE_BATCH = 1000
"""Keys per DeleteObjects request (S3's maximum)."""
CHECKSUM: Final = "CRC32"
"""The checksum an upload is created with, so that S3 keeps one for each part (botocore's default, `when_supported`,
sends a CRC32 with every part and PUT, which S3 verifies on receipt) and one for the object, the CRC32 of the
parts'. Over HTTPS botocore then signs no payload (a SHA-256 of each part), and completing an upload needs no
pass over the whole object (a store that defaults to a whole-object CRC64NVME, moto for one, otherwise reads all
of it again while the export waits). A store that takes no trailing checksums (older MinIO or Ceph) is run with
botocore's own `AWS_REQUEST_CHECKSUM_CALCULATION=when_required`: then no checksum is sent or named."""
PROBE_KEY = "space-check"
"""What the start-up check writes and deletes under the prefix to prove the bucket is writable."""


class StoreUnavailable(Exception):
    """The bucket can't be reached, read or written; the message says which and why."""


@dataclass(frozen=True)
class S3Location:
    """`s3://bucket/prefix` split; the prefix has no leading or trailing slash."""

    bucket: str
    prefix: str

    @classmethod
    def parse(cls, url: str) -> S3Location:
        """From SPACE_RESULT_STORE (already validated by the settings' pattern)."""
        rest = url.removeprefix("s3://")
        bucket, _, prefix = rest.partition("/")
        return cls(bucket, prefix.strip("/"))

    def root(self, org_id: uuid.UUID | None = None) -> str:
        """The prefix of every object (of one org, when given), ending in a slash (or empty)."""
        parts = [p for p in (self.prefix, str(org_id) if org_id else "") if p]
        return "".join(f"{p}/" for p in parts)

    def key(self, key: ResultKey) -> str:
        """The object key of one execution: org, export, execution."""
        return f"{self.root(key.org_id)}{key.export_id}/{key.execution_id}"

    def result_key(self, object_key: str) -> ResultKey | None:
        """The execution an object key names, or None for a key Space did not write."""
        parts = object_key.removeprefix(self.root()).split("/")
        if len(parts) != 3:
            return None
        try:
            return ResultKey(*(uuid.UUID(p) for p in parts))
        except ValueError:
            return None


class _PartBody(io.RawIOBase):
    """A chunk's bytes as the file a request body is read from, a piece at a time, without copying the chunk (over
    plain HTTP botocore reads it to checksum and sign it and seeks back, and aiohttp sends it; over HTTPS botocore's
    aws-chunked wrapper reads it frame by frame). A retry seeks back to 0. The chunk is not reused until the upload
    has answered."""

    def __init__(self, data: bytes | memoryview) -> None:
        super().__init__()
        self._data = memoryview(data).cast("B")
        self._at = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._at

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        bases = {io.SEEK_SET: 0, io.SEEK_CUR: self._at, io.SEEK_END: len(self._data)}
        if whence not in bases or bases[whence] + offset < 0:
            raise ValueError(f"can't seek to {offset} from {whence}")
        self._at = bases[whence] + offset
        return self._at

    def read(self, size: int | None = -1) -> bytes:
        end = len(self._data) if size is None or size < 0 else self._at + size
        piece = bytes(self._data[self._at : end])
        self._at += len(piece)
        return piece

    def readinto(self, buffer: Any) -> int:
        target = memoryview(buffer).cast("B")
        piece = self._data[self._at : self._at + len(target)]
        target[: len(piece)] = piece
        self._at += len(piece)
        return len(piece)


class _S3Sink:
    """One execution's chunks as one multipart upload, begun only once a whole part is there: a chunk of at least
    a part's minimum is uploaded as it is, smaller ones are gathered (a copy) until they make one."""

    def __init__(self, client: S3Client, bucket: str, key: str) -> None:
        self._client = client
        self._bucket = bucket
        self._key = key
        self._buffer = io.BytesIO()
        self._upload_id: str | None = None
        self._parts: list[CompletedPartTypeDef] = []
        self._done = False

    async def write(self, seq: int, data: bytes | memoryview) -> None:
        """Upload a chunk as a part, or buffer it until at least 5 MiB are there (the chunk is reused after)."""
        if not self._buffer.tell() and len(data) >= MIN_PART_BYTES:
            await self._upload_part(_PartBody(data))
            return
        self._buffer.write(data)
        if self._buffer.tell() >= MIN_PART_BYTES:
            await self._upload_part(self._body())

    def _body(self) -> io.BytesIO:
        # A file, not bytes: aiohttp then sends it 64 KiB at a time. Given a bytearray it copied the whole part
        # twice (a slice to the declared length, then joined to the headers): 16 MiB more per 8 MiB part.
        body, self._buffer = self._buffer, io.BytesIO()
        body.seek(0)
        return body

    async def _upload_part(self, body: io.IOBase) -> None:
        if self._upload_id is None:
            request: CreateMultipartUploadRequestTypeDef = {"Bucket": self._bucket, "Key": self._key}
            if _sends_checksums(self._client):
                request["ChecksumAlgorithm"] = CHECKSUM
            started = await self._client.create_multipart_upload(**request)
            self._upload_id = started["UploadId"]
        number = len(self._parts) + 1
        part = await self._client.upload_part(
            Bucket=self._bucket,
            Key=self._key,
            UploadId=self._upload_id,
            PartNumber=number,
            Body=cast(IO[bytes], body),  # a file: the stubs name only typing's IO
        )
        done: CompletedPartTypeDef = {"PartNumber": number, "ETag": part["ETag"]}
        if "ChecksumCRC32" in part:  # none with when_required
            done["ChecksumCRC32"] = part["ChecksumCRC32"]
        self._parts.append(done)

    async def finish(self) -> None:
        """Make the object visible: complete the upload, or PUT a result smaller than one part."""
        if self._done:
            return
        if self._upload_id is None:
            await self._client.put_object(Bucket=self._bucket, Key=self._key, Body=self._body())
        else:
            if self._buffer.tell():
                await self._upload_part(self._body())
            await self._client.complete_multipart_upload(
                Bucket=self._bucket, Key=self._key, UploadId=self._upload_id, MultipartUpload={"Parts": self._parts}
            )
        # Only now: if completing failed, the failure path's abort still drops the upload.
        self._done = True
        self._buffer = io.BytesIO()

    async def abort(self) -> None:
        """Drop the upload: its parts are freed and no object appears."""
        if self._done:
            return
        self._done = True
        self._buffer = io.BytesIO()
        if self._upload_id is not None:
            await self._client.abort_multipart_upload(Bucket=self._bucket, Key=self._key, UploadId=self._upload_id)


class S3ResultStore:
    """`ResultStore` on one bucket and prefix; `redirect` makes downloads 303 to a presigned GET."""

    def __init__(self, db: Database, location: S3Location, *, redirect: bool = True) -> None:
        self._db = db
        self.location = location
        self.redirect = redirect
        self._exits = contextlib.AsyncExitStack()
        self._client: S3Client | None = None

    async def client(self) -> S3Client:
        """The store's one client (connection pool), made on first use in the running event loop."""
        if self._client is None:
            self._client = await self._exits.enter_async_context(_new_client())
        return self._client

    async def aclose(self) -> None:
        """Close the client's connections."""
        self._client = None
        await self._exits.aclose()

    @property
    def _bucket(self) -> str:
        return self.location.bucket

    def chunk_bytes(self, configured: int) -> int:
        """At least a part (PART_BYTES): each chunk is uploaded as it is."""
        return max(configured, PART_BYTES)

    async def write(self, key: ResultKey, seq: int, data: bytes | memoryview) -> None:
        """Store a one-chunk result (an object per execution: only seq 0 is meaningful here)."""
        if seq != 0:
            raise ValueError("the S3 store writes multi-chunk results through sink()")
        await (await self.client()).put_object(Bucket=self._bucket, Key=self.location.key(key), Body=bytes(data))

    @contextlib.asynccontextmanager
    async def sink(self, key: ResultKey) -> AsyncIterator[ChunkSink]:
        """A multipart upload of one execution: completed when the block ends normally, aborted otherwise."""
        sink = _S3Sink(await self.client(), self._bucket, self.location.key(key))
        try:
            yield sink
        except BaseException:
            with contextlib.suppress(Exception):
                await sink.abort()
            raise
        await sink.finish()

    async def delete(self, key: ResultKey) -> int:
        """Delete an execution's object (1: S3 does not say whether it existed)."""
        await (await self.client()).delete_object(Bucket=self._bucket, Key=self.location.key(key))
        return 1

    async def read(self, key: ResultKey, start: int = 0, end: int | None = None) -> AsyncIterator[bytes]:
        """Bytes `start` to `end` of the execution's object, one ranged GET, handed on in pieces as they arrive."""
        if end is not None and end <= start:
            return
        byte_range = f"bytes={start}-{'' if end is None else end - 1}"
        client = await self.client()
        try:
            got = await client.get_object(Bucket=self._bucket, Key=self.location.key(key), Range=byte_range)
        except ClientError as exc:
            if _code(exc) in {"NoSuchKey", "404", "InvalidRange", "416"}:
                raise ResultMissing(f"export {key.export_id} has no stored object") from None
            raise
        body = got["Body"]
        try:
            # aiohttp reads from the socket only as pieces are taken: a stalled client stops the transfer.
            async for piece in body.iter_chunks(READ_PIECE_BYTES):
                yield piece
        finally:
            body.close()

    async def presign(self, key: ResultKey, *, filename: str, media_type: str, seconds: int = PRESIGN_SECONDS) -> str:
        """A GET of the execution's object valid `seconds`, whose response carries the download's headers."""
        client = await self.client()
        url: str = await client.generate_presigned_url(
            "get_object",
            Params={
                "Bucket": self._bucket,
                "Key": self.location.key(key),
                "ResponseContentDisposition": f'attachment; filename="{filename}"',
                "ResponseContentType": media_type,
                "ResponseCacheControl": "private, no-store",
            },
            ExpiresIn=min(seconds, PRESIGN_SECONDS),
        )
        return url

    async def delete_org(self, org_id: uuid.UUID) -> int:
        """Delete every object of the org, and abort its unfinished uploads (the purge: by the org's prefix)."""
        root = self.location.root(org_id)
        deleted = 0
        async for keys in self._object_pages(root):
            deleted += await self._delete_keys(keys)
        async for uploads in self._upload_pages(root):
            for object_key, upload_id, _ in uploads:
                await self._abort(object_key, upload_id)
        return deleted

    async def sweep(self, limit: int = 500) -> dict[str, int]:
        """The cleanup's part: delete objects of executions the ledger does not hold as running or completed (not
        purged or deleted), and abort uploads of executions that are not running under a live lease."""
        root = self.location.root()
        orphans: list[str] = []
        async for keys in self._object_pages(root):
            named = {k: self.location.result_key(k) for k in keys}
            live = await self._live(r for r in named.values() if r is not None)
            orphans += [k for k, r in named.items() if r is not None and r not in live]
            if len(orphans) >= limit:
                break
        deleted = await self._delete_keys(orphans[:limit])
        aborted = 0
        async for uploads in self._upload_pages(root):
            named_uploads = [(k, u, self.location.result_key(k)) for k, u, _ in uploads]
            uploading = await self._live((r for _, _, r in named_uploads if r is not None), uploading=True)
            for object_key, upload_id, result_key in named_uploads:
                if result_key is not None and result_key not in uploading and aborted < limit:
                    await self._abort(object_key, upload_id)
                    aborted += 1
        return {"orphan_objects": deleted, "aborted_uploads": aborted}

    # --- listing ---------------------------------------------------------------------------------------------

    async def _object_pages(self, root: str) -> AsyncIterator[list[str]]:
        paginator = (await self.client()).get_paginator("list_objects_v2")
        async for page in paginator.paginate(Bucket=self._bucket, Prefix=root):
            yield [o["Key"] for o in page.get("Contents", [])]

    async def _upload_pages(self, root: str) -> AsyncIterator[list[tuple[str, str, dt.datetime | None]]]:
        paginator = (await self.client()).get_paginator("list_multipart_uploads")
        async for page in paginator.paginate(Bucket=self._bucket, Prefix=root):
            yield [(u["Key"], u["UploadId"], u.get("Initiated")) for u in page.get("Uploads", [])]

    async def _delete_keys(self, keys: list[str]) -> int:
        client = await self.client()
        deleted = 0
        for i in range(0, len(keys), DELETE_BATCH):
            batch = keys[i : i + DELETE_BATCH]
            await client.delete_objects(
                Bucket=self._bucket, Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True}
            )
            deleted += len(batch)
        return deleted

    async def _abort(self, object_key: str, upload_id: str) -> None:
        client = await self.client()
        with contextlib.suppress(ClientError):  # finished or aborted meanwhile
            await client.abort_multipart_upload(Bucket=self._bucket, Key=object_key, UploadId=upload_id)

    async def _live(self, keys: Iterable[ResultKey], *, uploading: bool = False) -> set[ResultKey]:
        """Which of these executions the ledger holds: running or completed and kept (objects), or running under
        a live lease (uploads). Asked per org under its own RLS context: no cross-org read is needed."""
        by_org: dict[uuid.UUID, list[ResultKey]] = {}
        for key in keys:
            by_org.setdefault(key.org_id, []).append(key)
        live: set[ResultKey] = set()
        for org_id, org_keys in by_org.items():
            conditions = [
                ExportJob.org_id == org_id,
                ExportJob.id.in_({k.export_id for k in org_keys}),
                ExportJob.deleted_at.is_(None),
            ]
            if uploading:
                conditions += [
                    ExportJob.state == ExportState.running.value,
                    ExportJob.lease_expires_at > func.clock_timestamp(),
                ]
            else:
                conditions += [
                    ExportJob.state.in_([ExportState.running.value, ExportState.completed.value]),
                    ExportJob.purged_at.is_(None),
                ]
            async with UnitOfWork(self._db.sessionmaker, Tenant(org_id=org_id)) as uow:
                rows = await uow.session.execute(select(ExportJob.id, ExportJob.execution_id).where(*conditions))
                held = {(export_id, execution_id) for export_id, execution_id in rows}
            live.update(k for k in org_keys if (k.export_id, k.execution_id) in held)
        return live


def _sends_checksums(client: S3Client) -> bool:
    """Whether botocore's configuration (`AWS_REQUEST_CHECKSUM_CALCULATION`, default `when_supported`) has the client
    send a checksum with every upload. (The stubs don't know the attribute yet.)"""
    return getattr(client.meta.config, "request_checksum_calculation", None) == "when_supported"


def _new_client() -> contextlib.AbstractAsyncContextManager[S3Client]:
    # Standard retries; a pool large enough for many downloads streaming through the API at once.
    # SigV4 for presigned URLs too (botocore may otherwise presign with the legacy SigV2 that newer regions refuse).
    # Request checksums as botocore's configuration says (its default sends a CRC32 with every upload; see
    # CHECKSUM); responses are not read twice to check one (a download's bytes are the export's sha256).
    config = AioConfig(
        retries={"mode": "standard"},
        max_pool_connections=64,
        signature_version="s3v4",
        response_checksum_validation="when_required",
    )
    return get_session().create_client("s3", config=config)


async def check_bucket(location: S3Location) -> str:
    """Prove the bucket is reachable and writable (write and delete a probe object under the prefix); say where it
    is, or raise StoreUnavailable naming the bucket, the endpoint and the reason."""
    where = f"s3://{location.bucket}/{location.prefix}".rstrip("/")
    probe = f"{location.root()}{PROBE_KEY}"
    try:
        async with _new_client() as client:
            endpoint = client.meta.endpoint_url
            try:
                await client.head_bucket(Bucket=location.bucket)
            except (ClientError, BotoCoreError) as exc:
                raise StoreUnavailable(f"bucket {where} at {endpoint} can't be reached: {_reason(exc)}") from None
            try:
                await client.put_object(Bucket=location.bucket, Key=probe, Body=b"ok")
                await client.delete_object(Bucket=location.bucket, Key=probe)
            except (ClientError, BotoCoreError) as exc:
                raise StoreUnavailable(f"bucket {where} at {endpoint} is not writable: {_reason(exc)}") from None
    except BotoCoreError as exc:  # no region, no credentials: the client itself can't be made
        raise StoreUnavailable(f"bucket {where}: {_reason(exc)}") from None
    return f"{where} at {endpoint}: reachable, writable"


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        return f"{error.get('Code', '?')} {error.get('Message', '')}".strip()
    return str(exc) or type(exc).__name__
