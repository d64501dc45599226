"""Projects (renamed with a version bump, soft-deleted) and their tasks, always within the caller's org."""

from __future__ import annotations

import uuid

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from space.errors import NotFound
from space.projects import models
from space.projects.schemas import Project, ProjectCreate, ProjectPage, Task, TaskCreate, TaskPage, TaskStatus


def project_out(p: models.Project) -> Project:
    """The API shape of a project."""
    return Project(id=p.id, name=p.name, version=p.version, created_at=p.created_at, updated_at=p.updated_at)


def task_out(t: models.Task) -> Task:
    """The API shape of a task."""
    return Task(
        id=t.id,
        project_id=t.project_id,
        title=t.title,
        status=TaskStatus(t.status),
        due_date=t.due_date,
        created_at=t.created_at,
        updated_at=t.updated_at,
    )


async def create_project(session: AsyncSession, org_id: uuid.UUID, data: ProjectCreate) -> Project:
    """Create a project at version 1."""
    p = models.Project(id=uuid.uuid4(), org_id=org_id, name=data.name.strip(), version=1)
    session.add(p)
    await session.flush()
    await session.refresh(p)
    return project_out(p)


async def list_projects(session: AsyncSession, org_id: uuid.UUID, page: int, page_size: int) -> ProjectPage:
    """One page of the live projects, oldest first."""
    conds = [models.Project.org_id == org_id, models.Project.deleted_at.is_(None)]
    total = await session.scalar(select(func.count()).select_from(models.Project).where(*conds))
    rows = await session.execute(
        select(models.Project)
        .where(*conds)
        .order_by(models.Project.created_at, models.Project.id)
        .offset((page - 1) * page_size)
        .limit(page_size)
    )
    items = [project_out(p) for p in rows.scalars()]
    return ProjectPage(items=items, total=total or 0, page=page, page_size=page_size)


async def get_project(session: AsyncSession, org_id: uuid.UUID, project_id: uuid.UUID) -> Project:
    """One live project of the org; deleted, unknown and other orgs' projects are all 404."""
    return project_out(await _live_project(session, org_id, project_id))


async def rename_project(session: AsyncSession, org_id: uuid.UUID, project_id: uuid.UUID, name: str) -> Project:
    """Rename a live project; one UPDATE bumps `version`, so concurrent renames never lose a count."""
    p = (
        await session.execute(
            update(models.Project)
            .where(
                models.Project.id == project_id,
                models.Project.org_id == org_id,
                models.Project.deleted_at.is_(None),
            )
            .values(name=name.strip(), version=models.Project.version + 1, updated_at=func.now())
            .returning(models.Project)
            .execution_options(populate_existing=True)
        )
    ).scalar_one_or_none()
    if p is None:
        raise NotFound()
    return project_out(p)


async def delete_project(session: AsyncSession, org_id: uuid.UUID, project_id: uuid.UUID) -> None:
    """Soft-delete a live project: its row (and its tasks) stay, hidden from every read."""
    result = await session.execute(
        update(models.Project)
        .where(
            models.Project.id == project_id,
            models.Project.org_id == org_id,
            models.Project.deleted_at.is_(None),
        )
        .values(deleted_at=func.now(), updated_at=func.now())
        .returning(models.Project.id)
    )
    if result.first() is None:
        raise NotFound()


async def create_task(session: AsyncSession, org_id: uuid.UUID, project_id: uuid.UUID, data: TaskCreate) -> Task:
    """Add a task to a live project."""
    # FOR SHARE: a concurrent soft delete either waits for this insert or is seen before it.
    await _live_project(session, org_id, project_id, lock=True)
    t = models.Task(
        id=uuid.uuid4(),
        org_id=org_id,
        project_id=project_id,
        title=data.title.strip(),
        status=data.status.value,
        due_date=data.due_date,
    )
    session.add(t)
    await session.flush()
    await session.refresh(t)
    return task_out(t)


async def list_tasks(
    session: AsyncSession, org_id: uuid.UUID, project_id: uuid.UUID, page: int, page_size: int
) -> TaskPage:
    """One page of a live project's tasks, oldest first."""
    await _live_project(session, org_id, project_id)
    conds = [models.Task.org_id == org_id, models.Task.project_id == project_id]
    total = await session.scalar(select(func.count()).select_from(models.Task).where(*conds))
    rows = await session.execute(
        select(models.Task)
        .where(*conds)
        .order_by(models.Task.created_at, models.Task.id)
        .offset((page - 1) * page_size)
        .limit(page_size)
    )
    items = [task_out(t) for t in rows.scalars()]
    return TaskPage(items=items, total=total or 0, page=page, page_size=page_size)


async def _live_project(
    session: AsyncSession, org_id: uuid.UUID, project_id: uuid.UUID, *, lock: bool = False
) -> models.Project:
    stmt = select(models.Project).where(
        models.Project.id == project_id,
        models.Project.org_id == org_id,
        models.Project.deleted_at.is_(None),
    )
    if lock:
        stmt = stmt.with_for_update(read=True)
    p = (await session.execute(stmt)).scalar_one_or_none()
    if p is None:
        raise NotFound()
    return p
