#!/usr/bin/env python3
"""A bounded load through a load balancer, for fault-injection scenarios (test tool).

Runs WORKERS threads sending greedy completions until DURATION seconds have passed or
STOP_FILE exists, then writes one JSON object to OUT: every request's start and end
(monotonic-free wall clock, so other hosts' timestamps compare) and its status.
"""

import argparse
import json
import os
import threading
import time
import urllib.error
import urllib.request


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("--model", required=True)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--duration", type=float, default=300)
    p.add_argument("--stop-file", default="/tmp/load_loop.stop")
    p.add_argument("--out", default="/tmp/load_loop.json")
    p.add_argument("--key-env", default="LB_KEY")
    args = p.parse_args()
    key = os.environ.get(args.key_env, "")
    body = json.dumps({"model": args.model, "prompt": "The fleet", "max_tokens": 8,
                       "temperature": 0}).encode()
    deadline = time.time() + args.duration
    results, lock = [], threading.Lock()

    def worker() -> None:
        while time.time() < deadline and not os.path.exists(args.stop_file):
            req = urllib.request.Request(args.url, data=body, headers={
                "Content-Type": "application/json", "Authorization": f"Bearer {key}"})
            start = time.time()
            try:
                with urllib.request.urlopen(req, timeout=120) as resp:
                    resp.read()
                    status = resp.status
            except urllib.error.HTTPError as err:
                status = err.code
            except OSError as err:
                status = f"error: {err}"
            with lock:
                results.append({"start": start, "end": time.time(), "status": status})

    threads = [threading.Thread(target=worker) for _ in range(args.workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with open(args.out, "w") as f:
        json.dump({"requests": results}, f)


if __name__ == "__main__":
    main()
