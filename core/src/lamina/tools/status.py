"""``lamina status URL``: a one-screen summary of a running Lamina server, refreshed in place.

It reads ``/ready`` and ``/metrics`` (:mod:`lamina.server.metrics`, :mod:`lamina.kernel.slo`) every
``--interval`` seconds. :func:`summarize` turns two scrapes into plain data (rates are the
counter deltas between them); :func:`render` draws that with ``rich``, a well-kept library for
live-updating terminal tables, instead of hand-written ANSI escapes.
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime

import attrs
import httpx
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from lamina.kernel import metric_names as m
from lamina.tools.scrape import TIMEOUT_S, Samples, ScrapeError, fetch, fetch_metrics, histogram_quantile, not_lamina
from lamina.tools.terminal import fmt_num, fmt_pct, fmt_secs, rich_table

@attrs.frozen
class Snapshot:
    """One scrape of a server."""

    url: str
    at: float  # time.monotonic() of the scrape
    ready: bool
    draining: bool
    samples: Samples


@attrs.frozen
class Replica:
    name: str
    up: bool
    circuit_open: bool
    outstanding: float
    queue: float
    kv_usage: float
    tokens_per_s: float


@attrs.frozen
class Load:
    running: float
    waiting: float
    kv_usage: float
    requests_per_s: float | None  # None until two scrapes
    tokens_per_s: float | None
    drafts_kept: float | None  # share of the tokens drafted between the scrapes that the model agreed with


@attrs.frozen
class Slo:
    name: str
    threshold: float
    budget: float
    burn: dict[str, float]  # window ("5m") → burn rate


@attrs.frozen
class Arm:
    label: str  # "" for requests outside any split (e.g. refused before routing)
    requests: float
    error_share: float | None  # share of 5xx
    ttft_p50: float | None
    ttft_p95: float | None
    e2e_p95: float | None


@attrs.frozen
class Summary:
    url: str
    ready: bool
    draining: bool
    replicas: list[Replica]
    load: Load
    slos: list[Slo]
    arms: list[Arm]  # empty outside A/B splits


def scrape(client: httpx.Client, url: str) -> Snapshot:
    """Read ``url``'s ``/ready`` and ``/metrics``; :class:`ScrapeError` if that fails."""
    ready = fetch(client, url, "/ready")
    samples = fetch_metrics(client, url)
    try:
        state = ready.json()
    except ValueError as exc:
        raise not_lamina(url, exc) from None
    if m.BACKEND_UP not in samples or not isinstance(state, dict):
        raise ScrapeError(f"{url} does not serve Lamina metrics (no lamina_backend_up in /metrics)")
    return Snapshot(url, time.monotonic(), bool(state.get("ready")), bool(state.get("draining")), samples)


def _by(samples: Samples, name: str, label: str) -> dict[str, float]:
    """``name``'s values summed per value of ``label``, in order of appearance."""
    out: dict[str, float] = defaultdict(float)
    for labels, value in samples.get(name, ()):
        out[labels.get(label, "")] += value
    return dict(out)


def _total(samples: Samples, name: str) -> float:
    return sum(value for _, value in samples.get(name, ()))


def rate(current: Snapshot, previous: Snapshot | None, name: str) -> float | None:
    """Per-second increase of counter ``name`` (summed over labels) between two scrapes.

    None without a previous scrape; after a counter reset (a restarted server) the current
    total counts as the increase, as Prometheus' ``rate()`` does.
    """
    if previous is None or current.at <= previous.at:
        return None
    now, before = _total(current.samples, name), _total(previous.samples, name)
    return (now - before if now >= before else now) / (current.at - previous.at)


def _quantile(samples: Samples, histogram: str, arm: str, q: float) -> float | None:
    buckets = [(float(labels["le"]), value) for labels, value in samples.get(f"{histogram}_bucket", ())
               if labels.get("arm", "") == arm]
    return histogram_quantile(q, buckets)


def _replicas(samples: Samples) -> list[Replica]:
    up, circuit, outstanding, queue, kv, tokens = (
        _by(samples, name, "backend")
        for name in (m.BACKEND_UP, m.BACKEND_CIRCUIT_OPEN, m.BACKEND_OUTSTANDING, m.BACKEND_QUEUE_DEPTH,
                     m.BACKEND_KV_USAGE, m.BACKEND_TOKENS_PER_S))
    return [Replica(name, up[name] > 0, circuit.get(name, 0.0) > 0, outstanding.get(name, 0.0),
                    queue.get(name, 0.0), kv.get(name, 0.0), tokens.get(name, 0.0)) for name in up]


def _slos(samples: Samples) -> list[Slo]:
    threshold = _by(samples, m.SLO_THRESHOLD, "slo")
    budget = _by(samples, m.SLO_ERROR_BUDGET, "slo")
    burn: dict[str, dict[str, float]] = defaultdict(dict)
    for labels, value in samples.get(m.SLO_BURN_RATE, ()):
        burn[labels["slo"]][labels["window"]] = value
    return [Slo(name, threshold[name], budget.get(name, 0.0), burn[name]) for name in threshold]


def _arms(samples: Samples) -> list[Arm]:
    requests = _by(samples, m.REQUESTS + "_total", "arm")
    if all(arm == "" for arm in requests):
        return []
    errors: dict[str, float] = defaultdict(float)
    for labels, value in samples.get(m.REQUESTS + "_total", ()):
        if int(labels.get("status", "0")) >= 500:
            errors[labels.get("arm", "")] += value
    return [Arm(arm, n, errors[arm] / n if n else None,
                ttft_p50=_quantile(samples, m.TTFT, arm, 0.5),
                ttft_p95=_quantile(samples, m.TTFT, arm, 0.95),
                e2e_p95=_quantile(samples, m.E2E, arm, 0.95))
            for arm, n in sorted(requests.items(), key=lambda item: (item[0] == "", item[0]))]


