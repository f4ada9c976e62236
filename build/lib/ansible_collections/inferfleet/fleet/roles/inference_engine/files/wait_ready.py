#!/usr/bin/env python3
"""Wait until the engine's /health answers 200, and stop waiting as soon as systemd
says the engine exited (a crash at start-up, e.g. weights that do not fit the config):
systemd restarting it again and again would otherwise look like a slow start.

Exit 0: healthy. 1: not healthy within --timeout. 2: the engine exited (systemd is
about to restart it, or did, or the unit failed/stopped); the unit is then stopped so
that it does not crash again and again. Prints one line saying which.
"""

import argparse
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


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--unit", required=True)
    p.add_argument("--timeout", type=float, required=True)
    p.add_argument("--interval", type=float, default=2.0)
    args = p.parse_args()
    first = unit_state(args.unit)
    restarts = int(first.get("NRestarts", "0") or 0)
    started = time.monotonic()
    while True:
        if healthy(args.url):
            print(f"healthy after {time.monotonic() - started:.0f} s")
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
