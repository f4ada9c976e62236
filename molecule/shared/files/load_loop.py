#!/usr/bin/env python3
"""A bounded load through a load balancer, for fault-injection scenarios (test tool).

Runs WORKERS threads sending greedy completions (each pausing PAUSE seconds between
two, so the machine keeps room for the rest of the test) until DURATION seconds have
passed or STOP_FILE exists, then writes one JSON object to OUT: every request's start
and end (wall clock, so other hosts' timestamps compare) and its status.

With --probe NAME=URL it also polls URL every 0.25 s and, with --haproxy-socket, the
state of every HAProxy server, and records each change as an event {t, what, state}:
the moments an engine stopped answering and HAProxy took it out or back, measured here
rather than by the slower test driver. With --nginx-conf, on an Nginx host: each
instance's server line in that rendered file ("nginx:NAME": down or up) and each reload
Nginx applied ("nginx-reload": how many so far; new worker processes appear).
"""

import argparse
import csv
import io
import json
import os
import re
import socket
import threading
import time
import urllib.error
import urllib.request

POLL = 0.25


def health(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            return str(resp.status)
    except urllib.error.HTTPError as err:
        return str(err.code)
    except OSError:
        return "down"


def haproxy_states(path: str) -> dict:
    """Server name -> status (UP, DOWN, DRAIN, MAINT ...) from `show stat`."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(2)
        sock.connect(path)
        sock.sendall(b"show stat -1 4 -1\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    rows = csv.DictReader(io.StringIO(data.decode().removeprefix("# ")))
    return {row["svname"]: row["status"] for row in rows}


SERVER = re.compile(r"# instance (\S+): [^\n]*\n\s*server \S+ (down;)?")


def nginx_servers(conf: str) -> dict:
    """Instance name -> "down" or "up", from the server lines of the rendered nginx.conf."""
    with open(conf) as f:
        text = f.read()
    return {m.group(1): "down" if m.group(2) else "up" for m in SERVER.finditer(text)}


def nginx_workers() -> set:
    """The Nginx master's children: a new set once a reload has been applied."""
    with open("/run/nginx.pid") as f:
        master = f.read().strip()
    kids = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == master:
            kids.add(pid)
    return kids


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("--model", required=True)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--pause", type=float, default=0.0)
    p.add_argument("--duration", type=float, default=300)
    p.add_argument("--timeout", type=float, default=120, help="seconds a request may take")
    p.add_argument("--stop-file", default="/tmp/load_loop.stop")
    p.add_argument("--out", default="/tmp/load_loop.json")
    p.add_argument("--key-env", default="LB_KEY")
    p.add_argument("--probe", action="append", default=[], metavar="NAME=URL")
    p.add_argument("--haproxy-socket")
    p.add_argument("--nginx-conf")
    args = p.parse_args()
    key = os.environ.get(args.key_env, "")
    body = json.dumps({"model": args.model, "prompt": "The fleet", "max_tokens": 8,
                       "temperature": 0}).encode()
    deadline = time.time() + args.duration
    results, events, lock = [], [], threading.Lock()

    def running() -> bool:
        return time.time() < deadline and not os.path.exists(args.stop_file)

    def worker() -> None:
        while running():
            req = urllib.request.Request(args.url, data=body, headers={
                "Content-Type": "application/json", "Authorization": f"Bearer {key}"})
            start = time.time()
            try:
                with urllib.request.urlopen(req, timeout=args.timeout) as resp:
                    resp.read()
                    status = resp.status
            except urllib.error.HTTPError as err:
                status = err.code
            except OSError as err:
                status = f"error: {err}"
            with lock:
                results.append({"start": start, "end": time.time(), "status": status})
            time.sleep(args.pause)

    def watcher() -> None:
        probes = dict(item.split("=", 1) for item in args.probe)
        last, pids, reloads = {}, None, 0
        while running():
            now = time.time()
            seen = {f"health:{name}": health(url) for name, url in probes.items()}
            if args.haproxy_socket:
                try:
                    states = haproxy_states(args.haproxy_socket)
                except OSError as err:
                    states = {"socket": f"error: {err}"}
                seen.update({f"haproxy:{name}": state for name, state in states.items()})
            if args.nginx_conf:
                try:
                    lines = nginx_servers(args.nginx_conf)
                except OSError as err:
                    lines = {"conf": f"error: {err}"}
                try:
                    now_pids = nginx_workers()
                except OSError:
                    now_pids = pids
                seen.update({f"nginx:{name}": state for name, state in lines.items()})
                # After a reload the old workers finish their requests: new ones appear.
                reloads += bool(pids and now_pids and now_pids - pids)
                pids = now_pids or pids
                seen["nginx-reload"] = reloads
            for what, state in seen.items():
                if last.get(what) != state:
                    events.append({"t": now, "what": what, "state": state})
                    last[what] = state
            time.sleep(POLL)

    threads = [threading.Thread(target=worker) for _ in range(args.workers)]
    if args.probe or args.haproxy_socket or args.nginx_conf:
        threads.append(threading.Thread(target=watcher))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with open(args.out, "w") as f:
        json.dump({"requests": results, "events": events}, f)


if __name__ == "__main__":
    main()
