"""Destinations: create (after the address check and a test write), list, show, delete; and the deliveries owed
to them, by hand (`request_delivery`) or after a scheduled run's publish (`owe_after_publish`, a channel of the
outcome door, `space.exports.outcomes`).

A delivery row is written in the caller's transaction and its first attempt enqueued after the commit, as every
outbox channel's (`space.outbox`); a lost enqueue is found again by the sweeper (`jobs.sweep_deliveries_job`).
"""

from __future__ import annotations

import uuid

from saq import Queue
from sqlalchemy import and_, delete, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from space.db import UnitOfWork
from space.destinations.models import OUTBOX_TO_DELIVERY, Destination, DestinationDelivery
from space.destinations.outbox import DELIVERIES
from space.destinations.schemas import Delivery, DestinationCreate, DestinationOut
from space.destinations.sealing import Sealer
from space.errors import DestinationInUse, DestinationUnreachable, NotFound
from space.exports.models import ExportJob
from space.orgs import service as orgs
from space.schedules.models import Schedule
from space.webhooks import guard


def _out(d: Destination) -> DestinationOut:
    return DestinationOut(
        id=d.id,
        type="s3",
        bucket=d.bucket,
        prefix=d.prefix,
        region=d.region,
        endpoint_url=d.endpoint_url,
        created_at=d.created_at,
        last_delivery_at=d.last_delivery_at,
        last_error=d.last_error,
    )


async def create_destination(
    session: AsyncSession,
    org_id: uuid.UUID,
    actor_id: uuid.UUID,
    data: DestinationCreate,
    sealer: Sealer,
    *,
    allow_private: bool,
) -> DestinationOut:
    """Check the endpoint's address, write and delete a test object, then, under the org lock and the caller's
    role, store the destination with its secret sealed."""
    # Both before the lock: neither a slow resolver nor a slow store may hold the org's lock.
    if data.endpoint_url is not None:
        await guard.resolve(data.endpoint_url, allow_private=allow_private)
    # Here, not at the top: the worker imports this module (the outcome door), and its lane loads the store
    # client only once a delivery runs.
    from space.destinations import s3

    target = s3.Bucket(
        data.bucket, data.prefix.strip("/"), data.region, data.endpoint_url, data.access_key_id, data.secret_access_key
    )
    try:
        await s3.probe(target)
    except s3.StoreRefused as exc:
        raise DestinationUnreachable(f"The test write to bucket {data.bucket} failed: {exc.reason}") from None
    await orgs.lock_org(session, org_id)
    await orgs.authority(session, org_id, actor_id, orgs.MANAGERS)
    destination_id = uuid.uuid4()
    destination = Destination(
        org_id=org_id,
        id=destination_id,
        type=data.type,
        bucket=data.bucket,
        prefix=target.prefix,
        region=data.region,
        endpoint_url=data.endpoint_url,
        access_key_id=data.access_key_id,
        secret_sealed=sealer.seal(data.secret_access_key, org_id, destination_id),
        created_by=actor_id,
    )
    session.add(destination)
    await session.flush()
    await session.refresh(destination)
    return _out(destination)


async def _find(session: AsyncSession, org_id: uuid.UUID, destination_id: uuid.UUID) -> Destination:
    found = await session.scalar(
        select(Destination).where(Destination.org_id == org_id, Destination.id == destination_id)
    )
    if found is None:
        raise NotFound()
    return found


async def list_destinations(session: AsyncSession, org_id: uuid.UUID) -> list[DestinationOut]:
    """The org's destinations, oldest first, without secrets."""
    rows = await session.scalars(
        select(Destination).where(Destination.org_id == org_id).order_by(Destination.created_at, Destination.id)
    )
    return [_out(d) for d in rows]


async def get_destination(session: AsyncSession, org_id: uuid.UUID, destination_id: uuid.UUID) -> DestinationOut:
    """One destination; 404 when unknown (or another org's)."""
    return _out(await _find(session, org_id, destination_id))


async def schedules_naming(session: AsyncSession, org_id: uuid.UUID, destination_id: uuid.UUID) -> int:
    """How many of the org's schedules deliver to the destination (DELETE answers 409 `destination_in_use`)."""
    count = await session.scalar(
        select(func.count())
        .select_from(Schedule)
        .where(Schedule.org_id == org_id, Schedule.destination_id == destination_id)
    )
    return count or 0


