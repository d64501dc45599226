"""Projects and tasks over HTTP: CRUD, soft delete, staff-only access, IDOR and bad input."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import TYPE_CHECKING, Any

from tests.helpers import Api, Org, OrgFactory, assert_problem

if TYPE_CHECKING:
    # Imported for annotations only: pytest would try to collect a Test* class imported at runtime.
    from tests.helpers import TestUser


def _ts(value: str) -> dt.datetime:
    return dt.datetime.fromisoformat(value)


async def _project(api: Api, org: Org, name: str = "Apollo", user: TestUser | None = None) -> dict[str, Any]:
    r = await api.call("POST", org.path("/projects"), user or org.member, json={"name": name})
    assert r.status_code == 201, r.text
    body: dict[str, Any] = r.json()
    return body


async def test_project_create_rename_and_soft_delete(api: Api, orgs: OrgFactory) -> None:
    org = await orgs.make()
    p = await _project(api, org, "  Apollo  ")
    assert set(p) == {"id", "name", "version", "createdAt", "updatedAt"}
    assert p["name"] == "Apollo" and p["version"] == 1 and p["createdAt"] == p["updatedAt"]
    other = await _project(api, org, "Gemini")

    r = await api.call("PATCH", org.path(f"/projects/{p['id']}"), org.admin, json={"name": "Artemis"})
    assert r.status_code == 200, r.text
    renamed = r.json()
    assert renamed["name"] == "Artemis" and renamed["version"] == 2
    assert renamed["createdAt"] == p["createdAt"] and _ts(renamed["updatedAt"]) > _ts(p["updatedAt"])
    r = await api.call("PATCH", org.path(f"/projects/{p['id']}"), org.owner, json={"name": "Artemis II"})
    assert r.json()["version"] == 3
    r = await api.call("GET", org.path(f"/projects/{p['id']}"), org.member)
    assert r.status_code == 200 and r.json()["name"] == "Artemis II" and r.json()["version"] == 3

    r = await api.call("GET", org.path("/projects"), org.member)
    assert [x["id"] for x in r.json()["items"]] == [p["id"], other["id"]]

    r = await api.call("DELETE", org.path(f"/projects/{p['id']}"), org.member)
    assert r.status_code == 204, r.text
    r = await api.call("GET", org.path("/projects"), org.owner)
    assert [x["id"] for x in r.json()["items"]] == [other["id"]]
    for method, suffix, body in [
        ("GET", "", None),
        ("PATCH", "", {"name": "Back"}),
        ("DELETE", "", None),
        ("GET", "/tasks", None),
        ("POST", "/tasks", {"title": "Late"}),
    ]:
        r = await api.call(method, org.path(f"/projects/{p['id']}{suffix}"), org.owner, json=body)
        assert_problem(r, 404, "not_found")


async def test_tasks_create_and_list(api: Api, orgs: OrgFactory) -> None:
    org = await orgs.make()
    p = await _project(api, org)
    q = await _project(api, org, "Other")
    r = await api.call("POST", org.path(f"/projects/{p['id']}/tasks"), org.member, json={"title": "Plan"})
    assert r.status_code == 201, r.text
    first = r.json()
    assert set(first) == {"id", "projectId", "title", "status", "dueDate", "createdAt", "updatedAt"}
    assert first["projectId"] == p["id"] and first["status"] == "todo" and first["dueDate"] is None
    r = await api.call(
        "POST",
        org.path(f"/projects/{p['id']}/tasks"),
        org.admin,
        json={"title": "Build", "status": "doing", "dueDate": "2030-01-31"},
    )
    assert r.status_code == 201, r.text
    second = r.json()
    assert second["status"] == "doing" and second["dueDate"] == "2030-01-31"
    r = await api.call("POST", org.path(f"/projects/{q['id']}/tasks"), org.owner, json={"title": "Elsewhere"})
    assert r.status_code == 201

    r = await api.call("GET", org.path(f"/projects/{p['id']}/tasks"), org.owner)
    assert r.status_code == 200
    assert [(t["id"], t["title"]) for t in r.json()["items"]] == [(first["id"], "Plan"), (second["id"], "Build")]


async def test_projects_and_tasks_are_staff_only(api: Api, orgs: OrgFactory) -> None:
    org = await orgs.make()
    for user in (org.owner, org.admin, org.member):
        p = await _project(api, org, "Mine", user)
        r = await api.call("GET", org.path("/projects"), user)
        assert r.status_code == 200 and p["id"] in [x["id"] for x in r.json()["items"]]
        r = await api.call("PATCH", org.path(f"/projects/{p['id']}"), user, json={"name": "Renamed"})
        assert r.status_code == 200
        r = await api.call("POST", org.path(f"/projects/{p['id']}/tasks"), user, json={"title": "T"})
        assert r.status_code == 201
        r = await api.call("GET", org.path(f"/projects/{p['id']}/tasks"), user)
        assert r.status_code == 200 and len(r.json()["items"]) == 1
        r = await api.call("DELETE", org.path(f"/projects/{p['id']}"), user)
        assert r.status_code == 204

    p = await _project(api, org)
    pid = p["id"]
    for method, path, body in [
        ("POST", "/projects", {"name": "Nope"}),
        ("GET", "/projects", None),
        ("GET", f"/projects/{pid}", None),
        ("PATCH", f"/projects/{pid}", {"name": "Nope"}),
        ("DELETE", f"/projects/{pid}", None),
        ("POST", f"/projects/{pid}/tasks", {"title": "Nope"}),
        ("GET", f"/projects/{pid}/tasks", None),
    ]:
        r = await api.call(method, org.path(path), org.customer, json=body)
        assert_problem(r, 403, "forbidden")
    # The refused calls changed nothing.
    r = await api.call("GET", org.path(f"/projects/{pid}"), org.member)
    assert r.json()["version"] == 1
    r = await api.call("GET", org.path(f"/projects/{pid}/tasks"), org.member)
    assert r.json()["items"] == []


async def test_other_orgs_unknown_and_malformed_project_ids_are_one_404(api: Api, orgs: OrgFactory) -> None:
    mine = await orgs.make()
    theirs = await orgs.make("Other")
    foreign = await _project(api, theirs, "Secret")
    await api.call("POST", theirs.path(f"/projects/{foreign['id']}/tasks"), theirs.owner, json={"title": "x"})

    bodies = []
    for pid in (foreign["id"], str(uuid.uuid4()), "not-a-uuid", "1"):
        for method, suffix, body in [
            ("GET", "", None),
            ("PATCH", "", {"name": "Taken"}),
            ("DELETE", "", None),
            ("GET", "/tasks", None),
            ("POST", "/tasks", {"title": "Planted"}),
        ]:
            r = await api.call(method, mine.path(f"/projects/{pid}{suffix}"), mine.owner, json=body)
            bodies.append(assert_problem(r, 404, "not_found"))
    # The other org's project answered exactly like an unknown or malformed id.
    assert all(b == bodies[0] for b in bodies), bodies
    # ...and someone who isn't a member of that org can't reach it through its own path either.
    r = await api.call("GET", theirs.path(f"/projects/{foreign['id']}"), mine.owner)
    assert assert_problem(r, 404, "not_found") == bodies[0]

    r = await api.call("GET", theirs.path(f"/projects/{foreign['id']}"), theirs.owner)
    assert r.json()["name"] == "Secret" and r.json()["version"] == 1
    r = await api.call("GET", theirs.path(f"/projects/{foreign['id']}/tasks"), theirs.owner)
    assert [t["title"] for t in r.json()["items"]] == ["x"]


async def test_bad_project_and_task_input_is_400(api: Api, orgs: OrgFactory) -> None:
    org = await orgs.make()
    p = await _project(api, org)
    tasks = org.path(f"/projects/{p['id']}/tasks")
    cases: list[tuple[str, str, Any]] = [
        ("POST", org.path("/projects"), {"name": "ok", "color": "red"}),
        ("POST", org.path("/projects"), {"name": "nul\x00name"}),
        ("POST", org.path("/projects"), {"name": "x" * 201}),
        ("POST", org.path("/projects"), {"name": "   "}),
        ("POST", org.path("/projects"), {"name": 5}),
        ("POST", org.path("/projects"), {}),
        ("PATCH", org.path(f"/projects/{p['id']}"), {"name": "ok", "version": 9}),
        ("PATCH", org.path(f"/projects/{p['id']}"), {"name": "a\x00"}),
        ("POST", tasks, {"title": "t", "status": "blocked"}),
        ("POST", tasks, {"title": "t", "dueDate": "tomorrow"}),
        ("POST", tasks, {"title": "t", "owner": "me"}),
        ("POST", tasks, {"title": "\x00"}),
        ("POST", tasks, {"title": "x" * 501}),
    ]
    for method, path, body in cases:
        r = await api.call(method, path, org.member, json=body)
        assert_problem(r, 400, "invalid_request")
    for method, path in [("POST", org.path("/projects")), ("POST", tasks), ("PATCH", org.path(f"/projects/{p['id']}"))]:
        r = await api.call(
            method, path, org.member, content=b'{"name": "x",', headers={"content-type": "application/json"}
        )
        assert_problem(r, 400, "invalid_request")

    body = assert_problem(
        await api.call("POST", tasks, org.member, json={"title": "t", "status": "blocked"}), 400, "invalid_request"
    )
    assert "status" in body["detail"]
    # Nothing was written by the refused requests.
    r = await api.call("GET", org.path("/projects"), org.member)
    assert [(x["name"], x["version"]) for x in r.json()["items"]] == [("Apollo", 1)]
    r = await api.call("GET", tasks, org.member)
    assert r.json()["items"] == []
