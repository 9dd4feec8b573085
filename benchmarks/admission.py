"""What admission costs: ns per rate-limit decision, and how closely each limiter follows
the exact moving window.

Decisions. Each limiter at 100 units per 1 s window per key, called directly in a loop:

    token-bucket, sliding-window        Lamina's in-process limiters (``now`` passed in: a
                                        simulated clock advancing 1 µs per call)
    shared-limit moving-window / ...    Lamina's ``shared-limit`` over ``limits``' memory
    sliding-window-counter              storage (wall clock, read by ``limits``)
    limits moving-window / ...          ``limits`` itself: ``hit`` on MovingWindowRateLimiter
    sliding-window-counter              and SlidingWindowCounterRateLimiter, MemoryStorage

in three workloads: one key flooded far beyond its limit (nearly every decision a refusal),
100,000 keys in turn (each well under its limit: every decision an admission, the table
large; each key comes back 0.1 simulated s later, by when a token bucket is full again, so
``token-bucket`` has forgotten it and each of its decisions also re-adds a key, while
``sliding-window`` keeps keys for a window) and one key with a limit too high to reach
(the admitted hot path; not for the
moving windows, whose memory storage keeps one entry per admitted unit and inserts at the
head of a list: O(limit) per hit). Variants run interleaved (a b c ... a b c ...) and the
figures are medians over rounds; each row also says what fraction of its decisions were
admissions, since the two paths cost differently. A call to an empty function with the
same arguments is the floor (the loop and the call alone).

Validation. orjson parse + the compiled ``openai-schema`` validator against parse + the
reference ``jsonschema`` (Draft 7, same schema) on a ~0.8 KB chat body, valid and invalid.

Accuracy. The deterministic bursty trace of ``tests/test_burst_accuracy.py`` (80 requests/s
plus bursts of 500 in 50 ms every 2 s, for 10 s; limit 100 per 1 s; one key) through each
limiter on a simulated clock: how many decisions differ from the exact moving window, and
the most admitted in any 1 s window.

    uv run python benchmarks/admission.py            # 7 rounds of 300,000 decisions per row
    uv run python benchmarks/admission.py --quick    # 5 rounds of 100,000 (about a minute)
    uv run python benchmarks/admission.py --json     # last stdout line: one JSON object

Progress goes to stderr. Other jobs on the machine skew the figures: compare within one run.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import orjson
from limits import RateLimitItemPerSecond
from limits.storage import MemoryStorage
from limits.strategies import MovingWindowRateLimiter, SlidingWindowCounterRateLimiter

from lamina_admission.burst_trace import (
    SimulatedClock, burst_trace, disagreement, exact_moving_window, limits_on_clock, max_in_window, replay,
)
from lamina_admission.shared_limit import SharedLimit
from lamina_admission.sliding_window import SlidingWindow
from lamina_admission.token_bucket import TokenBucket

LIMIT = 100  # units per 1 s window per key
MANY_KEYS = 100_000
UNREACHABLE = 10**9
BUCKET_CAPACITY = 20  # accuracy trace: a fifth of a second's rate
BASELINE = "limits moving-window"

Decide = Callable[[str, float], Any]  # (key, now) -> anything; one decision


def _limits_hit(strategy: type, limit: int) -> Decide:
    limiter, item = strategy(MemoryStorage()), RateLimitItemPerSecond(limit, 1)
    return lambda key, now: limiter.hit(item, key)


def _noop(key: str, now: float, cost: float = 1.0) -> None:
    return None


def variants(limit: int) -> dict[str, Callable[[], Decide]]:
    """Each row's limiter, built fresh, as a ``(key, now)`` callable."""
    return {
        "floor: empty call": lambda: _noop,
        "token-bucket": lambda: TokenBucket(capacity=limit, rate=limit).acquire,
        "sliding-window": lambda: SlidingWindow(limit=limit, window_s=1.0, slices=10).acquire,
        "shared-limit moving-window": lambda: SharedLimit(limit=limit, strategy="moving-window").acquire,
        "shared-limit sliding-window-counter":
            lambda: SharedLimit(limit=limit, strategy="sliding-window-counter").acquire,
        "limits moving-window": lambda: _limits_hit(MovingWindowRateLimiter, limit),
        "limits sliding-window-counter": lambda: _limits_hit(SlidingWindowCounterRateLimiter, limit),
    }


def _admitted(result: Any) -> bool:
    return bool(result) if isinstance(result, bool) else bool(getattr(result, "allowed", True))


