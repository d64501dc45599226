"""Alembic environment: migrations run as the owner role, on a synchronous psycopg connection."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool

config = context.config


def run_migrations_online() -> None:
    """Run every pending revision in one transaction per revision."""
    url = config.get_main_option("sqlalchemy.url")
    assert url, "space.migrate sets sqlalchemy.url"
    engine = create_engine(url, poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(connection=connection, transaction_per_migration=True)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


run_migrations_online()
