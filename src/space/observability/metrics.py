"""Prometheus metrics of the API and the worker (SPEC §16), in prometheus_client's default registry.

The counters and histograms are process-wide, as prometheus_client intends: `space up` (API and worker in one
process) reports both on its `/metrics`, and each `space worker` reports its own on SPACE_WORKER_METRICS_PORT.
The queue's depth is not a process's memory: it is read from the ledger at every scrape, so any host reports
the same numbers. No label carries an org, a user or an export id (every label value is from a fixed set).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from space.db import Database, UnitOfWork
from space.exports import ledger

log = logging.getLogger("space.metrics")

LEDGER_TIMEOUT_SECONDS = 5.0
"""How long a scrape waits for the ledger's queue numbers before it reports without them."""

EXPORTS = Counter(
    "space_exports",
    "Exports that ended, by kind and outcome (completed, or the errorCode they failed with).",
    ["kind", "outcome"],
)
EXPORT_DURATION = Histogram(
    "space_export_duration_seconds",
    "Time a completed export's last execution took, from its claim to its publish.",
    ["kind"],
    buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800),
)
EXPORT_ROWS = Counter("space_export_rows", "Rows written by completed exports.")
EXPORT_BYTES = Counter("space_export_bytes", "Bytes stored by completed exports.")
LEASE_LOST = Counter(
    "space_lease_lost",
    "Executions whose lease ran out before they finished (found by the claim that took over, or by worker_lost).",
)
DOWNLOADS = Counter(
    "space_downloads", "Downloads that started (streamed, or handed to the object store), by how authorized.", ["via"]
)
DOWNLOAD_BYTES = Counter("space_download_bytes", "Result bytes sent to downloading clients.")
DOWNLOADS_IN_FLIGHT = Gauge("space_downloads_in_flight", "Downloads streaming now in this process.")


def export_ended(kind: str, outcome: str) -> None:
    """Count an export that ended: `completed`, or the errorCode it failed with."""
    EXPORTS.labels(kind=kind, outcome=outcome).inc()


def export_completed(kind: str, seconds: float, rows: int, size: int) -> None:
    """Count a published export with its duration, rows and bytes."""
    export_ended(kind, "completed")
    EXPORT_DURATION.labels(kind=kind).observe(seconds)
    EXPORT_ROWS.inc(rows)
    EXPORT_BYTES.inc(size)


def lease_lost() -> None:
    """Count an execution that lost its lease."""
    LEASE_LOST.inc()


class LedgerGauges(Collector):
    """`space_exports_queued`, `space_exports_running` and `space_exports_oldest_queued_seconds` from the ledger.

    `refresh` reads them (an async query, before each scrape); `collect` reports what the last refresh read, and
    nothing when it failed: a missing series is what `absent()` alerts on, a stale number would lie.
    """

    def __init__(self) -> None:
        self.stats: ledger.QueueStats | None = None

    async def refresh(self, db: Database) -> None:
        """Read the queue's numbers from the ledger (bounded by LEDGER_TIMEOUT_SECONDS); on failure, forget them."""
        try:
            async with asyncio.timeout(LEDGER_TIMEOUT_SECONDS), UnitOfWork(db.sessionmaker) as uow:
                self.stats = await ledger.queue_stats(uow.session)
        except Exception as exc:
            self.stats = None
            log.warning("metrics: the ledger's queue numbers are unavailable: %s", type(exc).__name__)

    def collect(self) -> Iterable[Metric]:
        """The gauges of the last refresh."""
        stats = self.stats
        if stats is None:
            return
        yield GaugeMetricFamily(
            "space_exports_queued", "Exports waiting for a worker (queued, or their lease ran out).", stats.waiting
        )
        yield GaugeMetricFamily("space_exports_running", "Exports running under a live lease.", stats.running)
        yield GaugeMetricFamily(
            "space_exports_oldest_queued_seconds",
            "How long the oldest waiting export has waited (0 when none waits).",
            stats.oldest_waiting_seconds or 0.0,
        )


LEDGER = LedgerGauges()
REGISTRY.register(LEDGER)


async def render(db: Database, accept: str | None) -> tuple[bytes, str]:
    """This process's metrics and their Content-Type, with the queue's numbers read from the ledger now.

    OpenMetrics when `accept` asks for it, else the Prometheus text format: prometheus_client's own choice, the
    one its HTTP server (the worker's endpoint) makes, so the API and the worker answer a scraper alike."""
    await LEDGER.refresh(db)
    encode, content_type = choose_encoder(accept or "")
    return encode(REGISTRY), content_type


class _RefreshingRegistry(Collector):
    """The default registry, refreshing the ledger gauges first; what the worker's metrics thread serves."""

    def __init__(self, refresh: Callable[[], None]) -> None:
        self._refresh = refresh

    def collect(self) -> Iterator[Metric]:
        self._refresh()
        yield from REGISTRY.collect()


class WorkerMetricsServer:
    """`space worker`'s /metrics on its own port: prometheus_client's HTTP server, in a thread of its own.

    The ledger's query runs on the worker's event loop (its engine belongs there); the server thread waits for it.
    """

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._server: Any = None
        self._thread: Any = None

    def start(self, db: Database) -> None:
        """Listen now. A port that can't be bound (a second worker on the host with the default port) leaves this
        worker without its endpoint, with a warning: it still builds exports, which matter more than its metrics."""
        loop = asyncio.get_running_loop()

        def refresh() -> None:
            future = asyncio.run_coroutine_threadsafe(LEDGER.refresh(db), loop)
            try:
                future.result(LEDGER_TIMEOUT_SECONDS + 1)
            except Exception:
                future.cancel()
                LEDGER.stats = None

        try:
            self._server, self._thread = start_http_server(
                self.port,
                addr=self.host,
                registry=_RefreshingRegistry(refresh),
            )
        except OSError as exc:
            log.warning(
                "not serving this worker's metrics on %s:%d: %s (give each worker on a host its own"
                " SPACE_WORKER_METRICS_PORT, or 0 for none)",
                self.host,
                self.port,
                exc.strerror or exc,
            )
            return
        log.info("worker metrics at http://%s:%d/metrics", self.host, self.port)

    def stop(self) -> None:
        """Stop listening."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
