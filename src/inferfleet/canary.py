"""The canary's verdict: one instance on the new release, the rest on the old, compared
over the same window of live traffic from each engine's own /metrics (error rate and
latency percentiles from the request-duration histogram), plus the greedy answers to a
set of golden prompts asked of both. Pure functions; `inferfleet rollout --canary`
gathers the numbers and acts on the verdict.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from inferfleet.verify import parse_metrics

# HTTP-level, as clients see it (vLLM's API server exports them through
# prometheus-fastapi-instrumentator): requests by handler and status class, and a
# fine-bucketed duration histogram.
REQUESTS = "http_requests_total"
DURATION = "http_request_duration_highr_seconds"
# vLLM's own end-to-end latency, where the HTTP histogram is missing.
E2E = "vllm:e2e_request_latency_seconds"

DEFAULT_GOLDEN = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a quiet village,",
]


@dataclass
class Golden:
    prompt: str
    expect: str | None = None  # None: the old release's answer is the reference


@dataclass
class Thresholds:
    max_error_rate_increase: float = 0.01  # absolute: 0.01 = one point of percentage
    max_latency_ratio: float = 1.5  # canary p50 and p95 over the old ones
    min_requests: int = 5  # fewer served by the canary: no verdict, so no pass
    golden_may_change: bool = False  # a new model version whose answers are meant to change


@dataclass
class Side:
    """One side of the comparison over the window: served, failed, latency percentiles."""

    requests: float
    errors: float
    p50: float
    p95: float

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0


@dataclass
class Row:
    check: str
    canary: str
    old: str
    limit: str
    passed: bool


@dataclass
class Snapshot:
    """The counters the verdict needs, from one engine's /metrics at one moment."""

    requests: float  # /v1 requests answered
    errors: float  # of which 5xx
    buckets: dict[float, float]  # duration histogram: upper bound -> cumulative count

    @classmethod
    def of(cls, text: str) -> Snapshot:
        requests = errors = 0.0
        histograms: dict[str, dict[float, float]] = {DURATION: {}, E2E: {}}
        for name, labels, value in parse_metrics(text):
            if name == REQUESTS and labels.get("handler", "").startswith("/v1/"):
                requests += value
                if labels.get("status", "").startswith("5"):
                    errors += value
            elif name.endswith("_bucket") and name[:-7] in histograms and "le" in labels:
                bound = math.inf if labels["le"] == "+Inf" else float(labels["le"])
                buckets = histograms[name[:-7]]
                buckets[bound] = buckets.get(bound, 0.0) + value
        return cls(requests, errors, histograms[DURATION] or histograms[E2E])

    def __sub__(self, before: Snapshot) -> Snapshot:
        return Snapshot(
            self.requests - before.requests,
            self.errors - before.errors,
            {b: c - before.buckets.get(b, 0.0) for b, c in self.buckets.items()},
        )

    def __add__(self, other: Snapshot) -> Snapshot:
        bounds = set(self.buckets) | set(other.buckets)
        return Snapshot(
            self.requests + other.requests,
            self.errors + other.errors,
            {b: self.buckets.get(b, 0.0) + other.buckets.get(b, 0.0) for b in bounds},
        )

    def side(self) -> Side:
        return Side(
            self.requests,
            self.errors,
            quantile(self.buckets, 0.50),
            quantile(self.buckets, 0.95),
        )


