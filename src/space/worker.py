"""SAQ queue and worker settings; registers every job and cron entry. (Filled in by the Exports issue.)"""

from __future__ import annotations

from space.config import Settings


async def run_worker(settings: Settings) -> None:
    """Run a worker until cancelled. `settings.database_url` is set."""
    raise NotImplementedError
