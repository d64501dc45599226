"""Run Alembic programmatically, as the owner, from the migrations shipped inside the package."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory

from space.db.engine import sync_url


def migrations_dir() -> Path:
    """The folder of the installed package `space.migrations` (the top-level migrations/ of a checkout).

    Located through the import system, not relative to this file: pyproject maps the package to
    migrations/, so an editable install and a wheel both resolve it.
    """
    location = files("space.migrations")
    if not isinstance(location, Path):  # e.g. a zipped install: Alembic needs a real folder
        raise RuntimeError(f"space.migrations is not a folder on disk: {location}")
    return location


def scripts() -> ScriptDirectory:
    """The migration scripts this release ships (their heads are what `space migrate` reaches)."""
    return ScriptDirectory(str(migrations_dir()))


def alembic_config(owner_url: str) -> Config:
    """An Alembic Config pointing at the package space.migrations and the given owner URL."""
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    cfg.set_main_option("sqlalchemy.url", sync_url(owner_url).replace("%", "%%"))
    return cfg


def upgrade(owner_url: str, revision: str = "head") -> None:
    """Migrate up to `revision`."""
    command.upgrade(alembic_config(owner_url), revision)


def downgrade(owner_url: str, revision: str = "base") -> None:
    """Migrate down to `revision`."""
    command.downgrade(alembic_config(owner_url), revision)
