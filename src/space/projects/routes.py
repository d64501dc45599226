"""Routes."""

from litestar import Router

router = Router(path="/", route_handlers=[])
