#!/usr/bin/env python3
"""What a load balancer does with its servers, seen from the load balancer itself, every
0.2 s until the stop file appears: one JSON line per change, {"t": epoch, ...}.

  lb_watch.py haproxy SOCKET OUT STOP   each server's status in `show stat` (UP, DRAIN,
                                        MAINT, DOWN...): {"server": name, "status": s}
  lb_watch.py nginx CONF OUT STOP       each instance's server line in the rendered
                                        nginx.conf, down or not: {"server": name,
                                        "down": bool}; and each reload that Nginx applied
                                        (new worker processes appear): {"reload": n}
"""

import csv
import io
import json
import os
import re
import socket
import sys
import time


def haproxy(path):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(2)
    s.connect(path)
    s.sendall(b"show stat -1 4 -1\n")
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    s.close()
    rows = csv.DictReader(io.StringIO(data.decode().lstrip("# ")))
    return {r["svname"]: r["status"] for r in rows}


SERVER = re.compile(r"# instance (\S+): [^\n]*\n\s*server \S+ (down;)?")


def nginx(conf):
    with open(conf) as f:
        text = f.read()
    return {m.group(1): bool(m.group(2)) for m in SERVER.finditer(text)}


def workers():
    """The nginx master's children: a new set once a reload has been applied."""
    with open("/run/nginx.pid") as f:
        master = f.read().strip()
    kids = set()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[1] == master:
                kids.add(pid)
    return kids


def main():
    kind, source, out, stop = sys.argv[1:5]
    seen, pids, reloads = {}, None, 0
    with open(out, "w") as log:
        while not os.path.exists(stop):
            now = time.time()
            try:
                state = haproxy(source) if kind == "haproxy" else nginx(source)
            except OSError:
                state = {}
            for name, value in state.items():
                if seen.get(name) != value:
                    key = "status" if kind == "haproxy" else "down"
                    log.write(json.dumps({"t": now, "server": name, key: value}) + "\n")
                    seen[name] = value
            if kind == "nginx":
                try:
                    now_pids = workers()
                except OSError:
                    now_pids = pids
                # Old workers finish their requests after a reload: new ones appear.
                if pids is not None and now_pids - pids:
                    reloads += 1
                    log.write(json.dumps({"t": now, "reload": reloads}) + "\n")
                pids = now_pids or pids
            log.flush()
            time.sleep(0.2)


if __name__ == "__main__":
    main()
