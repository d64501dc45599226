"""The export tests that exercise the result store, run once more with `SPACE_RESULT_STORE=s3://...`.

The module overrides `settings` (and the app and API helper built from it) with a parametrized fixture: each
test below runs with S3 results and redirects on (downloads follow the 303 to moto over real HTTP), and with
redirects off (the API streams the object). The runner's store follows the settings (`fixtures.runner`).
Chosen: the worker tests that build results through the store and download them (rows in batches with
progress, list and CSV filters agree, the row and byte limits, snapshot content, CSV rules, customer scope) and
the archive's (every member and its manifest, its CSV byte for byte, its own limits: rows per member file, bytes
of the whole ZIP).
Left out: tests that count `export_chunks` rows or insert them directly (the multi-chunk test, the result
route's order, expiry, delete); test_s3_store.py covers those cases for objects. The end-to-end worker test
checks the API's ETag, which a redirected download does not carry (the store's own ETag answers there).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from litestar.testing import AsyncTestClient

from space.app import create_app
from space.config import Settings
from tests.exports.s3_fixtures import S3Server, s3_settings
from tests.exports.test_archive import (
    test_the_archive_holds_every_member_and_its_manifest_matches_them,
    test_the_archives_csv_is_byte_for_byte_a_tickets_csv_export,
)
from tests.exports.test_archive_limits import (
    test_the_archive_byte_limit_bounds_the_whole_zip,
    test_the_archive_row_limit_counts_each_member_file,
)
from tests.exports.test_worker import (
    test_205_rows_in_batches_each_once_with_progress,
    test_byte_limit_fails_too_large_and_stores_nothing,
    test_csv_format_rules,
    test_list_and_csv_filters_agree,
    test_row_limit_plus_one_fails_too_many_rows,
    test_snapshot_content,
    test_two_customers_each_get_only_their_rows,
)
from tests.helpers import Api, UserFactory

__all__ = [
    "test_205_rows_in_batches_each_once_with_progress",
    "test_byte_limit_fails_too_large_and_stores_nothing",
    "test_csv_format_rules",
    "test_list_and_csv_filters_agree",
    "test_row_limit_plus_one_fails_too_many_rows",
    "test_snapshot_content",
    "test_the_archive_byte_limit_bounds_the_whole_zip",
    "test_the_archive_holds_every_member_and_its_manifest_matches_them",
    "test_the_archive_row_limit_counts_each_member_file",
    "test_the_archives_csv_is_byte_for_byte_a_tickets_csv_export",
    "test_two_customers_each_get_only_their_rows",
]


@pytest.fixture(scope="module", params=["redirect", "stream"])
def settings(request: pytest.FixtureRequest, owner_url: str, s3_server: S3Server) -> Settings:
    """The default test settings with results in the S3 bucket: 303 redirects, or streamed by the API."""
    from space.config import load_settings

    return s3_settings(load_settings({}, database_url=owner_url), result_redirect=request.param == "redirect")


@pytest.fixture(scope="module")
async def client(settings: Settings) -> AsyncIterator[AsyncTestClient]:  # type: ignore[type-arg]
    """The real app on the S3 settings."""
    async with AsyncTestClient(app=create_app(settings)) as c:
        yield c


@pytest.fixture(scope="module")
def api(client: AsyncTestClient, users: UserFactory) -> Api:  # type: ignore[type-arg]
    """API caller against the S3 app."""
    return Api(client, users)
