"""One attempt of one delivery, top to bottom: claim -> check the address -> copy every file -> write the manifest
last -> record -> schedule the next attempt.

No transaction is open while bytes are in flight. Each attempt is fenced by the delivery's attempt count (the
outbox's claim and settle). Keys are `<prefix>/<orgId>/<scheduleId or "manual">/<snapshotAt as
YYYYMMDDTHHMMSSZ>-<exportId>/<file>`: the export id makes them unique, so no run ever writes where another did,
and each object is written only if its key is free (`s3.put_new`). `manifest.json` goes last: its presence is the
commit point a customer's loader waits for. A store's 4xx fails the delivery at once; a 5xx, a timeout or a broken
connection is retried with backoff. Nothing here changes the export itself.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import msgspec
from saq import Queue
from sqlalchemy import func, select, update

from space.config import Settings
from space.db import Database, Tenant, UnitOfWork
from space.destinations import s3
from space.destinations.files import Delivered, files_of
from space.destinations.models import Destination, DestinationDelivery
from space.destinations.outbox import DELIVERIES
from space.destinations.sealing import Sealer, SealError
from space.errors import InvalidRequest
from space.exports.formats.base import rfc3339
from space.exports.models import ExportJob, ExportState
from space.exports.storage.protocol import ResultMissing, ResultStore
from space.orgs import service as orgs
from space.schedules import runs as schedule_runs
from space.webhooks import guard

FAILED = "destination_failed"
"""The delivery's `errorCode` when the store refused it, or stopped answering for every attempt."""
EXPORT_GONE = "export_expired"
"""The export's result was removed (expired, purged, revoked) before it could be copied."""
REMOVED = "destination_removed"


@dataclass(frozen=True)
class Claimed:
    """An attempt this worker now owns: which try, of which export, to where."""

    delivery_id: uuid.UUID
    org_id: uuid.UUID
    attempt: int
    export: ExportJob | None
    """None: gone, or no longer a completed result that can be read."""
    org_name: str
    target: s3.Bucket | None
    """None: the destination was removed, or its secret no longer opens."""
    folder: str
    """`scheduleId` or `manual`."""


@dataclass(frozen=True)
class Outcome:
    """How the attempt ended. `final` ends the delivery whatever the attempt."""

    ok: bool
    error_code: str | None = None
    reason: str | None = None
    final: bool = False


async def deliver(
    settings: Settings,
    db: Database,
    store: ResultStore,
    sealer: Sealer,
    queue: Queue | None,
    delivery_id: uuid.UUID,
    org_id: uuid.UUID,
) -> str:
    """Make the delivery's next attempt; returns delivered, retrying, failed or not_claimed. Raises OrgBusy, having
    changed nothing, while the org has `outbound_org_concurrency` attempts in flight."""
    claimed = await claim(db, sealer, delivery_id, org_id, org_concurrency=settings.outbound_org_concurrency)
    if claimed is None:
        return "not_claimed"
    outcome = await attempt(claimed, store, allow_private=settings.webhook_allow_private)
    return await record(settings, db, queue, claimed, outcome)


async def claim(
    db: Database, sealer: Sealer, delivery_id: uuid.UUID, org_id: uuid.UUID, *, org_concurrency: int
) -> Claimed | None:
    """Take the next attempt (`DELIVERIES.claim`) and read what it needs: the export, the org's name, the bucket."""
    async with UnitOfWork(db.sessionmaker, Tenant(org_id=org_id)) as uow:
        session = uow.session
        row = await DELIVERIES.claim(
            session,
            delivery_id,
            org_id,
            DestinationDelivery.export_id,
            DestinationDelivery.destination_id,
            DestinationDelivery.schedule_id,
            org_concurrency=org_concurrency,
        )
        if row is None:
            return None
        attempts, export_id, destination_id, schedule_id = row
        export = await session.scalar(
            select(ExportJob).where(
                ExportJob.org_id == org_id,
                ExportJob.id == export_id,
                ExportJob.state == ExportState.completed.value,
                ExportJob.deleted_at.is_(None),
                ExportJob.purged_at.is_(None),
                ExportJob.expires_at > func.now(),
            )
        )
        destination = None
        if destination_id is not None:
            destination = await session.scalar(
                select(Destination).where(Destination.org_id == org_id, Destination.id == destination_id)
            )
        org_name = await orgs.org_name(session, org_id)
        if export is not None:
            session.expunge(export)
    target = None
    if destination is not None:
        try:
            secret = sealer.open(destination.secret_sealed, org_id, destination.id)
        except SealError:
            secret = None
        if secret is not None:
            target = s3.Bucket(
                destination.bucket,
                destination.prefix,
                destination.region,
                destination.endpoint_url,
                destination.access_key_id,
                secret,
            )
    folder = str(schedule_id) if schedule_id is not None else "manual"
    return Claimed(delivery_id, org_id, attempts, export, org_name, target, folder)


def stamp(at: dt.datetime) -> str:
    """`snapshotAt` as the key's `YYYYMMDDTHHMMSSZ` (UTC)."""
    return at.astimezone(dt.UTC).strftime("%Y%m%dT%H%M%SZ")


