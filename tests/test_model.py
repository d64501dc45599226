"""Model-based test (Hypothesis stateful) of who may take which data out, against the real database and app.

A small model of one organization (members and roles, state, tickets, projects, exports) runs beside the real
thing. Every rule acts through the real API (or calls the real worker function) and checks the answer against
the model: a success only where the model allows it, every refusal with the code SPEC §3/§5/§6 names.
Every row carries a marker naming its org and its creator, so a downloaded file shows exactly whose rows it
holds; a marker of any other org fails the test.
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import re
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import psycopg
import pytest
from httpx import Response
from hypothesis import HealthCheck, Phase
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test
from litestar.testing import AsyncTestClient

from space.app import create_app
from space.config import Settings
from space.db import Database
from space.exports.maintenance import cleanup
from space.exports.pipeline import run_export
from space.exports.storage.postgres import PgResultStore
from tests import helpers
from tests.exports.fixtures import add_project, add_tickets, runner, tuned, uid
from tests.helpers import Api, UserFactory

T = TypeVar("T")

STAFF = frozenset({"owner", "admin", "member"})
ROLES = ("owner", "admin", "member", "customer")
MARK = re.compile(r"MK-[0-9a-f]{8}-[a-z0-9]+-\d+")
EXAMPLES = 30
STEPS = 40
# Hypothesis favours the first choice of a list somewhat: the checks with the most to say come first.
WEIGHTS = {
    "download": 5,
    "run_worker": 4,
    "request_export": 4,
    "change_role": 2,
    "add_member": 1,
    "remove_member": 1,
    "open_ticket": 2,
    "lifecycle": 2,
    "status_says_can_download": 1,
    "cancel_or_delete_export": 1,
    "advance_clock_past_ttl": 1,
    "run_cleanup": 1,
}
"""How often each action is drawn when it can act."""


def marker(tag: str, who: str, n: int) -> str:
    """A row's marker: org tag, creator key, sequence."""
    return f"MK-{tag}-{who}-{n}"


@dataclass
class ExportModel:
    """What the model knows of one export."""

    id: str
    creator: str
    kind: str
    scope: str
    state: str = "queued"
    error: str | None = None
    expected: frozenset[str] | None = None
    expired: bool = False
    deleted: bool = False
    revoked: bool = False
    """An owner or admin took its result away (SPEC §12): its owner's download answers 410 export_revoked."""


@dataclass
class World:
    """What the machine needs from the test: the session's loop, the API, the database, and org B's markers."""

    loop: asyncio.AbstractEventLoop
    api: Api
    db: Database
    settings: Settings
    owner_url: str
    foreign: frozenset[str]
    stats: Counter[str] = field(default_factory=Counter)
    stopped: bool = False
    """Set when the test gave up waiting: the machine's thread then stops at its next call."""
    created: list[str] = field(default_factory=list)
    """Every export the runs created (their queue entries are removed at the end)."""


