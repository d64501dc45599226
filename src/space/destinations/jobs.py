"""SAQ entry points of destinations: one attempt of a delivery, and the sweeper for lost or stalled ones. Both run
in the outbound lane (`space.worker`): `ctx["worker"].queue` is the outbound queue, where retries go."""

from __future__ import annotations

import uuid
from typing import Any

from space.destinations.outbox import DELIVERIES
from space.destinations.sealing import Sealer, load_sealer
from space.outbox import deferring

SWEEP_LIMIT = 200


async def _sealer(ctx: Any) -> Sealer:
    # Read once per worker process (the keys only change with a restart, as the API's link signer).
    sealer: Sealer | None = ctx.get("sealer")
    if sealer is None:
        sealer = ctx["sealer"] = await load_sealer(ctx["settings"], ctx["db"].engine)
    return sealer


@deferring
async def deliver_export_job(ctx: Any, *, delivery_id: str, org_id: str) -> str:
    """SAQ job: make a delivery's next attempt (and schedule the one after, if it failed and may be retried)."""
    # Here, not at the top: the store client (aiobotocore, httpx) is loaded once a delivery runs.
    from space.destinations.delivery import deliver

    worker = ctx.get("worker")
    queue = worker.queue if worker is not None else None
    return await deliver(
        ctx["settings"], ctx["db"], ctx["store"], await _sealer(ctx), queue, uuid.UUID(delivery_id), uuid.UUID(org_id)
    )


async def sweep_deliveries_job(ctx: Any) -> dict[str, int]:
    """SAQ cron: enqueue deliveries whose entry was lost (overdue) or whose worker died (lease ran out)."""
    return {"enqueued": await DELIVERIES.sweep(ctx["db"], ctx["worker"].queue, SWEEP_LIMIT)}
