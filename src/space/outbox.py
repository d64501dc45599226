"""The outbox every outbound channel shares: what is owed is a row, written in the transaction that owes it; each
attempt is a queue entry enqueued after a commit; a claim fenced by the attempt count makes one worker the sender
of one attempt; a failed attempt waits its backoff; a sweeper finds rows whose entry was lost or whose worker died.

Webhook deliveries are its first user (`webhooks.outbox.DELIVERIES`). A second or third channel (email, SPEC §19;
a customer's bucket, §22) is a table with the `Owed` columns, a SECURITY DEFINER function listing its due rows
across orgs (`(limit integer) -> (id, org_id, attempts)`, like `space_webhooks_due_deliveries`), an `Outbox` that
names them with its retry policy, and its own attempt: what it sends, and what it logs (`claim` -> send ->
`settle`). No transaction is open while an attempt is in flight: `claim` and `settle` are each the caller's
transaction, around the send.

Attempts run in the outbound lane (`space.queue.OUTBOUND_SUFFIX`, `space.worker`), never in an export's slot, and
one org has at most `outbound_org_concurrency` of them in flight over every channel: each `Outbox` registers
itself (`registered`), and a claim counts the org's attempts in flight in every registered table, under the
org's outbound lock. At the cap, the claim takes nothing and raises `OrgBusy`; the channel's job, wrapped by
`deferring`, goes back on the queue a little later, with no attempt counted (docs/decisions/0088).

A table of rows that have no org (a user's own, `personal_notifications`) names its key column as the outbox's
`scope` (`user_id`): its rows are found, claimed and settled by `(id, user_id)`, and its attempts count against
no org's cap, as there is no org to be fair between (docs/decisions/0103).
"""

from __future__ import annotations

import datetime as dt
import enum
import functools
import logging
import math
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from saq import Job, Queue
from sqlalchemy import ColumnElement, Row, func, select, text, update
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Mapped, mapped_column

from space.db import Database, UnitOfWork
from space.db.base import created_at
from space.db.locks import lock_org_outbound, lock_user_outbound
from space.queue import put_back

AnyRow = Row[*tuple[Any, ...]]
"""A row of the columns a channel asked for."""

T = TypeVar("T")

ORG_SCOPE = "org_id"
"""The scope of a tenant table's outbox: its rows are an org's, and count against the org's cap."""

DEFER_SECONDS = (2, 3, 5)
"""How long an attempt refused at its org's cap waits before it looks again: the first time, the second, and every
later one. Short, as an attempt in flight ends within a delivery timeout (5 s) or so; whole seconds of at least 2,
as SAQ schedules a retry to the second, rounded down."""
DEFERRALS = "deferrals"
"""The key of `job.meta` that counts an attempt's deferrals (to lengthen its wait)."""


class State(enum.StrEnum):
    """`pending` until an attempt is made, `sending` while one is in flight, then delivered or failed."""

    pending = "pending"
    sending = "sending"
    delivered = "delivered"
    failed = "failed"


class Owed:
    """The columns of an outbox row (a mixin of the channel's model): where its attempts stand."""

    if TYPE_CHECKING:
        # The model's own (every table has it, and its `Outbox.scope` column): declared for the statements only.
        id: Mapped[uuid.UUID]

    state: Mapped[str] = mapped_column(default=State.pending.value)
    attempts: Mapped[int] = mapped_column(default=0)
    next_attempt_at: Mapped[dt.datetime] = created_at()
    lease_expires_at: Mapped[dt.datetime | None]
    finished_at: Mapped[dt.datetime | None]


@dataclass(frozen=True)
class Settled:
    """How an attempt moved its row on: delivered, failed, or retrying after `delay` seconds; `row` holds the
    columns `settle` was asked to return."""

    result: str
    delay: float
    row: AnyRow

    @property
    def retrying(self) -> bool:
        """Whether another attempt is owed (after `delay`)."""
        return self.result == "retrying"


