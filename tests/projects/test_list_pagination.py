"""SPEC §14: project and task lists are paginated like tickets: `page` (from 1), `pageSize` (default 50, at most
200), `total`, in the ticket page's shape."""

from __future__ import annotations

from typing import Any

from space.db import Database
from tests.exports.fixtures import add_project
from tests.helpers import Api, Org, OrgFactory, assert_problem

PAGE_KEYS = {"items", "total", "page", "pageSize"}


async def _projects(api: Api, org: Org, n: int) -> list[str]:
    ids = []
    for i in range(n):
        r = await api.call("POST", org.path("/projects"), org.member, json={"name": f"p{i}"})
        assert r.status_code == 201, r.text
        ids.append(r.json()["id"])
    return ids


async def _page(api: Api, org: Org, path: str, query: str = "") -> dict[str, Any]:
    r = await api.call("GET", org.path(path) + query, org.member)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    assert set(body) == PAGE_KEYS, body
    return body


async def test_project_pages(api: Api, orgs: OrgFactory) -> None:
    org = await orgs.make()
    ids = await _projects(api, org, 5)
    first = await _page(api, org, "/projects", "?pageSize=2")
    assert (first["total"], first["page"], first["pageSize"]) == (5, 1, 2)
    assert [p["id"] for p in first["items"]] == ids[:2]
    assert [p["id"] for p in (await _page(api, org, "/projects", "?page=2&pageSize=2"))["items"]] == ids[2:4]
    last = await _page(api, org, "/projects", "?page=3&pageSize=2")
    assert [p["id"] for p in last["items"]] == ids[4:] and last["total"] == 5
    past = await _page(api, org, "/projects", "?page=4&pageSize=2")
    assert past["items"] == [] and past["total"] == 5
    # Defaults: page 1 of 50.
    whole = await _page(api, org, "/projects")
    assert (whole["page"], whole["pageSize"], whole["total"]) == (1, 50, 5)
    assert [p["id"] for p in whole["items"]] == ids
    # A deleted project leaves the pages and the total.
    assert (await api.call("DELETE", org.path(f"/projects/{ids[0]}"), org.member)).status_code == 204
    first = await _page(api, org, "/projects", "?pageSize=2")
    assert first["total"] == 4 and [p["id"] for p in first["items"]] == ids[1:3]


async def test_task_pages(api: Api, orgs: OrgFactory, db: Database) -> None:
    org = await orgs.make()
    [project] = await _projects(api, org, 1)
    tasks = f"/projects/{project}/tasks"
    ids = []
    for i in range(3):
        r = await api.call("POST", org.path(tasks), org.member, json={"title": f"t{i}"})
        assert r.status_code == 201
        ids.append(r.json()["id"])
    # Another project's tasks are not on this project's pages.
    await add_project(db, org.id, "elsewhere", ["other task"] * 4)
    first = await _page(api, org, tasks, "?pageSize=2")
    assert (first["total"], first["page"], first["pageSize"]) == (3, 1, 2)
    assert [t["id"] for t in first["items"]] == ids[:2]
    second = await _page(api, org, tasks, "?page=2&pageSize=2")
    assert [t["id"] for t in second["items"]] == ids[2:]
    whole = await _page(api, org, tasks)
    assert (whole["pageSize"], whole["total"], [t["id"] for t in whole["items"]]) == (50, 3, ids)


async def test_default_page_is_fifty_of_more(api: Api, orgs: OrgFactory, db: Database) -> None:
    org = await orgs.make()
    project = await add_project(db, org.id, "big", [f"task {i}" for i in range(51)])
    tasks = await _page(api, org, f"/projects/{project}/tasks")
    assert (len(tasks["items"]), tasks["total"]) == (50, 51)
    rest = await _page(api, org, f"/projects/{project}/tasks", "?page=2")
    assert (len(rest["items"]), rest["total"]) == (1, 51)
    seen = {t["id"] for t in tasks["items"]} | {t["id"] for t in rest["items"]}
    assert len(seen) == 51  # every task once over the two pages


async def test_page_parameters_are_bounded(api: Api, orgs: OrgFactory) -> None:
    org = await orgs.make()
    [project] = await _projects(api, org, 1)
    for path in ("/projects", f"/projects/{project}/tasks"):
        # The largest page allowed, and one more.
        assert (await _page(api, org, path, "?pageSize=200"))["pageSize"] == 200
        body = assert_problem(
            await api.call("GET", org.path(path) + "?pageSize=201", org.member), 400, "invalid_request"
        )
        assert "pageSize" in body["detail"]
        for query, field in [
            ("?page=0", "page"),
            ("?pageSize=0", "pageSize"),
            ("?page=x", "page"),
            ("?page=1000001", "page"),
        ]:
            body = assert_problem(await api.call("GET", org.path(path) + query, org.member), 400, "invalid_request")
            assert field in body["detail"], (path, query, body)
