"""SLO objectives: rolling-window burn rates and the ``[slo]`` table."""

from __future__ import annotations

import pytest
from lamina.kernel.slo import Objective, SloConfig, SloTracker, window_label
from lamina.kernel.stack_config import StackConfig
from lamina_hookspecs.errors import ConfigError


def test_burn_rate_is_bad_share_over_budget_within_the_window() -> None:
    objective = Objective("ttft_p95", threshold=0.5, budget=0.05, horizon_s=3600)
    for t in range(100):  # 100 events in the first 100 s, 10 of them bad
        objective.record(bad=t % 10 == 0, now=float(t))
    assert objective.burn_rate(300, now=100.0) == pytest.approx(0.1 / 0.05)
    for t in range(1000, 1100):  # 15 minutes later: 100 good events
        objective.record(bad=False, now=float(t))
    assert objective.burn_rate(300, now=1100.0) == 0.0, "old slices fall out of the 5-minute window"
    assert objective.burn_rate(3600, now=1100.0) == pytest.approx(10 / 200 / 0.05)
    assert (objective.events, objective.bad) == (200, 10)


def test_slices_older_than_the_longest_window_are_dropped() -> None:
    objective = Objective("error_rate", threshold=0.01, budget=0.01, horizon_s=300)
    for t in range(0, 36_000, 5):
        objective.record(bad=True, now=float(t))
    assert len(objective._slices) <= 300 / 10 + 1


def test_tracker_counts_only_configured_objectives() -> None:
    now = [0.0]
    tracker = SloTracker(SloConfig(itl_p95_s=0.1), lambda: now[0])
    tracker.first_token(5.0)
    tracker.outcome(500)
    tracker.gap(0.2)
    tracker.gap(0.05)
    names = {sample.labels.get("slo") for family in tracker.collect() for sample in family.samples}
    assert names == {"itl_p95"}
    burn = {tuple(s.labels.values()): s.value for f in tracker.collect() if f.name == "lamina_slo_burn_rate"
            for s in f.samples}
    assert burn[("itl_p95", "5m")] == pytest.approx(0.5 / 0.05)


def test_window_labels() -> None:
    assert [window_label(w) for w in (300, 3600, 45, 7200)] == ["5m", "1h", "45s", "2h"]


@pytest.mark.parametrize(("slo", "path", "problem"), [
    ({"error_rate": 1.5}, "slo.error_rate", "< 1"),
    ({"ttft_p95_s": 0}, "slo.ttft_p95_s", "> 0"),
    ({"windows_s": [5]}, "slo.windows_s", "at least 10"),
    ({"ttft_p95": 0.5}, "slo.ttft_p95", "did you mean 'ttft_p95_s'"),
])
def test_slo_table_errors_name_the_key(make_plugins, slo, path, problem) -> None:
    plugins = make_plugins(entry_points=True)
    with pytest.raises(ConfigError) as info:
        StackConfig.from_dict({"executor": {"use": "echo"}, "slo": slo}, plugins.registry)
    assert info.value.path == path and problem in str(info.value), str(info.value)


def test_observers_entries_are_validated(make_plugins) -> None:
    plugins = make_plugins(entry_points=True)
    with pytest.raises(ConfigError) as info:
        StackConfig.from_dict({"executor": {"use": "echo"}, "observers": [{"use": "nope"}]}, plugins.registry)
    assert info.value.path == "observers[0].use" and "no observer named 'nope'" in str(info.value)
    with pytest.raises(ConfigError) as info:
        StackConfig.from_dict({"executor": {"use": "echo"}, "observers": {"use": "x"}}, plugins.registry)
    assert info.value.path == "observers" and "[[observers]]" in str(info.value)
