"""HTTP routes of projects and tasks: staff only. Thin: decode, one service call, return."""

from __future__ import annotations

from litestar import Controller, Router, delete, get, patch, post
from litestar.di import NamedDependency
from litestar.params import FromPath, JSONBody

from space.orgs.deps import MEMBER, STAFF, MemberContext, parse_id
from space.pagination import DEFAULT_PAGE_SIZE, PageNumber, PageSize
from space.projects import service
from space.projects.schemas import Project, ProjectCreate, ProjectPage, ProjectUpdate, Task, TaskCreate, TaskPage


class ProjectController(Controller):
    """Projects of an org; soft-deleted ones answer 404 everywhere."""

    path = "/orgs/{org_id:str}/projects"
    tags = ["projects"]
    dependencies = MEMBER
    opt = {"roles": STAFF}

    @post("/")
    async def create(self, ctx: NamedDependency[MemberContext], data: JSONBody[ProjectCreate]) -> Project:
        """Create a project."""
        return await service.create_project(ctx.uow.session, ctx.org.id, data)

    @get("/")
    async def list_projects(
        self,
        ctx: NamedDependency[MemberContext],
        page: PageNumber = 1,
        # Spelled as on the wire: Litestar names a failing query parameter by its Python name.
        pageSize: PageSize = DEFAULT_PAGE_SIZE,
    ) -> ProjectPage:
        """A page of the live projects, oldest first."""
        return await service.list_projects(ctx.uow.session, ctx.org.id, page, pageSize)

    @get("/{project_id:str}")
    async def get_one(self, ctx: NamedDependency[MemberContext], project_id: FromPath[str]) -> Project:
        """One live project."""
        return await service.get_project(ctx.uow.session, ctx.org.id, parse_id(project_id))

    @patch("/{project_id:str}")
    async def rename(
        self, ctx: NamedDependency[MemberContext], project_id: FromPath[str], data: JSONBody[ProjectUpdate]
    ) -> Project:
        """Rename a project (its version goes up by one)."""
        return await service.rename_project(ctx.uow.session, ctx.org.id, parse_id(project_id), data.name)

    @delete("/{project_id:str}")
    async def remove(self, ctx: NamedDependency[MemberContext], project_id: FromPath[str]) -> None:
        """Soft-delete a project."""
        await service.delete_project(ctx.uow.session, ctx.org.id, parse_id(project_id))

    @post("/{project_id:str}/tasks")
    async def create_task(
        self, ctx: NamedDependency[MemberContext], project_id: FromPath[str], data: JSONBody[TaskCreate]
    ) -> Task:
        """Add a task to a project."""
        return await service.create_task(ctx.uow.session, ctx.org.id, parse_id(project_id), data)

    @get("/{project_id:str}/tasks")
    async def list_tasks(
        self,
        ctx: NamedDependency[MemberContext],
        project_id: FromPath[str],
        page: PageNumber = 1,
        pageSize: PageSize = DEFAULT_PAGE_SIZE,
    ) -> TaskPage:
        """A page of a project's tasks, oldest first."""
        return await service.list_tasks(ctx.uow.session, ctx.org.id, parse_id(project_id), page, pageSize)


router = Router(path="/", route_handlers=[ProjectController])