class SpaceModel(RuleBasedStateMachine):
    """One org per run of the machine; rules are the actions of its people."""

    world: ClassVar[World]

    def __init__(self) -> None:
        super().__init__()
        self.tag = uuid.uuid4().hex[:8]
        self.users: dict[str, helpers.TestUser] = {}
        self.roles: dict[str, str] = {}
        self.tickets: list[tuple[str, str]] = []
        self.snapshot_rows: set[str] = set()
        # In creation order: draws pick by position, never by the server's random ids (replays must match).
        self.exports: dict[str, ExportModel] = {}
        self.state = "active"
        self.previous = "active"
        self.org_id = ""
        self.name = f"Model {self.tag}"
        self.seq = 0

    # -- plumbing ---------------------------------------------------------------------------------------

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the session's loop (the machine runs in a worker thread)."""
        if self.world.stopped:
            coro.close()
            raise RuntimeError("the test stopped waiting for the model")
        return asyncio.run_coroutine_threadsafe(coro, self.world.loop).result(60)

    def call(self, method: str, path: str, who: str, **kw: Any) -> Response:
        """An API call as one of the org's people."""
        self.world.stats[f"call {method} {path.split('/')[1] if path else 'org'}"] += 1
        return self.run(self.world.api.call(method, f"/orgs/{self.org_id}{path}", self.users[who], **kw))

    def expect(self, r: Response, status: int, code: str | None = None) -> None:
        """The answer is `status`; a refusal is problem+json with `code`."""
        self.world.stats[f"{status} {code or ''}".strip()] += 1
        assert r.status_code == status, (r.status_code, r.text, status, code)
        if code is not None:
            assert r.headers["content-type"].startswith("application/problem+json"), r.headers
            body = r.json()
            assert body["code"] == code and body["status"] == status and body["detail"], (body, code)

    def write_refusal(self) -> tuple[int, str] | None:
        """What a write to org data (members, tickets) gets in the current state."""
        if self.state == "suspended":
            return 409, "org_suspended"
        if self.state == "deleting":
            return 409, "org_deleting"
        return None

    def next_marker(self, who: str) -> str:
        """A fresh marker for a row created by `who`."""
        self.seq += 1
        return marker(self.tag, who, self.seq)

    # -- set-up ------------------------------------------------------------------------------------------

    @initialize()
    def setup(self) -> None:
        """An org with a person of every role, two outsiders, tickets by each member, a project with tasks."""
        org = self.run(self.world.api.org(self.name))
        self.org_id = org.id
        self.users = {
            "owner": org.owner,
            "admin": org.admin,
            "member": org.member,
            "customer": org.customer,
            "customer2": org.customer2,
        }
        self.roles = {"owner": "owner", "admin": "admin", "member": "member", "customer": "customer"}
        self.roles["customer2"] = "customer"
        for key in ("outsider", "outsider2"):
            self.users[key] = self.run(self.world.api.users.make(key))
        for who in ("owner", "member", "customer", "customer2"):
            titles = [self.next_marker(who) for _ in range(2)]
            self.run(add_tickets(self.world.db, org.id, self.users[who], titles))
            self.tickets += [(t, who) for t in titles]
        project, tasks = self.next_marker("project"), [self.next_marker("task") for _ in range(2)]
        self.run(add_project(self.world.db, org.id, project, tasks))
        self.snapshot_rows = {project, *tasks}

    # -- members -----------------------------------------------------------------------------------------

    def add_member(self, data: st.DataObject) -> None:
        """The owner adds someone who is not a member."""
        who = data.draw(st.sampled_from(sorted(k for k in self.users if k not in self.roles)))
        role = data.draw(st.sampled_from(ROLES))
        r = self.call("POST", "/members", "owner", json={"email": self.users[who].email, "role": role})
        refusal = self.write_refusal()
        if refusal:
            return self.expect(r, *refusal)
        self.expect(r, 201)
        self.roles[who] = role

    def change_role(self, data: st.DataObject) -> None:
        """The owner changes a role (their own only while they are the last owner: refused)."""
        who = data.draw(st.sampled_from(sorted(self.roles)))
        role = data.draw(st.sampled_from(ROLES))
        owners = [k for k, r in self.roles.items() if r == "owner"]
        if who == "owner" and (role == "owner" or owners != ["owner"]):
            return  # the main owner stays an owner: they act for the org's lifecycle
        r = self.call("PATCH", f"/members/{self.users[who].id}", "owner", json={"role": role})
        refusal = self.write_refusal() or ((409, "last_owner") if who == "owner" else None)
        if refusal:
            return self.expect(r, *refusal)
        self.expect(r, 200)
        if self.roles[who] != role:
            self.cancel_unholdable(who, role)
        self.roles[who] = role

    def cancel_unholdable(self, who: str, role: str | None) -> None:
        """SPEC §12: a role change or removal cancels the member's queued exports the new role can't hold."""
        for export in self.exports.values():
            held = role is not None and (export.scope == "own" or role in STAFF)
            if export.creator == who and export.state == "queued" and not held:
                export.state, export.error = "cancelled", "access_revoked"

    def maybe_revoke(self, data: st.DataObject, export: ExportModel) -> None:
        """Sometimes the owner first demotes to customer, or removes, the staff member who owns a team export."""
        who = export.creator
        if self.state != "active" or who == "owner" or export.scope != "team" or self.roles.get(who) not in STAFF:
            return
        match data.draw(st.sampled_from(["keep", "demote", "remove"])):
            case "demote":
                r = self.call("PATCH", f"/members/{self.users[who].id}", "owner", json={"role": "customer"})
                self.expect(r, 200)
                self.cancel_unholdable(who, "customer")
                self.roles[who] = "customer"
            case "remove":
                self.expect(self.call("DELETE", f"/members/{self.users[who].id}", "owner"), 204)
                self.cancel_unholdable(who, None)
                del self.roles[who]

    def remove_member(self, data: st.DataObject) -> None:
        """The owner removes someone else."""
        who = data.draw(st.sampled_from(sorted(k for k in self.roles if k != "owner")))
        r = self.call("DELETE", f"/members/{self.users[who].id}", "owner")
        refusal = self.write_refusal()
        if refusal:
            return self.expect(r, *refusal)
        self.expect(r, 204)
        self.cancel_unholdable(who, None)
        del self.roles[who]

    def open_ticket(self, data: st.DataObject) -> None:
        """Anyone (members and outsiders) tries to open a ticket."""
        who = data.draw(st.sampled_from(sorted(self.users)))
        title = self.next_marker(who)
        r = self.call("POST", "/tickets", who, json={"title": title})
        if who not in self.roles:
            return self.expect(r, 404, "not_found")
        refusal = self.write_refusal()
        if refusal:
            return self.expect(r, *refusal)
        self.expect(r, 201)
        self.tickets.append((title, who))

    # -- lifecycle ---------------------------------------------------------------------------------------

    def lifecycle(self, data: st.DataObject) -> None:
        """Someone (mostly the owner) moves the org through its states (SPEC §3's table; owners only)."""
        action = data.draw(
            st.sampled_from(["suspend", "reactivate", "request_deletion", "skip_final_export", "cancel_deletion"])
        )
        who = data.draw(st.one_of(st.just("owner"), st.sampled_from(sorted(self.users))))
        if who != "owner":
            r = self.call("POST", "/suspend", who)
            if who not in self.roles:
                return self.expect(r, 404, "not_found")
            if self.roles[who] != "owner":
                return self.expect(r, 403, "forbidden")
            action = "suspend"
        if action == "suspend":
            r = r if who != "owner" else self.call("POST", "/suspend", "owner")
            allowed, target = self.state == "active", "suspended"
        elif action == "reactivate":
            r = self.call("POST", "/reactivate", "owner")
            allowed, target = self.state == "suspended", "active"
        elif action == "cancel_deletion":
            r = self.call("DELETE", "/deletion", "owner")
            allowed, target = self.state == "deleting", self.previous
        else:
            skip = action == "skip_final_export"
            r = self.call("POST", "/deletion", "owner", json={"confirm": self.name, "skipFinalExport": skip})
            if self.state != "deleting" and not skip and not self.final_snapshot():
                return self.expect(r, 409, "final_export_recommended")
            allowed, target = self.state != "deleting", "deleting"
        if not allowed:
            return self.expect(r, 409, "invalid_transition")
        self.expect(r, 202 if target == "deleting" else 200)
        if target == "deleting":
            self.previous = self.state
        self.state = target

    def final_snapshot(self) -> bool:
        """The owner has a snapshot they can still download (SPEC §13): completed, not deleted, not expired."""
        return any(
            m.kind == "snapshot" and m.creator == "owner" and m.state == "completed" and not (m.deleted or m.expired)
            for m in self.exports.values()
        )

    # -- exports -----------------------------------------------------------------------------------------

    def request_export(self, data: st.DataObject) -> None:
        """Anyone (mostly members) asks for an export."""
        kind = data.draw(st.sampled_from(["snapshot", "tickets_csv"]))
        who = data.draw(st.one_of(st.sampled_from(sorted(self.roles)), st.sampled_from(sorted(self.users))))
        r = self.call("POST", "/exports", who, json={"kind": kind})
        if who not in self.roles:
            return self.expect(r, 404, "not_found")
        if self.state == "deleting":
            return self.expect(r, 409, "org_deleting")
        if kind == "snapshot" and self.roles[who] not in STAFF:
            return self.expect(r, 403, "forbidden")
        self.expect(r, 202)
        scope = "team" if self.roles[who] in STAFF else "own"
        body = r.json()
        assert (body["state"], body["scope"], body["canDownload"]) == ("queued", scope, False), body
        self.exports[body["id"]] = ExportModel(body["id"], who, kind, scope)
        self.world.created.append(body["id"])

    def visible_rows(self, export: ExportModel) -> set[str]:
        """The rows the export's scope may hold, as the model stands now."""
        if export.kind == "snapshot":
            return set(self.snapshot_rows)
        if export.scope == "own":
            return {t for t, who in self.tickets if who == export.creator}
        return {t for t, _ in self.tickets}

    def run_worker(self, data: st.DataObject) -> None:
        """The real worker function takes a queued export: claim, eligibility, read, publish."""
        queued = [e for e, m in self.exports.items() if m.state == "queued"]
        export = self.exports[data.draw(st.sampled_from(queued))]
        self.maybe_revoke(data, export)
        outcome = self.run(run_export(runner(self.world.settings, self.world.db), uid(export.id), uid(self.org_id)))
        role = self.roles.get(export.creator)
        if export.state == "cancelled":
            expected = "not_claimed"  # cancelled by the role change or removal just made
        elif self.state == "deleting":
            expected = "org_deleting"
        elif role is None or (export.scope == "team" and role not in STAFF):
            expected = "access_revoked"
        else:
            expected = "completed"
        self.world.stats[f"worker {outcome}"] += 1
        assert outcome == expected, (outcome, expected, export, role, self.state)
        if outcome == "completed":
            export.state, export.expected = "completed", frozenset(self.visible_rows(export))
        elif outcome != "not_claimed":
            export.state, export.error = "failed", outcome

    def cancel_or_delete_export(self, data: st.DataObject) -> None:
        """Someone (mostly its owner) DELETEs an export: a queued one is cancelled, a finished one deleted."""
        export = self.exports[data.draw(st.sampled_from([e for e, m in self.exports.items() if not m.deleted]))]
        who = data.draw(st.one_of(st.just(export.creator), st.sampled_from(sorted(self.users))))
        r = self.call("DELETE", f"/exports/{export.id}", who)
        if who != export.creator and self.roles.get(who) in ("owner", "admin"):
            # An owner or admin stops another member's export, or takes its result away (SPEC §12).
            self.expect(r, 204)
            if export.state in ("queued", "running"):
                export.state, export.error = "cancelled", "cancelled_by_admin"
            elif export.state == "completed":
                export.revoked = True
            return None
        # Status, list and delete are for current members; anyone else's export is unknown to them.
        if who != export.creator or who not in self.roles:
            return self.expect(r, 404, "not_found")
        self.expect(r, 204)
        if export.state in ("queued", "running"):
            export.state, export.error = "cancelled", "cancelled"
        else:
            export.deleted = True

    def advance_clock_past_ttl(self, data: st.DataObject) -> None:
        """A completed export's expiresAt passes (set by the owner of the database: the clock moved on)."""
        live = [e for e, m in self.exports.items() if m.state == "completed" and not m.expired]
        eid = data.draw(st.sampled_from(live))
        with psycopg.connect(self.world.owner_url, autocommit=True) as conn:
            conn.execute("UPDATE export_jobs SET expires_at = now() - interval '1 second' WHERE id = %s", (eid,))
        self.exports[eid].expired = True

    def run_cleanup(self, data: st.DataObject) -> None:
        """The cleanup job: expired results lose their bytes; the answers stay the same."""
        self.run(cleanup(self.world.db, PgResultStore(self.world.db)))

    def download_refusal(self, who: str, export: ExportModel) -> tuple[int, str] | None:
        """SPEC §6, in its order; None when the download is allowed."""
        if who != export.creator or export.deleted:
            return 404, "not_found"
        role = self.roles.get(who)
        if role is None or (export.scope == "team" and role not in STAFF):
            return 403, "access_revoked"
        if self.state == "deleting":
            return 409, "org_deleting"
        if export.state in ("queued", "running"):
            return 409, "export_not_ready"
        if export.state in ("failed", "cancelled"):
            return 409, "export_failed"
        if export.revoked:
            return 410, "export_revoked"
        if export.expired:
            return 410, "export_expired"
        return None

    def download(self, data: st.DataObject) -> None:
        """Anyone tries to download any export of the org."""
        export = self.exports[data.draw(st.sampled_from(list(self.exports)))]
        # Mostly the export's owner (the interesting answers), sometimes anyone.
        who = data.draw(st.one_of(st.just(export.creator), st.sampled_from(sorted(self.users))))
        self.maybe_revoke(data, export)
        r = self.call("GET", f"/exports/{export.id}/result", who)
        refusal = self.download_refusal(who, export)
        if refusal is not None:
            self.expect(r, *refusal)
            if refusal[1] == "export_failed":
                assert r.json()["errorCode"] == export.error, (r.json(), export)
            if refusal[1] == "export_not_ready":
                assert r.headers["retry-after"], r.headers
            return
        self.expect(r, 200)
        self.world.stats["download 200"] += 1
        rows = self.rows_of(export, r.content)
        assert export.expected is not None
        assert rows == export.expected, (sorted(rows ^ export.expected), export)
        # Only rows this scope may see now (rows are never deleted in this model, so the set only grows).
        assert rows <= self.visible_rows(export), export

    def rows_of(self, export: ExportModel, content: bytes) -> set[str]:
        """The markers in a downloaded file, each exactly once; none of another org."""
        text = content.decode("utf-8")
        found = MARK.findall(text)
        foreign = {m for m in found if not m.startswith(f"MK-{self.tag}-")}
        assert not foreign, f"rows of another org in {export}: {sorted(foreign)[:5]}"
        if export.kind == "snapshot":
            body = json.loads(content)
            assert body["organizationId"] == self.org_id
            names = [p["name"] for p in body["projects"]] + [t["title"] for t in body["tasks"]]
        else:
            records = list(csv.reader(io.StringIO(text.removeprefix("\ufeff"), newline="")))
            names = [rec[1] for rec in records[1:]]
        counts = Counter(names)
        assert all(n == 1 for n in counts.values()), counts
        assert set(found) == set(names), (found, names)
        return set(names)

    def status_says_can_download(self, data: st.DataObject) -> None:
        """The status route's canDownload agrees with the download rules (for a member reading their own)."""
        mine = [e for e, m in self.exports.items() if m.creator in self.roles and not m.deleted]
        export = self.exports[data.draw(st.sampled_from(mine))]
        r = self.call("GET", f"/exports/{export.id}", export.creator)
        self.expect(r, 200)
        body = r.json()
        assert body["state"] == export.state, (body, export)
        assert body["canDownload"] is (self.download_refusal(export.creator, export) is None), (body, export)

    def possible(self) -> dict[str, bool]:
        """Which actions can act in the model's current state."""
        exports = list(self.exports.values())
        return {
            "add_member": any(k not in self.roles for k in self.users),
            "change_role": True,
            "remove_member": any(k != "owner" for k in self.roles),
            "open_ticket": True,
            "lifecycle": True,
            "request_export": True,
            "run_worker": any(m.state == "queued" for m in exports),
            "download": bool(exports),
            "status_says_can_download": any(m.creator in self.roles and not m.deleted for m in exports),
            "cancel_or_delete_export": any(not m.deleted for m in exports),
            "advance_clock_past_ttl": any(m.state == "completed" and not m.expired for m in exports),
            "run_cleanup": any(m.expired for m in exports),
        }

    @rule(data=st.data())
    def step(self, data: st.DataObject) -> None:
        """One action, drawn with weights among those that can act now (exports matter most)."""
        possible = self.possible()
        choices = [name for name, weight in WEIGHTS.items() if possible[name] for _ in range(weight)]
        action = data.draw(st.sampled_from(choices), label="action")
        self.world.stats[f"step {action}"] += 1
        getattr(self, action)(data)

    @invariant()
    def org_state_matches(self) -> None:
        """The org's state is the model's (the owner can always read it)."""
        if not self.org_id:
            return
        r = self.call("GET", "", "owner")
        assert r.status_code == 200 and r.json()["state"] == self.state, (r.text, self.state)