def quantile(buckets: dict[float, float], q: float) -> float:
    """The q-quantile of a cumulative histogram, interpolated inside its bucket (as
    Prometheus' histogram_quantile does); NaN when it holds no observation."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return math.nan
    rank = q * buckets[bounds[-1]]
    lower, below = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if math.isinf(bound):
                return lower  # past the last finite bucket: its bound is all we know
            if count == below:
                return bound
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return lower


def weight_for_share(share: float, others: int, weight: int) -> int:
    """The canary's HAProxy weight for `share` (0..1) of the requests when `others`
    servers keep `weight` each; HAProxy weights are whole numbers from 1 to 256."""
    if not 0 < share < 1:
        raise ValueError(f"share {share}: give a fraction between 0 and 1")
    return max(1, min(256, round(weight * others * share / (1 - share))))


def load_golden(path: Path | None) -> list[Golden]:
    """Golden prompts from a YAML or JSON list: each a prompt (the old release's answer is
    the reference) or {prompt: ..., expect: ...}; the built-in three without a file."""
    if path is None:
        return [Golden(p) for p in DEFAULT_GOLDEN]
    if not path.is_file():
        raise ValueError(f"golden prompts file {path} does not exist")
    try:
        items = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ValueError(f"golden prompts file {path} is not YAML or JSON: {err}") from err
    if not isinstance(items, list) or not items:
        raise ValueError(f"golden prompts file {path} must hold a non-empty list")
    out = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            out.append(Golden(item))
        elif isinstance(item, dict) and isinstance(item.get("prompt"), str):
            expect = item.get("expect")
            if expect is not None and not isinstance(expect, str):
                raise ValueError(f"{path}: item {i + 1}'s expect must be a string")
            out.append(Golden(item["prompt"], expect))
        else:
            raise ValueError(f"{path}: item {i + 1} must be a prompt or {{prompt, expect}}")
    return out


def _seconds(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.3f} s"


def judge(
    canary: Side,
    old: Side,
    golden: list[tuple[Golden, str, str]],
    limits: Thresholds,
) -> list[Row]:
    """Rows of the comparison table; the canary passes only if every row passes.
    `golden` holds (prompt, the canary's answer, the old release's answer)."""
    rows = [
        Row(
            "requests served",
            f"{canary.requests:.0f}",
            f"{old.requests:.0f}",
            f">= {limits.min_requests}",
            canary.requests >= limits.min_requests,
        ),
        Row(
            "error rate (5xx)",
            f"{canary.error_rate:.2%}",
            f"{old.error_rate:.2%}",
            f"<= old + {limits.max_error_rate_increase:.2%}",
            canary.error_rate <= old.error_rate + limits.max_error_rate_increase,
        ),
    ]
    for name in ("p50", "p95"):
        mine, theirs = getattr(canary, name), getattr(old, name)
        # No old figure (no traffic there): nothing to compare against, so no pass.
        ok = not math.isnan(mine) and not math.isnan(theirs)
        rows.append(
            Row(
                f"latency {name}",
                _seconds(mine),
                _seconds(theirs),
                f"<= old x {limits.max_latency_ratio:g}",
                ok and mine <= theirs * limits.max_latency_ratio,
            )
        )
    for item, mine, theirs in golden:
        reference = theirs if item.expect is None else item.expect
        same = mine == reference
        rows.append(
            Row(
                f"golden {item.prompt[:32]!r}",
                repr(mine[:40]),
                repr(theirs[:40]) if item.expect is None else f"expect {reference[:40]!r}",
                "may change" if limits.golden_may_change and item.expect is None else "the same",
                same or (limits.golden_may_change and item.expect is None),
            )
        )
    return rows


def _tokens(value) -> int | None:
    try:
        return int(value) or None
    except (TypeError, ValueError):
        return None


def kv_rows(instances: list[tuple[str, str]], figures: dict[str, dict]) -> list[Row]:
    """A row per (instance, host that logs its KV cache) with a plan to compare with:
    `figures` are the engine role's capacity check by host (set_stats
    inferfleet_kv_cache: logged, planned, tolerance_pct). Short of the plan by more than
    the tolerance fails (the concurrency and context the fleet was planned for no longer
    fit); more than planned passes. No plan (a GPU engine without the preflight's): no
    row, as the role only reports the figure then."""
    rows = []
    for instance, host in instances:
        figure = figures.get(host) or {}
        planned, logged = _tokens(figure.get("planned")), _tokens(figure.get("logged"))
        if planned is None:
            continue
        tolerance = float(figure.get("tolerance_pct", 0))
        rows.append(
            Row(
                f"KV cache of {instance}",
                f"{logged} tokens" if logged else "not logged",
                f"plan {planned} tokens",
                f">= plan - {tolerance:g} %",
                logged is not None and logged >= planned * (1 - tolerance / 100),
            )
        )
    return rows


def as_record(rows: list[Row], limits: Thresholds, **context) -> dict:
    """The comparison as kept in the run's record."""
    return {
        **context,
        "thresholds": asdict(limits),
        "passed": all(r.passed for r in rows),
        "rows": [asdict(r) for r in rows],
    }