async def delete_destination(
    session: AsyncSession, org_id: uuid.UUID, actor_id: uuid.UUID, destination_id: uuid.UUID
) -> None:
    """Remove a destination (its deliveries stay, as history); 404 when unknown, 409 while a schedule names it."""
    await orgs.lock_org(session, org_id)
    await orgs.authority(session, org_id, actor_id, orgs.MANAGERS)
    await _find(session, org_id, destination_id)
    # Under the org lock, which a schedule's change of destination takes too: no schedule can name it meanwhile.
    if (await schedules_naming(session, org_id, destination_id)) > 0:
        raise DestinationInUse("A schedule delivers to this destination; change or delete the schedule first.")
    await session.execute(delete(Destination).where(Destination.org_id == org_id, Destination.id == destination_id))


async def owe(
    uow: UnitOfWork,
    queue: Queue | None,
    org_id: uuid.UUID,
    export_id: uuid.UUID,
    destination_id: uuid.UUID,
    *,
    schedule_id: uuid.UUID | None = None,
    created_by: uuid.UUID | None = None,
) -> Delivery:
    """Owe the export to the destination in the caller's transaction; its first attempt is enqueued after commit."""
    row = DestinationDelivery(
        org_id=org_id,
        id=uuid.uuid4(),
        export_id=export_id,
        destination_id=destination_id,
        schedule_id=schedule_id,
        created_by=created_by,
    )
    await DELIVERIES.owe(uow, queue, [row])
    return Delivery(
        destination_id=destination_id, state=OUTBOX_TO_DELIVERY["pending"], delivered_at=None, error_code=None
    )


async def scheduled_destination(
    session: AsyncSession, org_id: uuid.UUID, export_id: uuid.UUID
) -> tuple[uuid.UUID, uuid.UUID] | None:
    """The (schedule id, destination id) a scheduled run is delivered to, or None."""
    row = (
        await session.execute(
            select(Schedule.id, Schedule.destination_id)
            .join(ExportJob, and_(ExportJob.org_id == Schedule.org_id, ExportJob.schedule_id == Schedule.id))
            .where(ExportJob.org_id == org_id, ExportJob.id == export_id, Schedule.destination_id.is_not(None))
        )
    ).first()
    if row is None or row[1] is None:
        return None
    return row[0], row[1]


async def exists_in(session: AsyncSession, org_id: uuid.UUID, destination_id: uuid.UUID) -> bool:
    """Whether the org has this destination (a schedule may name only its own org's)."""
    found = await session.scalar(
        select(Destination.id).where(Destination.org_id == org_id, Destination.id == destination_id)
    )
    return found is not None


async def owe_after_publish(uow: UnitOfWork, queue: Queue | None, org_id: uuid.UUID, export_id: uuid.UUID) -> None:
    """In the transaction that publishes an export: owe it to its schedule's destination, if it has one."""
    named = await scheduled_destination(uow.session, org_id, export_id)
    if named is None:
        return
    schedule_id, destination_id = named
    await owe(uow, queue, org_id, export_id, destination_id, schedule_id=schedule_id)


async def deliveries_of(
    session: AsyncSession, org_id: uuid.UUID, export_ids: list[uuid.UUID]
) -> dict[uuid.UUID, Delivery]:
    """The latest delivery of each of these exports (an export with none is absent)."""
    if not export_ids:
        return {}
    rows = await session.scalars(
        select(DestinationDelivery)
        .where(DestinationDelivery.org_id == org_id, DestinationDelivery.export_id.in_(export_ids))
        .order_by(DestinationDelivery.created_at.desc(), DestinationDelivery.id)
    )
    latest: dict[uuid.UUID, Delivery] = {}
    # An export has a delivery or a few (one per request): the newest of each is kept.
    for r in rows:
        latest.setdefault(
            r.export_id,
            Delivery(
                destination_id=r.destination_id,
                state=OUTBOX_TO_DELIVERY[r.state],
                delivered_at=r.delivered_at,
                error_code=r.error_code,
            ),
        )
    return latest
