"""Run Alembic programmatically, as the owner, from the migrations shipped inside the package."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

from space.db.engine import sync_url

MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"


def alembic_config(owner_url: str) -> Config:
    """An Alembic Config pointing at space/migrations and the given owner URL."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", sync_url(owner_url).replace("%", "%%"))
    return cfg


def upgrade(owner_url: str, revision: str = "head") -> None:
    """Migrate up to `revision`."""
    command.upgrade(alembic_config(owner_url), revision)


def downgrade(owner_url: str, revision: str = "base") -> None:
    """Migrate down to `revision`."""
    command.downgrade(alembic_config(owner_url), revision)
