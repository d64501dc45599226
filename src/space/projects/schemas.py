"""Payloads of projects and tasks."""

from __future__ import annotations

import datetime as dt
import enum
import uuid

from space.schemas import Input, Name, Output, Title


class TaskStatus(enum.StrEnum):
    """Task states."""

    todo = "todo"
    doing = "doing"
    done = "done"


class Project(Output):
    """A live project; `version` counts its edits."""

    id: uuid.UUID
    name: str
    version: int
    created_at: dt.datetime
    updated_at: dt.datetime


class ProjectCreate(Input):
    """POST /orgs/{orgId}/projects."""

    name: Name


class ProjectUpdate(Input):
    """PATCH /orgs/{orgId}/projects/{projectId}: a rename."""

    name: Name


class Task(Output):
    """A task of a project."""

    id: uuid.UUID
    project_id: uuid.UUID
    title: str
    status: TaskStatus
    due_date: dt.date | None
    created_at: dt.datetime
    updated_at: dt.datetime


class ProjectPage(Output):
    """One page of the project list, oldest first."""

    items: list[Project]
    total: int
    page: int
    page_size: int


class TaskPage(Output):
    """One page of a project's tasks, oldest first."""

    items: list[Task]
    total: int
    page: int
    page_size: int


class TaskCreate(Input):
    """POST /orgs/{orgId}/projects/{projectId}/tasks."""

    title: Title
    status: TaskStatus = TaskStatus.todo
    due_date: dt.date | None = None
