"""The prefix cache's stats as Prometheus metrics, read at scrape time."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from lamina.kernel.plugins import load_plugins
from lamina.server.metrics import Metrics
from lamina.kernel.stack import Stack
from lamina.kernel.stack_config import StackConfig


def build(config: dict[str, Any]) -> Stack:
    plugins = load_plugins()
    return Stack(StackConfig.from_dict(config, plugins.registry), plugins)


def samples(metrics: Metrics) -> dict[str, float]:
    text = metrics.render().decode()
    return {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples
            if s.name.startswith("lamina_prefix_cache")}


def test_prefix_cache_stats_are_exported_and_live() -> None:
    stack = build({"executor": {"use": "echo"}, "prefix_cache": {"use": "radix", "block_size": 4}})
    cache = stack.prefix_cache.instances[""]
    metrics = Metrics(stack)
    before = samples(metrics)
    assert before["lamina_prefix_cache_queries_total"] == 0
    assert before["lamina_prefix_cache_blocks"] == 0

    tokens = list(range(10, 22))  # three whole blocks of 4
    assert cache.match(tokens, salt=b"acme").num_tokens == 0  # a miss: 12 tokens looked up
    cache.insert(tokens, [7, 8, 9], salt=b"acme")
    hit = cache.match(tokens[:8] + [99, 98, 97], salt=b"acme")  # 11 tokens, 8 of them cached
    assert hit.num_tokens == 8
    after = samples(metrics)  # the same Metrics object: values are read at scrape time
    cache.release(hit)

    assert after["lamina_prefix_cache_queries_total"] == 23
    assert after["lamina_prefix_cache_hits_total"] == 8
    assert after["lamina_prefix_cache_lookups_total"] == 2
    assert after["lamina_prefix_cache_hit_requests_total"] == 1
    assert after["lamina_prefix_cache_blocks"] == 3
    assert after["lamina_prefix_cache_inserted_blocks_total"] == 3
    assert after["lamina_prefix_cache_pinned_blocks"] == 2
    assert after["lamina_prefix_cache_evicted_blocks_total"] == 0
    assert abs(after["lamina_prefix_cache_hit_rate"] - 8 / 23) < 1e-9

    assert sorted(cache.evict(2)) == [8, 9]  # the unpinned leaves, deepest first
    final = samples(metrics)
    assert final["lamina_prefix_cache_evicted_blocks_total"] == 2
    assert final["lamina_prefix_cache_blocks"] == 1
    assert final["lamina_prefix_cache_pinned_blocks"] == 0


def test_counters_and_gauges_have_the_right_types() -> None:
    stack = build({"executor": {"use": "echo"}, "prefix_cache": {"use": "radix"}})
    text = Metrics(stack).render().decode()
    assert "# TYPE lamina_prefix_cache_queries_total counter" in text
    assert "# TYPE lamina_prefix_cache_hits_total counter" in text
    assert "# TYPE lamina_prefix_cache_evicted_blocks_total counter" in text
    assert "# TYPE lamina_prefix_cache_blocks gauge" in text


def test_no_prefix_cache_no_prefix_metrics() -> None:
    stack = build({"executor": {"use": "echo"}})
    text = Metrics(stack).render().decode()
    assert "lamina_prefix_cache" not in text
    assert "lamina_num_requests_waiting" in text


def test_metrics_endpoint_of_a_live_server_shows_the_cache(live: Any) -> None:
    import httpx

    server = live({"executor": {"use": "echo"}, "prefix_cache": {"use": "radix"}})
    server.stack.prefix_cache.instances[""].match(list(range(40)), salt=b"t")
    text = httpx.get(f"{server.url}/metrics").text
    assert "lamina_prefix_cache_queries_total 40.0" in text
    assert "lamina_prefix_cache_lookups_total 1.0" in text
