# Copyright: inferfleet contributors
# Apache License 2.0 (see pyproject.toml)
"""inferfleet's model peer server: the pieces of model versions this node has verified,
read-only, to the fleet's other nodes (docs/model-sync.md, "Between nodes").

It serves what model_sync publishes in ``CACHE/NAME/.peer-VERSION.json`` and nothing
else: that state, the version's manifest, and each piece the state marks as verified
(all of them once the version is complete), by its number in the manifest's piece table:

    GET /v1/NAME/VERSION/state       the state (JSON)
    GET /v1/NAME/VERSION/manifest    manifest.json
    GET /v1/NAME/VERSION/piece/N     piece N, with X-Inferfleet-Digest: the manifest digest

Only clients in ``allow`` (the fleet's engine nodes), only with the bearer token of
``token_file`` when one is set, at most ``max_connections`` pieces at once (503 beyond),
and all pieces together at most ``max_mbit`` megabits a second (0: no cap). A version
that model_sync evicts loses its state file and stops being served at once.

Standard library only; ``manifest.py`` (the collection's) is installed beside it.
    model_peer.py CONFIG.json
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import os
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from manifest import ManifestError, hex_has, loads, peer_state_file, piece_table  # noqa: E402

NAME = r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}"
ROUTE = re.compile(rf"^/v1/({NAME})/({NAME})/(state|manifest|piece/(\d{{1,9}}))$")
CHUNK = 1024 * 1024


class Bucket:
    """One rate for every piece being sent: each chunk is given its slot in turn."""

    def __init__(self, bytes_per_second: float):
        self.rate = bytes_per_second
        self.lock = threading.Lock()
        self.next = time.monotonic()

    def take(self, n: int) -> None:
        if self.rate <= 0:
            return
        with self.lock:
            now = time.monotonic()
            start = max(now, self.next)
            self.next = start + n / self.rate
        if start > now:
            time.sleep(start - now)


class Tables:
    """Piece tables of the manifests read, by file identity (a new file is read again)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.cache = {}

    def get(self, path: str, digest: str):
        st = os.stat(path)
        key = (path, st.st_ino, st.st_mtime_ns, st.st_size)
        with self.lock:
            if key in self.cache:
                return self.cache[key]
        with open(path, "rb") as f:
            raw = f.read()
        manifest = loads(raw)
        if manifest["digest"] != digest or "piece_size" not in manifest:
            raise ManifestError(f"{path} is not the manifest of the state ({digest})")
        value = (raw, piece_table(manifest))
        with self.lock:
            self.cache = {k: v for k, v in self.cache.items() if k[0] != path}
            self.cache[key] = value
        return value


class Handler(BaseHTTPRequestHandler):
    server_version = "inferfleet-model-peer"
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # only refusals and errors reach the journal
        pass

    def _refuse(self, status: int, why: str) -> None:
        if status not in (404, 503):
            sys.stderr.write(f"{self.client_address[0]} {self.path}: {status} {why}\n")
        body = (why + "\n").encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _allowed(self) -> bool:
        cfg = self.server.cfg
        try:
            client = ipaddress.ip_address(self.client_address[0])
        except ValueError:
            client = None
        if client is None or not any(client in net for net in self.server.allow):
            self._refuse(403, "not a member of this fleet")
            return False
        token = cfg.get("token", "")
        given = self.headers.get("Authorization", "")
        if token and not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            self._refuse(401, "a peer token is required")
            return False
        return True

    def do_GET(self):  # noqa: N802 - the http.server API
        if not self._allowed():
            return
        match = ROUTE.match(self.path)
        if not match:
            self._refuse(404, "no such resource")
            return
        name, version, what, number = match.groups()
        model_dir = os.path.join(self.server.cfg["cache_root"], name)
        try:
            with open(os.path.join(model_dir, peer_state_file(version)), "rb") as f:
                state = json.loads(f.read())
            folder = state["dir"]
            if not re.fullmatch(rf"{NAME}|\.tmp-{NAME}", folder) or folder in (".", ".."):
                raise ValueError(f"bad folder {folder!r}")
        except (OSError, ValueError, KeyError, ManifestError):
            self._refuse(404, f"{name} {version} is not held here")
            return
        if what == "state":
            self._send_bytes(json.dumps(state, sort_keys=True).encode(), "application/json")
            return
        try:
            raw, table = self.server.tables.get(
                os.path.join(model_dir, folder, "manifest.json"), state["digest"])
        except (OSError, ManifestError) as exc:
            self._refuse(404, f"{name} {version}: no usable manifest here ({exc})")
            return
        if what == "manifest":
            self._send_bytes(raw, "application/json")
            return
        index = int(number)
        have = state.get("have", "")
        if index >= len(table) or not (have == "all" or hex_has(have, index)):
            self._refuse(404, f"piece {index} of {name} {version} is not held here")
            return
        if not self.server.slots.acquire(blocking=False):
            self._refuse(503, "busy: too many pieces being sent")
            return
        try:
            self._send_piece(os.path.join(model_dir, folder), table[index], state["digest"])
        finally:
            self.server.slots.release()

    def _send_bytes(self, body: bytes, kind: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _send_piece(self, folder: str, piece, digest: str) -> None:
        path, start, end, _ = piece
        try:
            fd = os.open(os.path.join(folder, *path.split("/")), os.O_RDONLY)
        except OSError:
            self._refuse(404, f"{path} is gone (the version was evicted)")
            return
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(end - start))
            self.send_header("X-Inferfleet-Digest", digest)
            self.end_headers()
            self.wfile.flush()
            sock = self.connection.fileno()
            pos = start
            while pos < end:
                n = min(CHUNK, end - pos)
                self.server.bucket.take(n)
                sent = os.sendfile(sock, fd, pos, n)
                if not sent:
                    raise OSError("the file ended early")
                pos += sent
        except OSError:
            self.close_connection = True
        finally:
            os.close(fd)


def make_server(cfg: dict) -> ThreadingHTTPServer:
    """A server for a config: cache_root, address, port, allow (networks), token,
    max_mbit, max_connections."""
    server = ThreadingHTTPServer((cfg.get("address", "0.0.0.0"), int(cfg["port"])), Handler)
    server.daemon_threads = True
    server.cfg = cfg
    server.allow = [ipaddress.ip_network(a, strict=False) for a in cfg.get("allow", [])]
    server.bucket = Bucket(float(cfg.get("max_mbit", 0)) * 1e6 / 8)
    server.slots = threading.BoundedSemaphore(int(cfg.get("max_connections", 16)))
    server.tables = Tables()
    return server


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: model_peer.py CONFIG.json")
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    if cfg.get("token_file"):
        with open(cfg["token_file"]) as f:
            cfg["token"] = f.read().strip()
    make_server(cfg).serve_forever()


if __name__ == "__main__":
    main()
