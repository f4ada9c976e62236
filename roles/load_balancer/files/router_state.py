"""What one host's vllm-routers hold (load_balancer_routing: cache_aware), as JSON on
stdout: {backend: {"workers": [url, ...], "unhealthy": [url, ...], "decisions": {...},
"error": ""}} for each `backend=port=metrics_port` argument, read from the router's
/list_workers and /health on loopback (its /health is 503 and names the unhealthy
workers when one is down) and its metrics: requests it routed to the engine holding
their prefix ("prefix_hit") or, holding none, to the least busy ("prefix_miss")."""

from __future__ import annotations

import json
import re
import sys
import urllib.error
import urllib.request


def read(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


DECISIONS = re.compile(
    r'^vllm_router_prefix_routing_decisions_total\{[^}]*outcome="(\w+)"[^}]*\} (\S+)$', re.M)


def state(port: int, metrics_port: int) -> dict:
    try:
        _, listed = read(port, "/list_workers")
        status, health = read(port, "/health")
        _, metrics = read(metrics_port, "/metrics")
    except OSError as err:
        return {"workers": [], "unhealthy": [], "decisions": {},
                "error": f"router on port {port}: {err}"}
    unhealthy = []
    if status != 200 and "[" in health:
        unhealthy = json.loads(health[health.index("["):])
    decisions: dict[str, float] = {}
    for outcome, value in DECISIONS.findall(metrics):
        decisions[outcome] = decisions.get(outcome, 0.0) + float(value)
    return {"workers": json.loads(listed)["urls"], "unhealthy": unhealthy,
            "decisions": decisions, "error": ""}


if __name__ == "__main__":
    print(json.dumps({backend: state(int(port), int(metrics_port))
                      for backend, port, metrics_port in (a.split("=") for a in sys.argv[1:])}))
