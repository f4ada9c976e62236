"""What one host's vllm-routers hold (load_balancer_routing: cache_aware), as JSON on
stdout: {backend: {"workers": [url, ...], "unhealthy": [url, ...], "error": ""}} for
each `backend=port` argument, read from the router's /list_workers and /health on
loopback (its /health is 503 and names the unhealthy workers when one is down)."""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request


def read(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def state(port: int) -> dict:
    try:
        _, listed = read(port, "/list_workers")
        status, health = read(port, "/health")
    except OSError as err:
        return {"workers": [], "unhealthy": [], "error": f"router on port {port}: {err}"}
    unhealthy = []
    if status != 200 and "[" in health:
        unhealthy = json.loads(health[health.index("["):])
    return {"workers": json.loads(listed)["urls"], "unhealthy": unhealthy, "error": ""}


if __name__ == "__main__":
    print(json.dumps({arg.split("=")[0]: state(int(arg.split("=")[1])) for arg in sys.argv[1:]}))