async def attempt(claimed: Claimed, store: ResultStore, *, allow_private: bool) -> Outcome:
    """Copy every file of the export under its folder, then its manifest."""
    if claimed.target is None:
        return Outcome(False, REMOVED, "the destination was removed, or its secret can't be opened", final=True)
    export = claimed.export
    if export is None or export.snapshot_at is None:
        return Outcome(False, EXPORT_GONE, "the export's result is no longer there to deliver", final=True)
    target = claimed.target
    if target.endpoint_url is not None:
        try:
            await guard.resolve(target.endpoint_url, allow_private=allow_private)
        except InvalidRequest as exc:
            return Outcome(False, FAILED, f"refused: {exc.detail}", final=True)
    folder = s3.object_key(target, str(claimed.org_id), claimed.folder, f"{stamp(export.snapshot_at)}-{export.id}")
    try:
        async with s3.client(target) as client, files_of(export, store) as files:
            written: list[Delivered] = []
            for f in files:
                await s3.put_new(
                    client, target, f"{folder}/{f.name}", f.pieces(), media_type=f.media_type, sha256=f.sha256
                )
                written.append(f.delivered)
            body = manifest(claimed, export, written)
            await s3.put_new(
                client,
                target,
                f"{folder}/manifest.json",
                _once(body),
                media_type="application/json",
                sha256=hashlib.sha256(body).hexdigest(),
            )
    except s3.StoreRefused as exc:
        return Outcome(False, FAILED, exc.reason, final=exc.final)
    except ResultMissing:
        return Outcome(False, EXPORT_GONE, "the export's result is no longer there to deliver", final=True)
    except Exception as exc:  # botocore's, aiohttp's, a timeout: the store's moment or its answer
        refused = s3.refused(exc)
        return Outcome(False, FAILED, refused.reason, final=refused.final)
    return Outcome(True)


def manifest(claimed: Claimed, export: ExportJob, files: list[Delivered]) -> bytes:
    """SPEC §13's manifest of what was delivered (each file's name, bytes, sha256, rows, media type), with `since`
    for an incremental run."""
    assert export.snapshot_at is not None
    listed = [
        {
            "name": f.name,
            "bytes": f.size,
            "sha256": f.sha256,
            **({"rows": f.rows} if f.rows is not None else {}),
            "mediaType": f.media_type,
        }
        for f in files
    ]
    document: dict[str, object] = {
        "schemaVersion": 1,
        "organizationId": str(claimed.org_id),
        "organizationName": claimed.org_name,
        "snapshotAt": rfc3339(export.snapshot_at),
        "files": listed,
    }
    if export.since is not None:
        document["since"] = rfc3339(export.since)
    return msgspec.json.format(msgspec.json.encode(document), indent=2) + b"\n"


async def _once(body: bytes) -> AsyncIterator[bytes]:
    yield body


async def record(settings: Settings, db: Database, queue: Queue | None, claimed: Claimed, outcome: Outcome) -> str:
    """Move the delivery on (delivered, failed, or pending until its backoff), fenced by the attempt, and say on the
    destination when it last delivered or what last went wrong."""
    async with UnitOfWork(db.sessionmaker, Tenant(org_id=claimed.org_id)) as uow:
        session = uow.session
        settled = await DELIVERIES.settle(
            session,
            claimed.delivery_id,
            claimed.org_id,
            claimed.attempt,
            ok=outcome.ok,
            final=outcome.final,
            retry_base=settings.delivery_retry_seconds,
            columns=(DestinationDelivery.destination_id, DestinationDelivery.schedule_id),
        )
        if settled is None:
            return "not_claimed"
        this = (DestinationDelivery.org_id == claimed.org_id, DestinationDelivery.id == claimed.delivery_id)
        now = (await session.execute(select(func.now()))).scalar_one()
        if outcome.ok:
            values: dict[str, object] = {"delivered_at": now, "error_code": None, "last_error": None}
            on_destination: dict[str, object] = {"last_delivery_at": now, "last_error": None}
        else:
            values = {"last_error": outcome.reason}
            if not settled.retrying:
                values["error_code"] = outcome.error_code
            on_destination = {"last_error": outcome.reason}
        await session.execute(update(DestinationDelivery).where(*this).values(**values))
        destination_id = settled.row.destination_id
        if destination_id is not None:
            await session.execute(
                update(Destination)
                .where(Destination.org_id == claimed.org_id, Destination.id == destination_id)
                .values(**on_destination)
            )
        if settled.result == "failed":
            await on_failed(uow, queue, claimed, settled.row.schedule_id, outcome)
    if settled.retrying and queue is not None:
        await DELIVERIES.enqueue(
            queue, claimed.delivery_id, claimed.org_id, attempt=claimed.attempt + 1, delay=settled.delay
        )
    return settled.result


async def on_failed(
    uow: UnitOfWork, queue: Queue | None, claimed: Claimed, schedule_id: uuid.UUID | None, outcome: Outcome
) -> None:
    """A delivery failed for good, in the transaction that records it: a scheduled run's pauses its schedule
    (`destination_failed`, told to its creator and the owners, SPEC §22, §19). A manual delivery's failure shows
    on the export's `delivery` and on the destination's `lastError`."""
    if schedule_id is not None:
        await schedule_runs.delivery_failed(uow, queue, claimed.org_id, schedule_id, outcome.error_code)
