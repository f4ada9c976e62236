#!/usr/bin/env python3
"""Wait until the engine is ready: its /health answers 200, its /v1/models lists the
served model and then a one-token completion succeeds (each of the last two tried for
up to --answer-timeout, a completion taking up to 60 s). Stop waiting as soon as systemd
says the engine exited (a crash at start-up, e.g. weights that do not fit the config):
systemd restarting it again and again would otherwise look like a slow start. The API
key, if any, comes from the environment (INFERFLEET_PROBE_KEY), never the command line.

Exit 0: ready. 1: not healthy within --timeout. 2: the engine exited (systemd is about
to restart it, or did, or the unit failed/stopped); the unit is then stopped so that it
does not crash again and again. 3: healthy, but it did not list the model or answer.
Prints one line saying which.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request


def unit_state(unit: str) -> dict[str, str]:
    out = subprocess.run(
        ["systemctl", "show", unit, "--property", "NRestarts,ActiveState,SubState"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def call(url: str, body: dict | None = None, timeout: float = 10) -> tuple[int, dict]:
    """(status, JSON body) of a GET, or of a POST of `body`; (0, {}) when unreachable."""
    headers = {"Content-Type": "application/json"}
    if os.environ.get("INFERFLEET_PROBE_KEY"):
        headers["Authorization"] = "Bearer " + os.environ["INFERFLEET_PROBE_KEY"]
    data = json.dumps(body).encode() if body is not None else None
    try:
        req = urllib.request.Request(url, data=data, headers=headers)
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, {}
    except (urllib.error.URLError, OSError, ValueError):
        return 0, {}


def answers(base: str, model: str, patience: float, interval: float) -> str:
    """'' once /v1/models lists `model` and then a one-token completion succeeds, each
    tried for up to `patience` seconds; else what did not, as it stood then."""
    deadline = time.monotonic() + patience
    while True:
        status, body = call(f"{base}/v1/models")
        ids = [m.get("id") for m in body.get("data") or []]
        if status == 200 and model in ids:
            break
        if time.monotonic() > deadline:
            return f"/v1/models answered {status or 'nothing'} listing {ids}, not {model}"
        time.sleep(interval)
    prompt = {"model": model, "prompt": "Hello", "max_tokens": 1, "temperature": 0}
    deadline = time.monotonic() + patience
    while True:
        status, body = call(f"{base}/v1/completions", prompt, timeout=60)
        if status == 200 and body.get("choices"):
            return ""
        if time.monotonic() > deadline:
            return f"a one-token completion answered {status or 'nothing'}"
        time.sleep(interval)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True, help="the engine's base URL")
    p.add_argument("--model", required=True, help="the served model's name")
    p.add_argument("--unit", required=True)
    p.add_argument("--timeout", type=float, required=True)
    p.add_argument("--answer-timeout", type=float, default=60.0)
    p.add_argument("--interval", type=float, default=2.0)
    args = p.parse_args()
    first = unit_state(args.unit)
    restarts = int(first.get("NRestarts", "0") or 0)
    started = time.monotonic()
    while True:
        if healthy(f"{args.url}/health"):
            healthy_at = time.monotonic()
            failed = answers(args.url, args.model, args.answer_timeout, args.interval)
            if failed:
                print(f"healthy after {healthy_at - started:.0f} s, but {failed}")
                return 3
            print(f"ready after {time.monotonic() - started:.0f} s")
            return 0
        state = unit_state(args.unit)
        exited = (
            int(state.get("NRestarts", "0") or 0) > restarts
            or state.get("SubState") == "auto-restart"
            or state.get("ActiveState") in {"failed", "inactive"}
        )
        if exited:
            print(
                f"{args.unit} exited after {time.monotonic() - started:.0f} s "
                f"(ActiveState={state.get('ActiveState')}, SubState={state.get('SubState')}, "
                f"restarts={state.get('NRestarts')}); stopped it rather than let systemd "
                "start it again"
            )
            # Another start would fail the same way, and killing an engine in the middle
            # of loading is slow; whoever fixes the cause starts it again.
            subprocess.run(["systemctl", "stop", args.unit], check=False)
            return 2
        if time.monotonic() - started > args.timeout:
            print(f"/health did not answer 200 within {args.timeout:.0f} s")
            return 1
        time.sleep(args.interval)


if __name__ == "__main__":
    sys.exit(main())
