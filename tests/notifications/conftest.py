"""Fixtures of the notification modules that email: each module's own SMTP server (aiosmtpd), settings that
send through it, and the real app built with them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from litestar.testing import AsyncTestClient

from space.app import create_app
from space.config import Settings
from tests.exports.fixtures import tuned
from tests.helpers import Api, UserFactory
from tests.notifications.smtp_server import PUBLIC, SmtpServer, smtp_server


@pytest.fixture(scope="module")
def smtp() -> Iterator[SmtpServer]:
    """This module's SMTP server."""
    with smtp_server() as server:
        yield server


@pytest.fixture(scope="module")
def mail(settings: Settings, smtp: SmtpServer) -> Settings:
    """Settings that email through the module's server, retry at once, and link to PUBLIC. More worker slots:
    entries other modules left in the shared queue must not keep this module's emails waiting."""
    return tuned(settings, smtp_url=smtp.url, public_url=PUBLIC, mail_retry_seconds=0, worker_concurrency=4)


@pytest.fixture(scope="module")
async def mail_client(mail: Settings) -> AsyncIterator[AsyncTestClient]:  # type: ignore[type-arg]
    """The real app built with `mail` (it enqueues exports, imports and emails after its commits)."""
    async with AsyncTestClient(app=create_app(mail)) as c:
        yield c


@pytest.fixture
def mapi(mail_client: AsyncTestClient, users: UserFactory) -> Api:  # type: ignore[type-arg]
    """API caller against the emailing app."""
    return Api(mail_client, users)