def summarize(current: Snapshot, previous: Snapshot | None = None) -> Summary:
    """The screen's data from the latest scrape and, for rates, the one before it."""
    s = current.samples
    load = Load(running=_total(s, m.NUM_REQUESTS_RUNNING), waiting=_total(s, m.NUM_REQUESTS_WAITING),
                kv_usage=_total(s, m.KV_CACHE_USAGE),
                requests_per_s=rate(current, previous, m.REQUESTS + "_total"),
                tokens_per_s=rate(current, previous, m.GENERATION_TOKENS + "_total"),
                drafts_kept=_drafts_kept(current, previous))
    return Summary(current.url, current.ready, current.draining, _replicas(s), load, _slos(s), _arms(s))


def _drafts_kept(current: Snapshot, previous: Snapshot | None) -> float | None:
    drafted = rate(current, previous, m.SPEC_DECODE_DRAFT_TOKENS + "_total")
    kept = rate(current, previous, m.SPEC_DECODE_ACCEPTED_TOKENS + "_total")
    return kept / drafted if drafted and kept is not None else None


def _flag(text: str, bad: bool) -> Text:
    return Text(text, style="bold red" if bad else "green")


def _header(summary: Summary, interval: float | None, error: str | None) -> Text:
    state = ("stale", "bold red") if error else ("draining", "yellow") if summary.draining else \
        ("ready", "green") if summary.ready else ("not ready", "bold red")
    header = Text.assemble(("Lamina ", "bold"), summary.url, "  ", state,
                           f"  {datetime.now():%H:%M:%S}" + (f", every {interval:g}s" if interval else ""))
    if error:
        header.append(f"\n{error}; retrying", style="bold red")
    return header


def _replicas_table(replicas: Sequence[Replica]) -> Table:
    table = rich_table("Replicas", "backend", "up", "circuit", "outstanding", "queue", "KV", "tok/s")
    for r in replicas:
        table.add_row(r.name, _flag("yes" if r.up else "no", bad=not r.up),
                      _flag("open" if r.circuit_open else "closed", bad=r.circuit_open),
                      fmt_num(r.outstanding), fmt_num(r.queue), fmt_pct(r.kv_usage), fmt_num(r.tokens_per_s, "{:.1f}"))
    return table


def _load_table(load: Load) -> Table:
    table = rich_table("Load", "running", "waiting", "KV", "req/s", "tok/s", "drafts kept")
    table.columns[0].justify = "right"
    table.add_row(fmt_num(load.running), fmt_num(load.waiting), fmt_pct(load.kv_usage),
                  fmt_num(load.requests_per_s, "{:.2f}"), fmt_num(load.tokens_per_s, "{:.1f}"),
                  fmt_pct(load.drafts_kept))
    return table


def _slo_table(slos: Sequence[Slo]) -> Table:
    windows = list(dict.fromkeys(window for slo in slos for window in slo.burn))
    table = rich_table("SLOs", "slo", "threshold", "budget", *(f"burn {w}" for w in windows))
    for slo in slos:
        threshold = fmt_pct(slo.threshold) if slo.name == "error_rate" else fmt_secs(slo.threshold)
        burns = [slo.burn.get(w) for w in windows]
        table.add_row(slo.name, threshold, fmt_pct(slo.budget),
                      *(Text(fmt_num(b, "{:.2f}"), style="bold red" if b is not None and b > 1 else "") for b in burns))
    return table


def _arms_table(arms: Sequence[Arm]) -> Table:
    table = rich_table("A/B arms (since start)", "arm", "requests", "5xx", "TTFT p50", "TTFT p95", "e2e p95")
    for arm in arms:
        table.add_row(arm.label or "(no arm)", fmt_num(arm.requests), fmt_pct(arm.error_share), fmt_secs(arm.ttft_p50),
                      fmt_secs(arm.ttft_p95), fmt_secs(arm.e2e_p95))
    return table


def render(summary: Summary, *, interval: float | None = None, error: str | None = None) -> RenderableType:
    """The screen: header, replicas, load, SLOs (when configured) and A/B arms (under splits)."""
    tables = [_replicas_table(summary.replicas), _load_table(summary.load)]
    if summary.slos:
        tables.append(_slo_table(summary.slos))
    if summary.arms:
        tables.append(_arms_table(summary.arms))
    return Group(_header(summary, interval, error), *(Padding(t, (1, 0, 0, 0), expand=False) for t in tables))


def run(url: str, *, interval: float, once: bool) -> int:
    """Show ``url``'s status: one plain screen with ``once``, else refresh until Ctrl-C.

    Exit code 2 when the first scrape fails; later failures are shown on the screen and retried.
    """
    url = (url if "://" in url else f"http://{url}").rstrip("/")
    try:
        with httpx.Client(timeout=TIMEOUT_S) as client:
            first = scrape(client, url)
            if once:
                Console(color_system=None, highlight=False).print(render(summarize(first)))
            else:
                _watch(client, url, first, interval)
    except ScrapeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0


def _watch(client: httpx.Client, url: str, previous: Snapshot, interval: float) -> None:
    summary = summarize(previous)
    with Live(render(summary, interval=interval), auto_refresh=False) as live:
        while True:
            time.sleep(interval)
            try:
                current = scrape(client, url)
            except ScrapeError as exc:
                live.update(render(summary, interval=interval, error=str(exc)), refresh=True)
                continue
            summary, previous = summarize(current, previous), current
            live.update(render(summary, interval=interval), refresh=True)