@pytest.fixture(scope="module")
async def model_api(settings: Settings, users: UserFactory) -> AsyncIterator[Api]:
    """The real app with the rate limits out of the way (they have their own tests): the model runs many exports."""
    limits = tuned(settings, export_rate_limit=100_000, export_user_rate_limit=100_000)
    async with AsyncTestClient(app=create_app(limits)) as client:
        yield Api(client, users)


async def test_exports_and_downloads_follow_the_model(
    model_api: Api, db: Database, settings: Settings, owner_url: str
) -> None:
    # Org B: its rows carry markers too, and none may ever show up in org A's files.
    other = await model_api.org("Model other")
    tag_b = uuid.uuid4().hex[:8]
    foreign = [marker(tag_b, "member", i) for i in range(3)]
    await add_tickets(db, other.id, other.member, foreign)
    await add_project(db, other.id, marker(tag_b, "project", 0), [marker(tag_b, "task", 0)])

    world = World(asyncio.get_running_loop(), model_api, db, settings, owner_url, frozenset(foreign))
    machine = type("BoundSpaceModel", (SpaceModel,), {"world": world})
    config = hyp_settings(
        max_examples=EXAMPLES,
        stateful_step_count=STEPS,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
        # Every step is real HTTP and SQL: shrinking a failure would take many minutes. The failing run's
        # steps are printed as they are.
        phases=[Phase.explicit, Phase.reuse, Phase.generate],
        print_blob=False,
    )
    try:
        await asyncio.wait_for(asyncio.to_thread(run_state_machine_as_test, machine, settings=config), 100)
    finally:
        world.stopped = True
        # No worker consumes this app's queue: leave no entries behind for a later test's worker.
        with psycopg.connect(owner_url, autocommit=True) as conn:
            conn.execute("DELETE FROM saq.saq_jobs WHERE key = ANY(%s)", (world.created,))
            conn.execute(
                "UPDATE export_jobs SET state = 'cancelled', error_code = 'cancelled', lease_expires_at = NULL"
                " WHERE id = ANY(%s::uuid[]) AND state IN ('queued', 'running')",
                (world.created,),
            )
    print(f"model run: {dict(sorted(world.stats.items()))}")
    # The runs reached the interesting places, not only refusals.
    assert world.stats["download 200"] > 0 and world.stats["worker completed"] > 0, world.stats
    assert world.stats["403 access_revoked"] + world.stats["worker access_revoked"] > 0, world.stats
