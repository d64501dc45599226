"""The API document (OpenAPI 3.1) as the app answers (SPEC §27): Litestar builds it from the handlers, then
`complete_document` adds, once as the app is built, what no handler signature says.

Routes declare what is theirs: their own refusals (`responses=refusals(LastOwner)`), files in several media types
(`Files`), success headers (Litestar's `response_headers`), their security when it is not the bearer token. What
every route of a kind answers is derived here, so a new route gets it with no hand work:

- the bearer requirement and 401 on every route the authentication middleware guards; `security: []` elsewhere;
- 400 `invalid_request` where there is a parameter or a body, 413 where there is a body, 404 where the path
  names something, 403 where the route declares roles, 409 on an org's writes that its state may refuse;
- 503 (`DATABASE_REFUSALS`) wherever the request reads the database;
- a response that is a union of types is `anyOf` (Litestar writes `oneOf`, which an empty list, or an item of
  the wider type, matches twice);
- every refusal is `application/problem+json` with the `Problem` schema;
- request bodies reject unknown fields (`additionalProperties: false`) where msgspec does (`InputSchemas`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import msgspec
from litestar import Litestar, MediaType, Request, Response
from litestar._openapi.schema_generation.plugins.struct import StructSchemaPlugin
from litestar.handlers import HTTPRouteHandler
from litestar.openapi import ResponseSpec
from litestar.openapi.spec import (
    OpenAPI,
    OpenAPIHeader,
    OpenAPIMediaType,
    OpenAPIResponse,
    OpenAPIType,
    Operation,
    Reference,
    Schema,
    SecurityScheme,
)
from litestar.routes import HTTPRoute
from litestar.typing import FieldDefinition

from space.auth.middleware import PUBLIC_PATHS
from space.errors import (
    ExportNotReady,
    Forbidden,
    InvalidRequest,
    NotFound,
    OrgDeleting,
    OrgSuspended,
    PayloadTooLarge,
    QueryTimeout,
    SpaceError,
    Unauthenticated,
    Unavailable,
)
from space.orgs.deps import READ_METHODS
from space.problems import PROBLEM_JSON

BEARER = "bearer"
LINK = "link"
SECURITY_SCHEMES = {
    BEARER: SecurityScheme(type="http", scheme="bearer", description="API token"),
    LINK: SecurityScheme(
        type="apiKey",
        name="token",
        security_scheme_in="query",
        description="A download link's token (POST .../links): the result route only.",
    ),
}


DATABASE_REFUSALS: tuple[type[SpaceError], ...] = (QueryTimeout, Unavailable)
"""What any request that reads the database may be answered with, whatever its route."""

RETRY_AFTER_STATUSES = frozenset({429, 503})
"""Statuses whose refusals may carry `Retry-After` (a rate limit, a busy or slow server), and one 409 besides."""

PROBLEM = "Problem"
PROBLEM_SCHEMA = Schema(
    type=OpenAPIType.OBJECT,
    title=PROBLEM,
    description="RFC 9457 problem details; `code` is the stable machine-readable reason.",
    required=["code", "detail", "status", "title"],
    properties={
        "status": Schema(type=OpenAPIType.INTEGER),
        "title": Schema(type=OpenAPIType.STRING),
        "detail": Schema(type=OpenAPIType.STRING),
        "code": Schema(type=OpenAPIType.STRING),
        "type": Schema(type=OpenAPIType.STRING, default="about:blank"),
        "errors": Schema(
            type=OpenAPIType.ARRAY,
            items=Schema(type=OpenAPIType.OBJECT),
            description="Each offending field of a 400 `invalid_request` (`key`, `message`).",
        ),
        "errorCode": Schema(type=OpenAPIType.STRING, description="A failed export's error code (409 export_failed)."),
    },
)
"""The schema of `space.problems.Problem` (tests hold the two together)."""


@dataclass
class Refusals(ResponseSpec):
    """Problem+json answers of one status: the errors a route refuses with. `complete_document` writes them."""

    errors: tuple[type[SpaceError], ...] = ()


@dataclass
class Files(ResponseSpec):
    """A file in one of several media types (a ResponseSpec names one); `complete_document` writes them."""

    media_types: tuple[str, ...] = ()


def refusals(*errors: type[SpaceError]) -> dict[int, ResponseSpec]:
    """A route's own refusals beyond the ones every route of its kind gets, for its `responses=`."""
    by_status: dict[int, list[type[SpaceError]]] = {}
    for error in errors:
        by_status.setdefault(error.status, []).append(error)
    return {status: Refusals(None, description=_describe(es), errors=tuple(es)) for status, es in by_status.items()}


class InputSchemas(StructSchemaPlugin):
    """msgspec Structs as Litestar documents them, and `additionalProperties: false` where the Struct forbids unknown
    fields (`space.schemas.Input`): a client learns from the document that an extra field is refused."""

    def to_openapi_schema(self, field_definition: FieldDefinition, schema_creator: Any) -> Schema:
        """Litestar's schema of the Struct, closed when msgspec closes it."""
        schema = super().to_openapi_schema(field_definition, schema_creator)
        info = msgspec.inspect.type_info(field_definition.type_)
        if isinstance(info, msgspec.inspect.StructType) and info.forbid_unknown_fields:
            schema.additional_properties = False
        return schema


