"""Fixtures of the destination tests: the customer's store (a second moto server behind a proxy), and settings
and an app that let destinations name this machine's store."""

from collections.abc import AsyncIterator

import pytest

from space.config import Settings
from tests.destinations.customer_store import customer_store  # noqa: F401 (the session's customer store)
from tests.exports.fixtures import tuned
from tests.exports.limits_fixtures import tuned_api
from tests.helpers import Api, UserFactory


@pytest.fixture(scope="module")
def local(settings: Settings) -> Settings:
    """Settings that let destinations name this machine's store, and retry at once."""
    return tuned(settings, webhook_allow_private=True, delivery_retry_seconds=0, worker_concurrency=2)


@pytest.fixture
async def api_local(local: Settings, users: UserFactory) -> AsyncIterator[Api]:
    """The real app built with `local`."""
    async with tuned_api(local, users, webhook_allow_private=True, delivery_retry_seconds=0) as api:
        yield api
