"""A completed export delivered by hand (`POST .../exports/{exportId}/deliveries {destinationId}`): a use case of
exports and destinations both, so it lives here, beside neither's primitive service.

A delivery puts the export's content where the caller chose, so it is authorized exactly as a download of it
(SPEC §6's order and codes, `exports.service.open_result`: the caller's own export, still a member whose role
holds it, the org not being deleted, the result completed and kept), and the caller must also be an owner or
admin, who alone manage destinations.
"""

from __future__ import annotations

import uuid

from saq import Queue

from space.db import UnitOfWork
from space.destinations import service
from space.destinations.schemas import Delivery
from space.exports import service as exports
from space.exports.storage.protocol import ResultStore
from space.orgs.models import Membership, Organization


async def request_delivery(
    uow: UnitOfWork,
    queue: Queue | None,
    org: Organization,
    user_id: uuid.UUID,
    membership: Membership | None,
    store: ResultStore,
    export_id: uuid.UUID,
    destination_id: uuid.UUID,
) -> Delivery:
    """Owe the caller's completed export to one of the org's destinations; 404 for an unknown one."""
    await exports.open_result(uow.session, org, user_id, membership, export_id, store)
    await service.get_destination(uow.session, org.id, destination_id)
    return await service.owe(uow, queue, org.id, export_id, destination_id, created_by=user_id)
