#!/usr/bin/env python3
"""Send requests through a load balancer and summarise what came back (molecule/lb only).

Prints one JSON object: the count of each status (or "error" for a failed connection,
with the reason in "errors": a refused connection, or a timeout where a firewall drops),
the count of each backend that answered (the fake engines name themselves), for a
stream the seconds to its first and last byte, and the last answer's headers and body.
"""

import argparse
import http.client
import json
import os
import time
from collections import Counter
from urllib.parse import urlsplit


def one(url, method, key, body, stream, timeout=30.0):
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    start = time.monotonic()
    try:
        conn.request(method, parts.path, body=body if method == "POST" else None, headers=headers)
        resp = conn.getresponse()
        first = last = None
        data = b""
        while True:
            chunk = resp.read1(65536) if stream else resp.read()
            if not chunk:
                break
            now = time.monotonic() - start
            first = now if first is None else first
            last = now
            data += chunk
            if not stream:
                break
        served_by = None
        for line in data.decode(errors="replace").splitlines():
            line = line.removeprefix("data: ")
            try:
                served_by = json.loads(line).get("served_by") or served_by
            except (ValueError, AttributeError):
                continue
        received = {name.lower(): value for name, value in resp.getheaders()}
        received["body"] = data.decode(errors="replace")[:1000]
        return str(resp.status), served_by, first, last, received
    except OSError as err:
        return "error", f"{type(err).__name__}: {err}", None, None, {}
    finally:
        conn.close()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--method", default="POST")
    parser.add_argument("--count", type=int, default=1)
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--key-env", default="LB_KEY", help="environment variable with the key")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per connection")
    parser.add_argument("--model", default="fake", help='the model asked for ("" for none)')
    args = parser.parse_args()
    key = os.environ.get(args.key_env, "")
    payload = {"model": args.model, "prompt": "hi", "max_tokens": 4}
    if not args.model:
        del payload["model"]
    if args.stream:
        payload.update(stream=True, chunks=5, interval=0.5)
    body = json.dumps(payload)
    statuses, backends, errors, timings, headers = Counter(), Counter(), [], [], {}
    for _ in range(args.count):
        status, served_by, first, last, headers = one(
            args.url, args.method, key, body, args.stream, args.timeout
        )
        statuses[status] += 1
        if status == "error":
            errors.append(served_by)
        elif served_by:
            backends[served_by] += 1
        timings.append({"first_byte_s": first, "last_byte_s": last})
    print(
        json.dumps(
            {
                "status": statuses,
                "served_by": backends,
                "errors": errors,
                "timings": timings,
                "last_headers": {k: v for k, v in headers.items() if k != "body"},
                "last_body": headers.get("body", ""),
            }
        )
    )


if __name__ == "__main__":
    main()
