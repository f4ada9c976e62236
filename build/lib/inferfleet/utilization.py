"""How busy the fleet is over a window, from each serving engine's /metrics, and whether
it is over- or under-provisioned for the peak seen: the seeds of cost control.

Per instance: requests served, the time-average of requests in flight (busy seconds
over the window), and the peaks of requests running, waiting and KV-cache use, sampled
every `interval` seconds. The fleet's peak in flight is the largest sum over one round
of samples; it fits on ceil(peak / (max_num_seqs x target)) instances.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from inferfleet.verify import busy_seconds, metric_sums

# Share of an engine's max_num_seqs the advice plans the observed peak to fill.
TARGET = 0.7
# KV-cache use at which requests start to wait for memory.
KV_HIGH = 0.9


@dataclass
class Sample:
    running: float
    waiting: float
    kv: float  # KV-cache use, 0..1
    served: float  # requests finished (a counter)
    busy: float  # seconds of requests served (a counter)

    @classmethod
    def of(cls, metrics_text: str) -> Sample:
        sums = metric_sums(metrics_text.splitlines())
        return cls(
            running=sums.get("vllm:num_requests_running", 0.0),
            waiting=sums.get("vllm:num_requests_waiting", 0.0),
            kv=sums.get("vllm:kv_cache_usage_perc", 0.0),
            served=sums.get("vllm:request_success_total", 0.0),
            busy=busy_seconds(metrics_text),
        )


@dataclass
class Usage:
    instance: str
    requests: float
    in_flight: float  # time-average of requests in flight
    peak_running: float
    peak_waiting: float
    peak_kv: float


def usage(instance: str, samples: list[Sample], seconds: float) -> Usage:
    """One instance's figures from its samples, the first and last `seconds` apart."""
    first, last = samples[0], samples[-1]
    return Usage(
        instance=instance,
        requests=max(last.served - first.served, 0.0),
        in_flight=max(last.busy - first.busy, 0.0) / seconds if seconds > 0 else 0.0,
        peak_running=max(s.running for s in samples),
        peak_waiting=max(s.waiting for s in samples),
        peak_kv=max(s.kv for s in samples),
    )


def advice(usages: list[Usage], peak_in_flight: float, max_num_seqs: int) -> str:
    """One sentence: add, remove or keep instances, and why."""
    if not usages:
        return "no instance to judge"
    if sum(u.requests for u in usages) == 0 and peak_in_flight == 0:
        return "no traffic in the window: measure at a busy hour"
    pressed = [u.instance for u in usages if u.peak_waiting > 0 or u.peak_kv >= KV_HIGH]
    if pressed:
        return (
            f"under-provisioned: requests waited or the KV cache was over {KV_HIGH:.0%} on "
            f"{', '.join(pressed)}; add an instance (`inferfleet scale --add HOST`)"
        )
    need = max(1, math.ceil(peak_in_flight / (max_num_seqs * TARGET)))
    if need < len(usages):
        return (
            f"over-provisioned for this window: its peak of {peak_in_flight:.0f} requests in "
            f"flight fits on {need} instance(s) at {TARGET:.0%} of max_num_seqs "
            f"{max_num_seqs}; `inferfleet scale --remove` could take out {len(usages) - need}"
        )
    return f"sized for the peak seen ({peak_in_flight:.0f} requests in flight)"


def measure(
    read: Callable[[str], str],
    instances: list[str],
    seconds: float,
    interval: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[list[Usage], float, float]:
    """Sample every instance's metrics (`read(instance)` returns its /metrics text) for
    `seconds`: (per-instance usage, the fleet's peak in flight, seconds measured)."""
    rounds: list[dict[str, Sample]] = []
    started = clock()
    while True:
        rounds.append({name: Sample.of(read(name)) for name in instances})
        elapsed = clock() - started
        if elapsed >= seconds:
            break
        sleep(min(interval, seconds - elapsed))
    per = [usage(n, [r[n] for r in rounds], elapsed) for n in instances]
    peak = max(sum(r[n].running + r[n].waiting for n in instances) for r in rounds)
    return per, peak, elapsed


def report(usages: list[Usage], peak: float, seconds: float, max_num_seqs: int) -> dict:
    return {
        "seconds": round(seconds, 1),
        "instances": [asdict(u) for u in usages],
        "peak_in_flight": peak,
        "max_num_seqs": max_num_seqs,
        "advice": advice(usages, peak, max_num_seqs),
    }
