"""SAQ entry point of imports, in the export worker lane (its ctx: `settings`, `db`, `outbound_queue`)."""

from __future__ import annotations

import uuid
from typing import Any

from space.imports.running import run_import
from space.imports.service import reconcile


async def run_import_job(ctx: Any, *, import_id: str, user_id: str) -> str:
    """SAQ job: restore one uploaded archive (space.imports.running)."""
    return await run_import(
        ctx["settings"], ctx["db"], ctx.get("outbound_queue"), uuid.UUID(import_id), uuid.UUID(user_id)
    )


async def reconcile_imports_job(ctx: Any) -> int:
    """SAQ cron: imports whose queue entry was lost are enqueued again."""
    return await reconcile(ctx["db"], ctx["settings"], ctx["worker"].queue)