class OrgBusy(Exception):
    """The org has its `outbound_org_concurrency` attempts in flight: this attempt waits; nothing was claimed."""


@dataclass(frozen=True)
class Outbox:
    """One channel's outbox: its table, its queue entries, and its retry policy. Registered on creation."""

    table: type[Owed]
    job_function: str
    """The SAQ function that makes one attempt; its keywords are `id_kwarg` and `scope`."""
    id_kwarg: str
    key_prefix: str
    """Queue keys are `<key_prefix>:<row id>:<attempt>`."""
    due_function: str
    """The SQL function the sweeper reads the due rows of every org (or user) from: `(limit) -> (id, scope,
    attempts)`."""
    max_attempts: int
    lease_seconds: int
    """How long a claimed attempt is the claimer's; after it the sweeper may start the attempt again."""
    backoff_factor: int
    job_timeout_seconds: int
    """SAQ's bound on one attempt's job."""
    log: logging.Logger
    noun: str
    """What a row is called in log lines ("webhook delivery")."""
    scope: str = ORG_SCOPE
    """The column that keys a row beside its `id`, and the job's second keyword: `org_id` (a tenant table, its
    attempts counted against the org's outbound cap) or another (`user_id`: a row of no org, and no cap)."""

    def __post_init__(self) -> None:
        # Spliced into the sweeper's SQL: a name, never text from outside.
        if not re.fullmatch(r"[a-z_][a-z0-9_]*", self.due_function):
            raise ValueError(f"not a function name: {self.due_function!r}")
        if not hasattr(self.table, self.scope):
            raise ValueError(f"{self.table.__name__} has no column {self.scope!r}")
        # Every channel's attempts count against one cap; a table is counted once however often it is named.
        _REGISTRY.setdefault(self.table, self)

    @property
    def org_capped(self) -> bool:
        """Whether a row is an org's, its attempts counted against the org's `outbound_org_concurrency`."""
        return self.scope == ORG_SCOPE

    def scope_of(self, row: Owed) -> uuid.UUID:
        """The row's scope value (its org, or its user)."""
        value: uuid.UUID = getattr(row, self.scope)
        return value

    def this_row(self, row_id: uuid.UUID, scope_id: uuid.UUID) -> tuple[ColumnElement[bool], ...]:
        """The conditions that name one row: its id and its scope."""
        t = self.table
        return (t.id == row_id, getattr(t, self.scope) == scope_id)

    def backoff(self, attempt: int, base: float) -> float:
        """Seconds to wait after failed attempt `attempt` (from 1): base, factor x base, factor² x base, ..."""
        return base * float(self.backoff_factor ** (attempt - 1))

    # --- queue entries ----------------------------------------------------------------------------------------

    def job(self, row_id: uuid.UUID, scope_id: uuid.UUID, *, attempt: int, delay: float) -> Job:
        """The job of one attempt, keyed by row and attempt so a scheduled retry never collides with its predecessor."""
        return Job(
            function=self.job_function,
            kwargs={self.id_kwarg: str(row_id), self.scope: str(scope_id)},
            key=f"{self.key_prefix}:{row_id}:{attempt}",
            # SAQ schedules in whole seconds; rounding up never runs an attempt before its backoff. Never 0 ("at
            # once"): SAQ replaces a finished entry of the same key only by a later `scheduled`, and the sweeper may
            # need to enqueue a key whose earlier entry ended without claiming anything.
            scheduled=math.ceil(time.time() + delay) if delay > 0 else int(time.time()),
            timeout=self.job_timeout_seconds,
            # The row's own attempt count is the bound; SAQ only carries it.
            retries=1,
        )

    async def enqueue(
        self, queue: Queue, row_id: uuid.UUID, scope_id: uuid.UUID, *, attempt: int, delay: float
    ) -> None:
        """Enqueue one attempt after a commit; a broker error is logged, not raised (the sweeper sends it later)."""
        try:
            await queue.enqueue(self.job(row_id, scope_id, attempt=attempt, delay=delay))
        except Exception:
            self.log.exception("enqueue of %s %s failed; the sweeper will send it", self.noun, row_id)

    async def owe(self, uow: UnitOfWork, queue: Queue | None, rows: Sequence[Owed]) -> None:
        """Add `rows` to the caller's transaction; their first attempts are enqueued on `queue` after its commit
        (with None, or when that enqueue fails, the sweeper sends them)."""
        uow.session.add_all(rows)
        await uow.session.flush()
        if queue is None:
            return
        owed = [(row.id, self.scope_of(row)) for row in rows]

        async def enqueue() -> None:
            for row_id, scope_id in owed:
                await self.enqueue(queue, row_id, scope_id, attempt=1, delay=0.0)

        uow.after_commit(enqueue)

    # --- one attempt ------------------------------------------------------------------------------------------

    def _claimable(self) -> Any:
        t = self.table
        return (t.state == State.pending.value) | (
            (t.state == State.sending.value) & (t.lease_expires_at < text("clock_timestamp()"))
        )

    async def claim(
        self, session: AsyncSession, row_id: uuid.UUID, scope_id: uuid.UUID, *columns: Any, org_concurrency: int
    ) -> AnyRow | None:
        """Take the row's next attempt: its attempt number, then `columns`; None when it is done, deleted, or another
        worker has it. A row whose last attempt's worker died is failed instead. Raises OrgBusy, and changes nothing,
        while the org has `org_concurrency` attempts in flight over every registered channel (for a row of no org,
        its user over the channels of such rows).

        The session's tenant must be the org's (the user's, for a row of no org); the caller's transaction commits
        the claim before anything is sent.
        """
        t = self.table
        # The scope's claims queue here, so two of them can't both count room for one more.
        if self.org_capped:
            await lock_org_outbound(session, scope_id)
        else:
            await lock_user_outbound(session, scope_id)
        this_row = self.this_row(row_id, scope_id)
        # SKIP LOCKED: a row held by another transaction (another claim, a settle, its endpoint's deletion) is
        # that one's business; this claim takes nothing rather than waiting behind it.
        locked = (
            await session.execute(
                select(t.attempts).where(*this_row, self._claimable()).with_for_update(skip_locked=True)
            )
        ).first()
        if locked is None:
            return None
        if locked.attempts >= self.max_attempts:
            # A worker died during the last attempt: nothing is left to try.
            await session.execute(
                update(t)
                .where(*this_row)
                .values(state=State.failed.value, lease_expires_at=None, finished_at=text("clock_timestamp()"))
                .execution_options(synchronize_session=False)
            )
            return None
        if await in_flight(session, scope_id, self.scope) >= org_concurrency:
            raise OrgBusy(
                f"{self.scope.removesuffix('_id')} {scope_id} has {org_concurrency} outbound attempts in flight"
            )
        row = (
            await session.execute(
                update(t)
                # The row is locked, so it still holds the attempt read; naming it keeps the fence in the statement.
                .where(*this_row, t.attempts == locked.attempts)
                .values(
                    state=State.sending.value,
                    attempts=t.attempts + 1,
                    lease_expires_at=text(f"clock_timestamp() + interval '{int(self.lease_seconds)} seconds'"),
                )
                .returning(t.attempts, *columns)
                .execution_options(synchronize_session=False)
            )
        ).first()
        return row

    async def settle(
        self,
        session: AsyncSession,
        row_id: uuid.UUID,
        scope_id: uuid.UUID,
        attempt: int,
        *,
        ok: bool,
        final: bool,
        retry_base: float,
        columns: Sequence[Any] = (),
    ) -> Settled | None:
        """Move the row on after attempt `attempt` (delivered; failed when `final` or the last; else pending until its
        backoff from `retry_base` seconds), fenced by the attempt; None when it is no longer this attempt's."""
        if ok:
            state, delay, result = State.delivered, 0.0, "delivered"
        elif final or attempt >= self.max_attempts:
            state, delay, result = State.failed, 0.0, "failed"
        else:
            state, delay, result = State.pending, self.backoff(attempt, retry_base), "retrying"
        done = state is not State.pending
        t = self.table
        row = (
            await session.execute(
                update(t)
                .where(*self.this_row(row_id, scope_id), t.attempts == attempt, t.state == State.sending.value)
                .values(
                    state=state.value,
                    lease_expires_at=None,
                    next_attempt_at=text("clock_timestamp() + make_interval(secs => :delay)").bindparams(delay=delay),
                    finished_at=text("clock_timestamp()") if done else None,
                )
                .returning(t.id, *columns)
                .execution_options(synchronize_session=False)
            )
        ).first()
        if row is None:
            # Deleted meanwhile (a webhook's endpoint), or the lease ran out and the attempt was started again elsewhere.
            self.log.info("%s %s attempt %d no longer ours; not recorded", self.noun, row_id, attempt)
            return None
        return Settled(result, delay, row)

    # --- the sweeper ------------------------------------------------------------------------------------------

    async def sweep(self, db: Database, queue: Queue, limit: int) -> int:
        """Enqueue rows whose entry was lost (overdue) or whose worker died (lease ran out); how many."""
        async with UnitOfWork(db.sessionmaker) as uow:
            rows = (await uow.session.execute(text(f"SELECT * FROM {self.due_function}(:n)"), {"n": limit})).all()
        for row_id, scope_id, attempts in rows:
            # The key names the attempt the job will make: a scheduled retry still waiting is not doubled.
            await self.enqueue(queue, row_id, scope_id, attempt=attempts + 1, delay=0.0)
        return len(rows)


