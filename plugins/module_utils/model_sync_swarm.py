# Copyright: inferfleet contributors
# Apache License 2.0 (see pyproject.toml)
"""model_sync between peers: a node takes the pieces of a version from the fleet's
other nodes, and from the object store only what no peer holds or is fetching.

The object store stays the root of trust: the manifest (format 2) comes from it (or,
when its digest is pinned, from any peer, checked against that digest) and holds the
SHA-256 of every piece. Every piece, from a peer or from the store, is checked against
it before it is written or offered to others; a peer that sends a piece that fails is
dropped for the rest of the run and the piece taken elsewhere. What only the nodes hold
(source=peers: a compile cache one node made and published, source=folder) has no store:
its manifest is a holder's, and a piece no peer holds fails the run.

Each node publishes what it holds in ``CACHE/NAME/.peer-VERSION.json`` (the folder the
pieces are in, the manifest digest, a bitfield of the verified pieces and one of the
pieces it is fetching from the store right now); the role's peer server
(roles/model_sync/files/model_peer.py) serves that file and the verified pieces, and
nothing else, to the fleet's members. Who fetches a piece from the store: when no peer
holds it and none is fetching it, the piece's owner among the nodes syncing the same
version (piece number modulo their count, by name), so the store is asked for each
piece about once per fleet. A lone node, or one whose peers are all gone, owns every
piece: it behaves as without peers.

Standard library only; shipped to nodes with the model_sync module.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import quote, urlsplit

from ansible_collections.inferfleet.fleet.plugins.module_utils.manifest import (
    ManifestError,
    compute_digest,
    hex_has,
    loads,
    peer_state_file,
    piece_table,
    pieces_hex,
)
from ansible_collections.inferfleet.fleet.plugins.module_utils.model_sync_transfer import (
    SyncError,
    _write_file,
)

API = "/v1"
# A state or manifest is small: a peer that does not answer within this long is down for
# now (a powered-off node drops packets; waiting the transfer's timeout on each look
# would blind the node to every other peer's progress meanwhile).
LOOK_TIMEOUT = 3.0


def state_path(model_dir: str, version: str) -> str:
    return os.path.join(model_dir, peer_state_file(version))


def write_state(model_dir: str, version: str, digest: str, folder: str, have="all",
                busy: str = "") -> None:
    """Publish what this node holds of a version (atomically: the peer server reads it
    at any moment). ``have`` is "all" for a complete version, else a hex bitfield."""
    state = {"digest": digest, "dir": folder, "have": have, "busy": busy}
    path = state_path(model_dir, version)
    _write_file(path + ".new", json.dumps(state, sort_keys=True) + "\n")
    os.replace(path + ".new", path)


def remove_state(model_dir: str, version: str) -> None:
    for path in (state_path(model_dir, version), state_path(model_dir, version) + ".new"):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


class PeerError(Exception):
    """A peer that cannot answer now (unreachable, an error status)."""


class PeerBusy(PeerError):
    """A peer that sends as many pieces as it may at once (HTTP 503): up, ask again soon."""


class Peer:
    """One other node's peer server, ``http://ADDRESS:PORT``."""

    def __init__(self, name: str, url: str, token: str, timeout: float):
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname or not parts.port:
            raise SyncError(f"invalid peer URL {url!r} for {name}: expected http://HOST:PORT")
        self.name = name
        self.url = url
        self.host = parts.hostname
        self.port = parts.port
        self.token = token
        self.timeout = timeout

    def _get(self, path: str, into=None, timeout: float = 0):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout or self.timeout)
        try:
            headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
            conn.request("GET", API + path, headers=headers)
            resp = conn.getresponse()
            if resp.status != 200:
                resp.read(4096)
                kind = PeerBusy if resp.status == 503 else PeerError
                raise kind(f"{self.name} answered HTTP {resp.status} for {API + path}")
            if into is None:
                return resp.read(64 * 1024 * 1024)
            length = int(resp.getheader("Content-Length", "-1"))
            if length != len(into):
                raise PeerError(f"{self.name} sent {length} bytes for {API + path}, "
                                f"{len(into)} expected")
            got = 0
            while got < length:
                n = resp.readinto(into[got:])
                if not n:
                    raise PeerError(f"{self.name} closed {API + path} after {got} bytes")
                got += n
            return resp.getheader("X-Inferfleet-Digest", "")
        except (OSError, http.client.HTTPException) as exc:
            raise PeerError(f"{self.name} ({self.url}): {exc}") from None
        finally:
            conn.close()

    def state(self, name: str, version: str):
        """The peer's state of a version, or None when it holds nothing of it."""
        try:
            data = json.loads(self._get(f"/{quote(name)}/{quote(version)}/state",
                                        timeout=min(self.timeout, LOOK_TIMEOUT)))
        except PeerError as exc:
            if "HTTP 404" in str(exc):
                return None
            raise
        except ValueError:
            raise PeerError(f"{self.name} sent a state that is not JSON") from None
        if not isinstance(data, dict) or not isinstance(data.get("have"), str):
            raise PeerError(f"{self.name} sent a malformed state")
        return data

    def manifest(self, name: str, version: str) -> bytes:
        return self._get(f"/{quote(name)}/{quote(version)}/manifest",
                         timeout=min(self.timeout, LOOK_TIMEOUT))

    def piece(self, name: str, version: str, index: int, into) -> str:
        """Read piece ``index`` into ``into``; returns the manifest digest the peer says
        it belongs to."""
        return self._get(f"/{quote(name)}/{quote(version)}/piece/{index}", into)


