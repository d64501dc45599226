"""HTTP routes of tickets. Thin: decode, one service call, return."""

from __future__ import annotations

from litestar import Controller, Router, get, patch, post
from litestar.di import NamedDependency
from litestar.params import FromPath, FromQuery, JSONBody

from space.orgs.deps import MEMBER, STAFF, MemberContext
from space.pagination import DEFAULT_PAGE_SIZE, PageNumber, PageSize
from space.tickets import service
from space.tickets.filters import Assignment, Priority, TicketStatus, parse_filters
from space.tickets.schemas import Ticket, TicketCreate, TicketPage, TicketUpdate


class TicketController(Controller):
    """Tickets: any member opens and lists (customers: their own, by RLS); staff triage."""

    path = "/orgs/{org_id:str}/tickets"
    tags = ["tickets"]
    dependencies = MEMBER

    @post("/")
    async def create(self, ctx: NamedDependency[MemberContext], data: JSONBody[TicketCreate]) -> Ticket:
        """Open a ticket; it gets the org's next number."""
        return await service.create_ticket(ctx.uow.session, ctx.org.id, ctx.principal.user_id, data)

    @get("/")
    async def list_tickets(
        self,
        ctx: NamedDependency[MemberContext],
        status: FromQuery[TicketStatus | None] = None,
        priority: FromQuery[Priority | None] = None,
        assignment: FromQuery[Assignment | None] = None,
        # Checked (length, NUL) by parse_filters, the same check the CSV export's filters get.
        q: FromQuery[str | None] = None,
        page: PageNumber = 1,
        # Spelled as on the wire: Litestar names a failing query parameter by its Python name.
        pageSize: PageSize = DEFAULT_PAGE_SIZE,
    ) -> TicketPage:
        """A page of tickets matching the filters, by number."""
        raw = {"status": status, "priority": priority, "assignment": assignment, "q": q}
        filters = parse_filters({k: v for k, v in raw.items() if v is not None})
        assert ctx.membership is not None  # the route admits members only
        return await service.list_tickets(ctx.uow.session, ctx.membership, filters, page, pageSize)

    @patch("/{number:str}", opt={"roles": STAFF})
    async def update(
        self, ctx: NamedDependency[MemberContext], number: FromPath[str], data: JSONBody[TicketUpdate]
    ) -> Ticket:
        """Change a ticket's status, priority or assignee."""
        return await service.update_ticket(ctx.uow.session, ctx.org.id, service.parse_number(number), data)


router = Router(path="/", route_handlers=[TicketController])