# --- every channel: the registry, the org's attempts in flight, and the wait at the cap --------------------------

_REGISTRY: dict[type[Owed], Outbox] = {}


def registered() -> tuple[Outbox, ...]:
    """Every channel's outbox, in the order they were made (each module that makes one is imported by the worker)."""
    return tuple(_REGISTRY.values())


async def in_flight(session: AsyncSession, org_id: uuid.UUID, scope: str = ORG_SCOPE) -> int:
    """The org's attempts in flight over every registered channel: rows `sending` whose lease has not run out.
    With `scope` "user_id", a person's over the channels of rows of no org (capped like an org's: SPEC §25's lane
    is not one person's either).

    A plain count under the scope's tenant context (RLS shows it its own rows, all it needs).
    """
    counts = [
        select(func.count())
        .select_from(o.table)
        .where(
            getattr(o.table, o.scope) == org_id,
            o.table.state == State.sending.value,
            o.table.lease_expires_at >= text("clock_timestamp()"),
        )
        .scalar_subquery()
        for o in registered()
        if o.scope == scope
    ]
    if not counts:
        return 0
    total: ColumnElement[Any] = counts[0]
    for count in counts[1:]:
        total = total + count
    return int(await session.scalar(select(total)) or 0)


def deferring(function: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    """A channel's attempt job that, refused at its org's cap (OrgBusy), goes back on its queue after DEFER_SECONDS:
    a wait, not a failure; neither the row's attempt count nor SAQ's counts it. Keeps the function's name."""

    @functools.wraps(function)
    async def run(ctx: Any, **kwargs: Any) -> T:
        try:
            return await function(ctx, **kwargs)
        except OrgBusy as busy:
            job: Job | None = ctx.get("job")
            if job is None:
                raise
            deferrals = int(job.meta.get(DEFERRALS, 0))
            job.meta[DEFERRALS] = deferrals + 1
            raise put_back(job, DEFER_SECONDS[min(deferrals, len(DEFER_SECONDS) - 1)], str(busy)) from None

    return run
