"""The page query parameters of paginated lists, for route signatures (Litestar's parameter constraints)."""

from __future__ import annotations

from typing import Annotated

from litestar.params import QueryParameter

MAX_PAGE_SIZE = 200
DEFAULT_PAGE_SIZE = 50
# Keeps OFFSET = (page - 1) * pageSize far inside bigint, whatever the caller sends.
MAX_PAGE = 1_000_000

PageNumber = Annotated[int, QueryParameter(ge=1, le=MAX_PAGE)]
"""The `page` query parameter of a paginated list (from 1)."""
PageSize = Annotated[int, QueryParameter(ge=1, le=MAX_PAGE_SIZE)]
"""The `pageSize` query parameter of a paginated list."""
