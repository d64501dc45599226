"""Fixtures of the destination tests: the customer's store (a second moto server behind a proxy)."""

from tests.destinations.customer_store import customer_store  # noqa: F401 (the session's customer store)
