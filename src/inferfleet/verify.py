"""The checks that say a deployment is done, over plain HTTP (no Ansible here):
every backend healthy, every instance answering the same greedy completion as the load
balancer, and a bounded load that reports throughput, latency percentiles, errors and
how evenly it spread over the backends (from each engine's own request counter).
"""

from __future__ import annotations

import json
import math
import re
import secrets
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

PROMPT = "The load balancer spreads"
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^}]*)\})?\s+(\S+)")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


# The CAs an HTTPS load balancer is verified against: the system's, or the fleet's own
# (load_balancer_tls_ca_certificate) once trust() is given it.
_TLS = ssl.create_default_context()


def trust(ca_pem: str) -> None:
    """Verify HTTPS answers against this CA (PEM) from now on; "" keeps the system's."""
    global _TLS
    _TLS = ssl.create_default_context(cadata=ca_pem.strip() or None)


@dataclass
class Call:
    ok: bool
    status: int
    seconds: float
    text: str = ""
    error: str = ""


def post_json(url: str, body: dict, key: str | None, timeout: float = 120.0) -> Call:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    started = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=_TLS) as resp:
            data = json.load(resp)
            return Call(
                True, resp.status, time.monotonic() - started, text=data["choices"][0]["text"]
            )
    except urllib.error.HTTPError as err:
        return Call(False, err.code, time.monotonic() - started, error=err.reason)
    except (OSError, ValueError, KeyError) as err:
        return Call(False, 0, time.monotonic() - started, error=str(err))


def complete(
    base: str, model: str, key: str | None, prompt: str = PROMPT, max_tokens: int = 16
) -> Call:
    """A greedy (temperature 0) completion: the same weights must give the same text."""
    return post_json(
        f"{base}/v1/completions",
        {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0},
        key,
    )


def get(url: str, key: str | None = None, timeout: float = 10.0) -> tuple[int, str]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=_TLS) as resp:
            return resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as err:
        return err.code, ""
    except OSError as err:
        return 0, str(err)


def percentile(values: Iterable[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass
class LoadReport:
    sent: int
    failed: int
    seconds: float
    p50: float
    p95: float
    p99: float
    errors: list[str] = field(default_factory=list)
    concurrency: int = 0

    @property
    def throughput(self) -> float:
        return self.sent / self.seconds if self.seconds else 0.0


def run_load(
    base: str,
    model: str,
    key: str | None,
    concurrency: int,
    count: int,
    max_tokens: int = 16,
    deadline_s: float = 600.0,
) -> LoadReport:
    """Send `count` completions, `concurrency` at a time; bounded in count and time."""
    stop_at = time.monotonic() + deadline_s
    run = secrets.token_hex(4)

    def one(i: int) -> Call:
        if time.monotonic() > stop_at:
            return Call(False, 0, 0.0, error="not sent: load deadline passed")
        # Each prompt begins with its own number and this run's: no two share a prefix,
        # here or with an earlier run's, so routings that follow prefixes (prefix,
        # cache_aware) spread them like any other.
        return complete(base, model, key, prompt=f"{i} {run}: {PROMPT}", max_tokens=max_tokens)

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        calls = list(pool.map(one, range(count)))
    seconds = time.monotonic() - started
    ok = [c.seconds for c in calls if c.ok]
    errors = sorted({f"{c.status} {c.error}".strip() for c in calls if not c.ok})
    return LoadReport(
        count,
        sum(not c.ok for c in calls),
        seconds,
        percentile(ok, 50),
        percentile(ok, 95),
        percentile(ok, 99),
        errors,
        concurrency,
    )


class LoadLoop:
    """Completions sent until the `with` block ends: `workers` at a time, in turn to each
    of `bases`, each worker pausing `pause` seconds between two, every prompt `prompt`
    and a number of its own. Every call is kept with the moment it started
    (time.monotonic())."""

    def __init__(
        self,
        bases: list[str],
        model: str,
        key: str | None,
        workers: int = 2,
        pause: float = 0.0,
        max_tokens: int = 16,
        prompt: str = PROMPT,
    ):
        self.bases, self.model, self.key, self.prompt = bases, model, key, prompt
        self.workers, self.pause, self.max_tokens = workers, pause, max_tokens
        self.calls: list[tuple[float, Call]] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def _work(self, worker: int) -> None:
        i = worker
        while not self._stop.is_set():
            base = self.bases[i % len(self.bases)]
            started = time.monotonic()
            call = complete(base, self.model, self.key, f"{self.prompt} loop {i}", self.max_tokens)
            self.calls.append((started, call))  # list.append is atomic
            i += self.workers
            self._stop.wait(self.pause)

    def __enter__(self) -> LoadLoop:
        self._threads = [
            threading.Thread(target=self._work, args=(w,), daemon=True) for w in range(self.workers)
        ]
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()

    def failed(self) -> list[Call]:
        return [c for _, c in self.calls if not c.ok]


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Prometheus text format: (name, labels, value) for every sample."""
    out = []
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if not m:  # comments (# HELP, # TYPE) and blank lines
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        out.append((m.group(1), dict(LABEL.findall(m.group(2) or "")), value))
    return out


def metric_sums(lines: Iterable[str]) -> dict[str, float]:
    """Each metric's value summed over its label sets (Prometheus text format)."""
    out: dict[str, float] = {}
    for name, _, value in parse_metrics("\n".join(lines)):
        out[name] = out.get(name, 0.0) + value
    return out


def served_requests(metrics_text: str) -> float:
    """Completed requests from an engine's /metrics (vLLM's request_success_total)."""
    return metric_sums(metrics_text.splitlines()).get("vllm:request_success_total", 0.0)


def busy_seconds(metrics_text: str) -> float:
    """Seconds of requests an engine has served, summed: over a load window, the
    time-average of its requests in flight times the window. Measured where the load
    balancer sees them, at the engine's HTTP server (http_request_duration_highr_seconds,
    which counts tokenizing, queueing in the API server and answering too); vLLM's own
    end-to-end latency sum where that histogram is missing."""
    sums = metric_sums(metrics_text.splitlines())
    return sums.get(
        "http_request_duration_highr_seconds_sum",
        sums.get("vllm:e2e_request_latency_seconds_sum", 0.0),
    )


def spread_is_even(counts: dict[str, float], tolerance: float = 0.5) -> bool:
    """Every backend served at least (1 - tolerance) of its fair share."""
    total = sum(counts.values())
    if not counts or total <= 0:
        return False
    fair = total / len(counts)
    return all(c >= (1 - tolerance) * fair for c in counts.values())
