"""SAQ entry points of exports. The worker's startup puts `settings`, `db` and `store` into ctx (space.worker)."""

from __future__ import annotations

import uuid
from typing import Any

from space.exports.maintenance import cleanup, reconcile
from space.exports.pipeline import ExportRunner, run_export


async def run_export_job(ctx: Any, *, export_id: str, org_id: str) -> str:
    """SAQ job: run one export."""
    runner = ExportRunner(ctx["settings"], ctx["db"], ctx["store"], job=ctx.get("job"))
    return await run_export(runner, uuid.UUID(export_id), uuid.UUID(org_id))


async def reconcile_exports_job(ctx: Any) -> dict[str, int]:
    """SAQ cron: the reconciler."""
    return await reconcile(ctx["settings"], ctx["db"], ctx["worker"].queue)


async def cleanup_exports_job(ctx: Any) -> dict[str, int]:
    """SAQ cron: the cleanup."""
    return await cleanup(ctx["db"], ctx["store"])
