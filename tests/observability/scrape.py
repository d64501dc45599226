"""Reading Prometheus text the way Prometheus does (prometheus_client's own parser), for the metrics tests."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

Sample = tuple[str, frozenset[tuple[str, str]]]


def parse(text: str) -> dict[Sample, float]:
    """Every sample of an exposition: (name, labels) -> value."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: dict[Sample, float], name: str, **labels: str) -> float:
    """One sample's value; 0 when the series does not exist (yet)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def delta(before: dict[Sample, float], after: dict[Sample, float], name: str, **labels: str) -> float:
    """How much a sample moved between two scrapes."""
    return value(after, name, **labels) - value(before, name, **labels)


def label_values(samples: Iterable[Sample]) -> set[str]:
    """Every label value of every sample."""
    return {v for _, labels in samples for _, v in labels}


async def scrape(client: Any) -> dict[Sample, float]:
    """GET /metrics (no token needed) and parse it."""
    r = await client.get("/metrics")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain"), r.headers
    return parse(r.text)
