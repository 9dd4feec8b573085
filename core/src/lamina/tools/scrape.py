"""Reading a Lamina server's ``/metrics``: the one reader behind ``lamina status`` and ``lamina ab report``."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable

import httpx
from prometheus_client.parser import text_string_to_metric_families

Labels = dict[str, str]
Samples = dict[str, list[tuple[Labels, float]]]
"""Sample name (``lamina_requests_total``, ``..._bucket``) → its (labels, value) pairs."""
TIMEOUT_S = 5.0
"""Seconds a scrape may take."""


class ScrapeError(Exception):
    """The URL cannot be reached or does not serve Lamina metrics."""


def parse_metrics(text: str) -> Samples:
    """Prometheus text → :data:`Samples`; ``ValueError`` if it is not Prometheus text."""
    samples: Samples = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[sample.name].append((sample.labels, sample.value))
    return dict(samples)


def _first_line(exc: Exception) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0]


def fetch(client: httpx.Client, url: str, path: str) -> httpx.Response:
    """GET ``url`` + ``path``; :class:`ScrapeError` when the server cannot be reached."""
    try:
        return client.get(f"{url}{path}")
    except httpx.HTTPError as exc:
        raise ScrapeError(f"cannot reach {url}: {_first_line(exc)}") from None


def not_lamina(url: str, exc: Exception) -> ScrapeError:
    """The error for a server whose answer (``exc`` while reading it) is not a Lamina server's."""
    return ScrapeError(f"{url} does not serve Lamina metrics: {_first_line(exc)}")


def fetch_metrics(client: httpx.Client, url: str) -> Samples:
    """``url``'s ``/metrics``, parsed; :class:`ScrapeError` if that fails."""
    response = fetch(client, url, "/metrics")
    try:
        response.raise_for_status()
        return parse_metrics(response.text)
    except (httpx.HTTPStatusError, ValueError) as exc:
        raise not_lamina(url, exc) from None


def histogram_quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float | None:
    """The ``q``-quantile (0 to 1) of a histogram's cumulative ``(le, count)`` buckets, by linear
    interpolation within the bucket it falls in, as Prometheus' ``histogram_quantile``.

    None when there are no observations; the highest finite bound when it falls in ``+Inf``.
    """
    ordered = sorted(buckets)
    if not ordered or ordered[-1][1] <= 0:
        return None
    rank = q * ordered[-1][1]
    index = next(i for i, (_, count) in enumerate(ordered) if count >= rank)
    lower, below = ordered[index - 1] if index else (0.0, 0.0)
    upper, count = ordered[index]
    if math.isinf(upper):
        return lower
    return lower + (upper - lower) * (rank - below) / (count - below) if count > below else upper