def _time_block(decide: Decide, keys: list[str], start: float) -> tuple[float, float]:
    """ns per decision over one pass of ``keys`` (with ``now`` from ``start``, 1 µs apart),
    and the fraction admitted (counted in a separate, untimed pass over a sample)."""
    times = [start + i * 1e-6 for i in range(len(keys))]
    gc.collect()
    began = time.perf_counter_ns()
    for key, now in zip(keys, times, strict=True):
        decide(key, now)
    elapsed = time.perf_counter_ns() - began
    sample = 1000
    admitted = sum(_admitted(decide(key, times[-1] + 1e-9 * i)) for i, key in enumerate(keys[:sample]))
    return elapsed / len(keys), admitted / min(sample, len(keys))


def measure_decisions(rounds: int, calls: int) -> dict[str, dict[str, dict[str, float]]]:
    """Per workload, per variant: median ns per decision and the fraction admitted."""
    many = [f"tenant-{i:06d}" for i in range(MANY_KEYS)]
    workloads: dict[str, tuple[list[str], int, list[str]]] = {
        # name: (call sequence, limit, variants left out)
        "1 key, flooded": (["tenant-0"] * calls, LIMIT, []),
        f"{MANY_KEYS:,} keys": ((many * (calls // MANY_KEYS + 1))[:calls], LIMIT, []),
        "1 key, admitted": (["tenant-0"] * calls, UNREACHABLE,
                            ["shared-limit moving-window", "limits moving-window"]),
    }
    results: dict[str, dict[str, dict[str, float]]] = {}
    for workload, (keys, limit, skipped) in workloads.items():
        built = {name: make() for name, make in variants(limit).items() if name not in skipped}
        for name, decide in built.items():  # warm-up: every key seen once, untimed
            print(f"{workload}: warming up {name}", file=sys.stderr)
            _time_block(decide, keys[:min(len(keys), MANY_KEYS)], 0.0)
        samples: dict[str, list[float]] = {name: [] for name in built}
        admitted: dict[str, list[float]] = {name: [] for name in built}
        for round_ in range(rounds):
            print(f"{workload}: round {round_ + 1}/{rounds}", file=sys.stderr)
            for name, decide in built.items():
                ns, fraction = _time_block(decide, keys, 1.0 + round_ * (calls * 1e-6 + 1.0))
                samples[name].append(ns)
                admitted[name].append(fraction)
        results[workload] = {name: {"ns_per_decision": statistics.median(samples[name]),
                                     "admitted_fraction": statistics.mean(admitted[name])} for name in built}
        del built
        gc.collect()
    return results


def measure_accuracy() -> dict[str, dict[str, float]]:
    """Each limiter on the bursty trace vs the exact moving window."""
    times = burst_trace()
    exact = exact_moving_window(times, LIMIT)
    limiters: dict[str, Callable[[], Any]] = {
        "exact moving window": lambda: None,
        f"token-bucket (capacity {BUCKET_CAPACITY})": lambda: TokenBucket(capacity=BUCKET_CAPACITY, rate=LIMIT),
        "sliding-window (10 slices)": lambda: SlidingWindow(limit=LIMIT, window_s=1.0, slices=10),
        "shared-limit moving-window": lambda: SharedLimit(limit=LIMIT, strategy="moving-window"),
        "shared-limit sliding-window-counter": lambda: SharedLimit(limit=LIMIT, strategy="sliding-window-counter"),
        "shared-limit fixed-window": lambda: SharedLimit(limit=LIMIT, strategy="fixed-window"),
    }
    results = {}
    for name, make in limiters.items():
        clock = SimulatedClock()
        with limits_on_clock(clock):
            limiter = make()
            decisions = exact if limiter is None else replay(limiter, times, clock=clock)
        results[name] = {"admitted": sum(decisions), "disagreement": disagreement(decisions, exact),
                         "max_in_any_1s": max_in_window(times, decisions)}
    results["trace"] = {"requests": len(times), "limit": LIMIT, "window_s": 1.0}
    return results


# --- Validation: µs per request for the compiled validator vs jsonschema -----------------------

CHAT_BODY = orjson.dumps({
    "model": "SmolLM2-135M-Instruct", "max_tokens": 256, "temperature": 0.7, "top_p": 0.95, "stream": True,
    "stream_options": {"include_usage": True}, "seed": 7, "stop": ["</s>", "\n\nUser:"], "user": "tenant-42",
    "messages": [
        {"role": "system", "content": "You are a concise assistant for a serving framework's users."},
        {"role": "user", "content": "How do I configure a per-tenant token bucket rate limit in a stack file?"},
        {"role": "assistant", "content": "Add an [[admission]] table with use = \"token-bucket\", a capacity "
                                         "and a rate, and key_by = \"tenant\"."},
        {"role": "user", "content": "And how do I split it between two limiter implementations for an A/B test?"},
    ],
})
BAD_BODY = CHAT_BODY.replace(b'"role":"user"', b'"role":"wizard"', 1)


def _median_us(call: Callable[[], Any], repeat: int, number: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter_ns()
        for _ in range(number):
            call()
        times.append((time.perf_counter_ns() - start) / number / 1000)
    return statistics.median(times)


def measure_validation(rounds: int) -> dict[str, float]:
    """orjson parse + the ``openai-schema`` validator vs parse + ``jsonschema`` (Draft 7, same schema)."""
    import jsonschema
    from lamina_admission import SchemaValidator, SchemaValidatorOptions
    from lamina_hookspecs.errors import InvalidRequestError

    ours = SchemaValidator.from_options(SchemaValidatorOptions())
    reference = jsonschema.Draft7Validator(ours.schemas["chat"])

    def ours_valid() -> None:
        ours.validate("chat", orjson.loads(CHAT_BODY))

    def ours_invalid() -> None:
        try:
            ours.validate("chat", orjson.loads(BAD_BODY))
        except InvalidRequestError:
            return
        raise AssertionError("the invalid body passed")

    def reference_valid() -> None:
        reference.validate(orjson.loads(CHAT_BODY))

    def reference_invalid() -> None:
        try:
            reference.validate(orjson.loads(BAD_BODY))
        except jsonschema.ValidationError:
            return
        raise AssertionError("the invalid body passed")

    figures = {"body_bytes": len(CHAT_BODY)}
    for name, call, number in (("lamina_valid_us", ours_valid, 20_000), ("lamina_invalid_us", ours_invalid, 5_000),
                               ("jsonschema_valid_us", reference_valid, 300),
                               ("jsonschema_invalid_us", reference_invalid, 300)):
        figures[name] = _median_us(call, rounds, number)
    figures["speedup_valid"] = figures["jsonschema_valid_us"] / figures["lamina_valid_us"]
    figures["speedup_invalid"] = figures["jsonschema_invalid_us"] / figures["lamina_invalid_us"]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and calls (about a minute)")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = parser.parse_args()
    rounds, calls = (5, 100_000) if args.quick else (7, 300_000)

    decisions = measure_decisions(rounds, calls)
    accuracy = measure_accuracy()
    validation = measure_validation(rounds)

    print(f"ns per rate-limit decision, medians of {rounds} interleaved rounds of {calls:,} decisions "
          f"(limit {LIMIT}/s per key; ratio: vs {BASELINE}, same workload)")
    for workload, rows in decisions.items():
        base = rows.get(BASELINE, {}).get("ns_per_decision")
        print(f"\n{workload}")
        print(f"  {'limiter':<38} {'ns/decision':>11} {'admitted':>9} {'vs ' + BASELINE:>24}")
        for name, row in rows.items():
            row["vs_baseline"] = row["ns_per_decision"] / base if base else None
            ratio = f"{row['vs_baseline']:.3f}x" if base else "n/a"
            print(f"  {name:<38} {row['ns_per_decision']:>11.0f} {row['admitted_fraction']:>8.1%} {ratio:>24}")
    trace = accuracy["trace"]
    print(f"\naccuracy on the bursty trace: {trace['requests']} requests, one key, limit {trace['limit']} per 1 s")
    print(f"  {'limiter':<38} {'admitted':>8} {'disagrees':>9} {'max in any 1 s':>15}")
    for name, row in accuracy.items():
        if name != "trace":
            print(f"  {name:<38} {row['admitted']:>8} {row['disagreement']:>9.2%} {row['max_in_any_1s']:>15}")
    print(f"\nparse + validate a {validation['body_bytes']}-byte chat body, µs (medians of {rounds} rounds)")
    for case in ("valid", "invalid"):
        print(f"  {case:<8} openai-schema {validation[f'lamina_{case}_us']:8.2f}   jsonschema "
              f"{validation[f'jsonschema_{case}_us']:8.1f}   {validation[f'speedup_{case}']:6.0f}x faster")
    if args.json:
        print(json.dumps({"rounds": rounds, "calls_per_round": calls, "limit_per_s": LIMIT,
                          "decisions": decisions, "accuracy": accuracy, "validation": validation}))


if __name__ == "__main__":
    main()