class NoStore:
    """The store of a version that only the peers hold (source=peers): what a node made
    itself and offered (vLLM's compile cache). Asked for anything, it fails."""

    kind = "peers"

    def __init__(self, name: str, version: str):
        self.name = name
        self.version = version

    def where(self, rel: str = "") -> str:
        return f"the peers' {self.name}/{self.version}" + (f"/{rel}" if rel else "")

    def read_manifest(self) -> bytes:
        raise SyncError(f"no peer holds {self.name}/{self.version}")

    def fetch(self, entry: dict, start: int, end: int, into: memoryview, on_data) -> None:
        raise SyncError(f"no peer holds {entry['path']} bytes {start}-{end - 1} of "
                        f"{self.name}/{self.version}, and source=peers has no object store "
                        "to fall back on")

    def close(self) -> None:
        pass


class SwarmSource:
    """A transfer source that reads each piece from a peer when one holds it, else from
    ``store`` (only the piece's owner does), verifying every piece against the manifest."""

    kind = "swarm"
    verifies_pieces = True  # the transfer need not hash the files again

    def __init__(self, store, me: str, peers: list, token: str, name: str, version: str,
                 timeout: float = 10.0, stall: float = 30.0, poll: float = 0.2,
                 pinned_digest: str = ""):
        self.store = store
        self.me = me
        self.peers = [Peer(p["name"], p["url"], token, timeout) for p in peers
                      if p["name"] != me]
        self.name = name
        self.version = version
        self.stall = stall
        self.poll = poll
        self.pinned = pinned_digest
        self.table = []
        self.index = {}
        self.digest = ""
        self.publish = None
        self.have = set()
        self.busy = set()
        self.view = {}  # peer name -> its last state (None: holds nothing; missing: down)
        self.progress = {}  # peer name -> (pieces held, when that count last grew)
        self.dropped = {}  # peer name -> why it was dropped for this run
        self.refusing = {}  # peer name -> when it began to answer busy (since its last piece)
        self.bytes_from_store = 0
        self.bytes_from_peers = {}
        self.warnings = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._poller = None

    # -- what the transfer engine calls ----------------------------------------------
    def where(self, rel: str = "") -> str:
        return self.store.where(rel)

    def read_manifest(self) -> bytes:
        """The store's manifest; with a pinned digest and the store unreachable, a peer's
        that has exactly that digest. With no store (source=peers), the first peer's that
        holds the version whole (and has the pinned digest, when one is)."""
        peers_only = isinstance(self.store, NoStore)
        try:
            return self.store.read_manifest()
        except Exception as exc:
            if not (self.pinned or peers_only) or not self.peers:
                raise
            store_error = exc
        for peer in self.peers:
            try:
                if peers_only and (peer.state(self.name, self.version) or {}).get("have") != "all":
                    continue
                raw = peer.manifest(self.name, self.version)
                if not self.pinned or compute_digest(loads(raw)) == self.pinned:
                    if not peers_only:
                        self.warnings.append(
                            f"the object store failed ({store_error}); the manifest came "
                            f"from {peer.name}, checked against the pinned digest {self.pinned}")
                    return raw
            except (PeerError, ManifestError):
                continue
        if peers_only:
            pin = f" with digest {self.pinned}" if self.pinned else ""
            raise SyncError(f"{store_error}{pin}") from None
        raise SyncError(f"{store_error}; and no peer holds the manifest with digest "
                        f"{self.pinned}") from None

    def begin(self, manifest: dict, publish, held=()) -> None:
        """Start a version: ``publish(have_hex, busy_hex)`` makes this node's state
        visible to its peers; ``held``: entries already here (verified copies of another
        version's files). Looks at the peers once before the first piece."""
        self.table = piece_table(manifest)
        self.index = {(path, start): i for i, (path, start, _, _) in enumerate(self.table)}
        self.digest = manifest["digest"]
        self.publish = publish
        paths = {e["path"] for e in held}
        self.have = {i for i, piece in enumerate(self.table) if piece[0] in paths}
        self._announce()
        self._look()
        self._poller = threading.Thread(target=self._poll_loop, name="model-sync-peers",
                                        daemon=True)
        self._poller.start()

    def fetch(self, entry: dict, start: int, end: int, into: memoryview, on_data) -> None:
        index = self.index[(entry["path"], start)]
        view = into[:end - start]
        while not self._stop.is_set():
            for peer in self._holders(index):
                if self._from_peer(peer, index, view):
                    on_data(start, view)
                    return
            if self._mine(index) and self._claim(index):
                self._from_store(entry, index, start, end, view)
                on_data(start, view)
                return
            time.sleep(self.poll * random.uniform(0.25, 0.75))
        raise SyncError("stopped")

    def written(self, entry: dict, start: int, end: int) -> None:
        """A piece is on disk: offer it to the peers."""
        index = self.index.get((entry["path"], start))
        if index is not None:
            with self._lock:
                self.have.add(index)
                self.busy.discard(index)
            self._announce()

    def cancel(self) -> None:
        self._stop.set()

    def finish(self) -> None:
        """Stop looking at the peers (the transfer is over)."""
        self._stop.set()
        if self._poller is not None:
            self._poller.join()
            self._poller = None

    def close(self) -> None:
        self.finish()
        self.store.close()

    # -- choosing ----------------------------------------------------------------------
    def _holders(self, index: int) -> list:
        with self._lock:
            found = [p for p in self.peers if p.name not in self.dropped
                     and not self._refused_too_long(p.name)
                     and _holds(self.view.get(p.name), self.digest, index)]
        random.shuffle(found)  # spread the readers of one piece over its holders
        return found

    def _members(self) -> list:
        """The nodes syncing this version now (this one included), by name."""
        names = [self.me]
        for peer in self.peers:
            state = self.view.get(peer.name)
            if (peer.name not in self.dropped and state and state.get("digest") == self.digest
                    and state.get("have") != "all"):
                names.append(peer.name)
        return sorted(names)

    def _mine(self, index: int) -> bool:
        """Whether this node should take the piece from the store now: no peer holds it or
        is fetching it, and this node is its owner, or its owner has made no progress for a
        while."""
        with self._lock:
            if self._taken(index, self.peers):
                return False
            members = self._members()
            owner = members[index % len(members)]
            return owner == self.me or self._stalled(owner)

    def _claim(self, index: int) -> bool:
        """Say this node fetches the piece from the store, then look at the peers again:
        a peer that holds it, or says it fetches it too, keeps it. Of two nodes that claim
        a piece at once, the later sees the earlier (both back off when each sees the
        other; the owner rule settles it on the next try), so no two read it from the store
        (nodes that start apart see different members, and so different owners, at first)."""
        with self._lock:
            self.busy.add(index)
            up = [p for p in self.peers if p.name not in self.dropped and p.name in self.view]
        self._announce()
        self._look(up)  # the peers that answered the last look: a dead one costs nothing
        with self._lock:
            taken = self._taken(index, up)
            if taken:
                self.busy.discard(index)
        if taken:
            self._announce()
        return not taken

    def _taken(self, index: int, peers: list) -> bool:
        """(Under the lock.) Whether one of ``peers`` holds the piece, or fetches it from
        the store and has not stalled."""
        return any(p.name not in self.dropped and not self._refused_too_long(p.name)
                   and (_holds(self.view.get(p.name), self.digest, index)
                        or (_fetches(self.view.get(p.name), self.digest, index)
                            and not self._stalled(p.name)))
                   for p in peers)

    def _stalled(self, name: str) -> bool:
        held, since = self.progress.get(name, (0, time.monotonic()))
        return time.monotonic() - since > self.stall

    def _refused_too_long(self, name: str) -> bool:
        """Whether a peer has answered busy, and sent no piece, for longer than the stall
        time: its pieces are then nobody's (a peer whose slots never free would otherwise
        hold the sync for ever)."""
        since = self.refusing.get(name)
        return since is not None and time.monotonic() - since > self.stall

    # -- moving bytes ------------------------------------------------------------------
    def _from_peer(self, peer: Peer, index: int, view: memoryview) -> bool:
        try:
            digest = peer.piece(self.name, self.version, index, view)
        except PeerBusy:
            # Up, and still holding (or fetching) what it did: its pieces stay its own, or
            # the store would be asked for what the fleet already has; for the stall time.
            with self._lock:
                self.refusing.setdefault(peer.name, time.monotonic())
            return False
        except PeerError:
            with self._lock:
                self.view.pop(peer.name, None)  # down until it answers a look again
            return False
        if digest != self.digest or hashlib.sha256(view).hexdigest() != self.table[index][3]:
            self._drop(peer, f"piece {index} ({self.table[index][0]} at byte "
                             f"{self.table[index][1]}) failed its SHA-256")
            return False
        with self._lock:
            self.bytes_from_peers[peer.name] = self.bytes_from_peers.get(peer.name, 0) + len(view)
            self.refusing.pop(peer.name, None)
        return True

    def _from_store(self, entry: dict, index: int, start: int, end: int,
                    view: memoryview) -> None:
        self.store.fetch(entry, start, end, view, lambda _offset, _data: None)
        if hashlib.sha256(view).hexdigest() != self.table[index][3]:
            raise SyncError(f"checksum mismatch for {self.store.where(entry['path'])} bytes "
                            f"{start}-{end - 1}: the manifest's piece {index} has sha256 "
                            f"{self.table[index][3]}, the store's bytes hash to "
                            f"{hashlib.sha256(view).hexdigest()}")
        with self._lock:
            self.bytes_from_store += end - start

    def _drop(self, peer: Peer, why: str) -> None:
        with self._lock:
            if peer.name not in self.dropped:
                self.dropped[peer.name] = why
                self.warnings.append(f"peer {peer.name} dropped: {why}")

    # -- state ---------------------------------------------------------------------------
    def _announce(self) -> None:
        with self._lock:
            have = pieces_hex(self.have, len(self.table))
            busy = pieces_hex(self.busy, len(self.table))
            self.publish(have, busy)

    def _look(self, peers=None) -> None:
        """Read every peer's state, or those of ``peers`` (in parallel: a dead peer costs
        its timeout once)."""
        live = [p for p in (self.peers if peers is None else peers) if p.name not in self.dropped]
        if not live:
            return

        def one(peer: Peer):
            try:
                return peer.name, True, peer.state(self.name, self.version)
            except PeerError:
                return peer.name, False, None

        with ThreadPoolExecutor(min(16, len(live))) as pool:
            answers = list(pool.map(one, live))
        now = time.monotonic()
        with self._lock:
            for name, up, state in answers:
                if not up:
                    self.view.pop(name, None)
                    continue
                self.view[name] = state
                held = _count(state)
                if held != self.progress.get(name, (-1, now))[0]:
                    self.progress[name] = (held, now)

    def _poll_loop(self) -> None:
        while not self._stop.wait(self.poll):
            self._look()


def _holds(state, digest: str, index: int) -> bool:
    if not state or state.get("digest") != digest:
        return False
    return state["have"] == "all" or hex_has(state["have"], index)


def _fetches(state, digest: str, index: int) -> bool:
    """Whether a peer's state says it fetches the piece from the store now."""
    return bool(state) and state.get("digest") == digest and hex_has(state.get("busy", ""), index)


def _count(state) -> int:
    """Pieces a peer holds (-1: all of them): how its progress is seen."""
    if not state:
        return 0
    if state.get("have") == "all":
        return -1
    return bin(int(state["have"] or "0", 16)).count("1")