_PUBLIC = [re.compile(p) for p in PUBLIC_PATHS]


def complete_document(app: Litestar) -> OpenAPI:
    """Build the app's document now, completed as the module says; Litestar serves this one object."""
    openapi = app.openapi_schema
    assert openapi.components is not None and openapi.paths is not None
    schemas = openapi.components.schemas if isinstance(openapi.components.schemas, dict) else {}
    openapi.components.schemas = {**schemas, PROBLEM: PROBLEM_SCHEMA}
    for route in app.routes:
        item = openapi.paths.get(route.path_format) if isinstance(route, HTTPRoute) else None
        if item is None:
            continue
        assert isinstance(route, HTTPRoute)
        for method, (handler, _) in route.route_handler_map.items():
            operation = getattr(item, method.lower(), None)
            if isinstance(operation, Operation):
                _complete(operation, route, handler)
    return openapi


def _complete(operation: Operation, route: HTTPRoute, handler: HTTPRouteHandler) -> None:
    public = any(p.search(route.path_format) for p in _PUBLIC)
    guarded = not public and not handler.opt.get("exclude_from_auth")
    operation.security = handler.resolve_security() or ([{BEARER: []}] if guarded else [])
    responses = dict(operation.responses or {})
    for status, spec in handler.responses.items() if handler.responses else ():
        if isinstance(spec, Files):
            responses[str(status)] = _files(spec)
    for answer in responses.values():
        if isinstance(answer, OpenAPIResponse):
            _any_of(answer)
    for status, errors in _refusals(operation, route, handler, public=public, guarded=guarded).items():
        responses[str(status)] = _problem(status, errors)
    operation.responses = dict(sorted(responses.items()))


def _refusals(
    operation: Operation, route: HTTPRoute, handler: HTTPRouteHandler, *, public: bool, guarded: bool
) -> dict[int, list[type[SpaceError]]]:
    errors: list[type[SpaceError]] = []
    for spec in (handler.responses or {}).values():
        if isinstance(spec, Refusals):
            errors += spec.errors
    if guarded:
        errors.append(Unauthenticated)
    if not public:
        errors += DATABASE_REFUSALS
    if operation.parameters or operation.request_body:
        errors.append(InvalidRequest)  # Litestar's validation of parameters and bodies (space.problems)
    if operation.request_body:
        errors.append(PayloadTooLarge)
    if route.path_parameters:
        errors.append(NotFound)  # a malformed id is answered like an unknown one
    if handler.opt.get("roles"):
        errors.append(Forbidden)
    writes = any(m not in READ_METHODS for m in handler.http_methods)
    if "org_id" in route.path_parameters and writes and not handler.opt.get("state_exempt"):
        errors += [OrgSuspended, OrgDeleting]  # orgs.deps refuses writes by the org's state
    by_status: dict[int, list[type[SpaceError]]] = {}
    for error in dict.fromkeys(errors):
        by_status.setdefault(error.status, []).append(error)
    return by_status


def _describe(errors: list[type[SpaceError]] | tuple[type[SpaceError], ...]) -> str:
    return "; ".join(f"`{e.code}`: {e.title}" for e in errors)


def _problem(status: int, errors: list[type[SpaceError]]) -> OpenAPIResponse:
    headers: dict[str, OpenAPIHeader | Reference] = {}
    if status in RETRY_AFTER_STATUSES or ExportNotReady in errors:
        headers["Retry-After"] = OpenAPIHeader(
            schema=Schema(type=OpenAPIType.INTEGER), description="Seconds to wait before trying again, when known."
        )
    if status == Unauthenticated.status:
        headers["WWW-Authenticate"] = OpenAPIHeader(schema=Schema(type=OpenAPIType.STRING), description="`Bearer`.")
    return OpenAPIResponse(
        description=_describe(errors),
        content={PROBLEM_JSON: OpenAPIMediaType(schema=Reference(ref=f"#/components/schemas/{PROBLEM}"))},
        headers=headers or None,
    )


def _files(spec: Files) -> OpenAPIResponse:
    # A JSON file is an object (its own JSON Schema is served under /schemas/); others are bytes.
    content = {
        media: OpenAPIMediaType(
            schema=Schema(type=OpenAPIType.OBJECT)
            if media.startswith("application/json")
            else Schema(type=OpenAPIType.STRING, content_media_type=media)
        )
        for media in spec.media_types
    }
    return OpenAPIResponse(description=spec.description, content=content)


def _any_of(answer: OpenAPIResponse) -> None:
    for media in (answer.content or {}).values():
        schema = media.schema
        if isinstance(schema, Schema) and schema.one_of and schema.discriminator is None:
            schema.any_of, schema.one_of = schema.one_of, None


async def allow_every_method(request: Request[Any, Any, Any]) -> Response[None] | None:
    """OPTIONS answers with every method of its path in `Allow`: Litestar 2's own answer names only the methods of
    the first handler registered on the path (litestar#4169, fixed in 3)."""
    if request.method != "OPTIONS":
        return None
    template = request.scope.get("path_template")
    for route in request.app.routes:
        if isinstance(route, HTTPRoute) and route.path_format == template:
            allow = ", ".join(sorted(route.methods))
            return Response(None, status_code=204, headers={"Allow": allow}, media_type=MediaType.TEXT)
    return None
