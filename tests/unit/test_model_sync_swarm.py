"""model_sync between peers, in one process: each node is a cache root with its own real
peer server (roles/model_sync/files/model_peer.py on a free port); the object store is a
folder that counts the bytes read from it and can be made to fail. The sync is the
module's own Syncer; nothing is stubbed between the nodes but the network's distance."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest
from ansible_collections.inferfleet.fleet.plugins.module_utils import manifest as mf
from ansible_collections.inferfleet.fleet.plugins.module_utils.model_sync_cache import Syncer
from ansible_collections.inferfleet.fleet.plugins.module_utils.model_sync_swarm import (
    SwarmSource,
)
from ansible_collections.inferfleet.fleet.plugins.module_utils.model_sync_transfer import (
    PathSource,
    SyncError,
)
from ansible_collections.inferfleet.fleet.plugins.module_utils.s3 import S3Unreachable

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "roles" / "model_sync" / "files"))
sys.path.insert(0, str(REPO / "plugins" / "module_utils"))
import model_peer  # noqa: E402

MiB = 1024 * 1024
TOKEN = "peer-token-0123456789"


class Store(PathSource):
    """The object store: a folder; counts what it serves; `down` makes it unreachable."""

    def __init__(self, root, name, version):
        super().__init__(str(root), name, version)
        self.served = 0
        self.down = False
        self.lock = threading.Lock()

    def read_manifest(self):
        if self.down:
            raise S3Unreachable("cannot connect to the object store (test)")
        return super().read_manifest()

    def fetch(self, entry, start, end, into, on_data):
        if self.down:
            raise S3Unreachable("cannot connect to the object store (test)")
        super().fetch(entry, start, end, into, on_data)
        with self.lock:
            self.served += end - start


@pytest.fixture
def model(tmp_path):
    """tiny/v1 in the store: 20.5 MiB in three files (pieces of 1 MiB), format 2."""
    src = tmp_path / "store" / "tiny" / "v1"
    src.mkdir(parents=True)
    (src / "a.safetensors").write_bytes(os.urandom(12 * MiB))
    (src / "b.safetensors").write_bytes(os.urandom(8 * MiB + MiB // 2))
    (src / "config.json").write_text('{"hidden_size": 64}')
    manifest = mf.scan(str(src), "tiny", "v1", piece_size=MiB)
    (src / "manifest.json").write_text(mf.dumps(manifest))
    return tmp_path / "store", manifest


class Node:
    """A node: its cache, its peer server, and how it syncs with the others."""

    def __init__(self, base: Path, name: str, allow=("127.0.0.1/32",), token=TOKEN,
                 max_mbit=0):
        self.name = name
        self.cache = base / name / "models"
        self.cache.mkdir(parents=True)
        self.server = model_peer.make_server({
            "cache_root": str(self.cache), "address": "127.0.0.1", "port": 0,
            "allow": list(allow), "token": token, "max_mbit": max_mbit,
            "max_connections": 8})
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.result = None
        self.error = None

    def stop(self):
        self.server.shutdown()
        self.server.server_close()

    def sync(self, store, peers, pinned="", stall=30.0, timeout=5):
        params = {"name": "tiny", "version": "v1", "cache_root": str(self.cache),
                  "source": "path", "concurrency": 4, "keep_versions": 2,
                  "manifest_digest": pinned}
        source = SwarmSource(store, self.name, [{"name": p.name, "url": p.url} for p in peers],
                             TOKEN, "tiny", "v1", timeout=timeout, stall=stall,
                             pinned_digest=pinned)
        syncer = Syncer(params, source=source)
        try:
            self.result = syncer.run()
        except (SyncError, S3Unreachable) as exc:
            self.error = exc
        self.warnings = syncer.warnings
        return self

    def file(self, rel="a.safetensors"):
        return self.cache / "tiny" / "current" / rel

    def state(self):
        return json.loads((self.cache / "tiny" / ".peer-v1.json").read_text())


@pytest.fixture
def nodes(tmp_path):
    made = []

    def make(n, **kw):
        first = len(made) + 1
        made.extend([Node(tmp_path, f"node{first + i}", **kw) for i in range(n)])
        return made[-n:]

    yield make
    for node in made:
        node.stop()


def verified(node, manifest):
    for f in manifest["files"]:
        data = node.file(f["path"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == f["sha256"], f["path"]
    assert (node.cache / "tiny" / "v1" / ".inferfleet-complete").read_text().strip() == \
        manifest["digest"]


def sync_all(nodes, store_root, **kw):
    stores = [Store(store_root, "tiny", "v1") for _ in nodes]
    threads = [threading.Thread(target=n.sync, args=(s, nodes), kwargs=kw)
               for n, s in zip(nodes, stores, strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return stores


def test_three_nodes_ask_the_store_for_each_piece_about_once(model, nodes):
    store_root, manifest = model
    size = mf.total_size(manifest)
    three = nodes(3)
    stores = sync_all(three, store_root)
    for node in three:
        assert node.error is None, node.error
        verified(node, manifest)
        # Offered whole once complete, from the version's own folder.
        assert node.state() == {"digest": manifest["digest"], "dir": "v1", "have": "all",
                                "busy": ""}
    from_store = sum(s.served for s in stores)
    assert from_store == size, (from_store, size)  # each piece from the store once
    assert sum(n.result["bytes_from_store"] for n in three) == from_store
    for node in three:  # what did not come from the store came from the others
        assert node.result["bytes_from_store"] + sum(node.result["bytes_from_peers"].values()) \
            == size
    # A second run changes nothing and reads nothing.
    again = sync_all(three, store_root)
    assert [n.result["changed"] for n in three] == [False] * 3
    assert sum(s.served for s in again) == 0


def test_a_lone_node_takes_everything_from_the_store(model, nodes, tmp_path):
    store_root, manifest = model
    (node,) = nodes(1)
    gone = Node(tmp_path, "gone")
    gone.stop()  # a member whose server does not answer
    store = Store(store_root, "tiny", "v1")
    node.sync(store, [node, gone])
    assert node.error is None, node.error
    verified(node, manifest)
    assert store.served == mf.total_size(manifest)
    assert node.result["bytes_from_peers"] == {}


def test_a_peer_that_never_answers_does_not_hold_the_sync_for_a_transfer_timeout(model, nodes):
    """A powered-off node drops packets: looking at it gives up after a few seconds, not
    after the transfer's timeout (which would blind the node to the others meanwhile)."""
    import socket

    store_root, manifest = model
    (node,) = nodes(1)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # connections are accepted by the kernel, never answered
    mute = type("Mute", (), {"name": "mute", "url": f"http://127.0.0.1:{silent.getsockname()[1]}"})
    started = time.monotonic()
    try:
        node.sync(Store(store_root, "tiny", "v1"), [node, mute], timeout=30)
    finally:
        silent.close()
    assert node.error is None, node.error
    verified(node, manifest)
    assert time.monotonic() - started < 15


def test_a_new_node_takes_everything_from_a_complete_peer(model, nodes):
    store_root, manifest = model
    first, late = nodes(2)
    first.sync(Store(store_root, "tiny", "v1"), [first])
    store = Store(store_root, "tiny", "v1")
    late.sync(store, [first, late])
    assert late.error is None, late.error
    verified(late, manifest)
    assert store.served == 0
    assert late.result["bytes_from_peers"] == {"node1": mf.total_size(manifest)}


def test_a_peer_serving_corrupted_pieces_is_dropped_and_its_pieces_fetched_elsewhere(
        model, nodes):
    store_root, manifest = model
    bad, good, late = nodes(3)
    bad.sync(Store(store_root, "tiny", "v1"), [bad])
    good.sync(Store(store_root, "tiny", "v1"), [good])
    path = bad.cache / "tiny" / "v1" / "a.safetensors"
    data = bytearray(path.read_bytes())
    data[5 * MiB + 7] ^= 0xFF  # piece 5 of a.safetensors now lies
    path.write_bytes(bytes(data))
    # Only the bad peer first, so it is asked for piece 5 for sure.
    store = Store(store_root, "tiny", "v1")
    late.sync(store, [bad, late])
    assert late.error is None, late.error
    verified(late, manifest)
    assert "piece 5 (a.safetensors at byte 5242880) failed its SHA-256" in \
        late.result["peers_dropped"]["node1"]
    assert store.served > 0  # what the bad peer would have sent came from the store
    # With a good peer beside it, the pieces come from the good one, not the store.
    late2 = nodes(1)[0]
    store2 = Store(store_root, "tiny", "v1")
    late2.sync(store2, [bad, good, late2])
    assert late2.error is None
    verified(late2, manifest)
    assert store2.served == 0 and late2.result["bytes_from_peers"]["node2"] > 0
    assert set(late2.result["peers_dropped"]) <= {"node1"}


def test_a_peer_killed_mid_transfer_leaves_its_pieces_to_the_others(model, nodes):
    store_root, manifest = model
    holder, late = nodes(2)
    holder.sync(Store(store_root, "tiny", "v1"), [holder])
    served = []
    original = model_peer.Handler._send_piece

    def send_then_die(handler, folder, piece, digest):
        served.append(piece)
        if len(served) == 4 and handler.server is holder.server:
            threading.Thread(target=holder.stop).start()
            handler.close_connection = True
            return  # dies without an answer
        original(handler, folder, piece, digest)

    model_peer.Handler._send_piece = send_then_die
    try:
        store = Store(store_root, "tiny", "v1")
        late.sync(store, [holder, late])
    finally:
        model_peer.Handler._send_piece = original
    assert late.error is None, late.error
    verified(late, manifest)
    assert 0 < store.served < mf.total_size(manifest)
    assert 0 < late.result["bytes_from_peers"]["node1"] < mf.total_size(manifest)


def test_a_busy_peer_is_asked_again_not_replaced_by_the_store(model, nodes):
    """A peer that sends as many pieces as it may answers 503: it is up and holds what it
    held, so its pieces wait for a free slot; the store is not asked for them (CI saw two
    nodes read 1.5 times the model from the store when a 503 counted as a dead peer)."""
    store_root, manifest = model
    holder, late = nodes(2)
    holder.sync(Store(store_root, "tiny", "v1"), [holder])

    class Slots:  # every other piece request finds no free slot, the first six of them
        refused = 0
        asked = 0

        def acquire(self, blocking=True):
            self.asked += 1
            if self.refused < 6 and self.asked % 2:
                self.refused += 1
                return False
            return True

        def release(self):
            pass

    holder.server.slots = slots = Slots()
    store = Store(store_root, "tiny", "v1")
    late.sync(store, [holder, late])
    assert late.error is None, late.error
    verified(late, manifest)
    assert slots.refused == 6
    assert store.served == 0
    assert late.result["bytes_from_peers"] == {"node1": mf.total_size(manifest)}
    assert late.result["peers_dropped"] == {}


def test_a_peer_busy_for_longer_than_the_stall_time_is_replaced_by_the_store(model, nodes):
    """A peer whose slots never free (503 to every piece request) must not hold the sync
    for ever: after the stall time without a piece from it, its pieces come from the store."""
    store_root, manifest = model
    holder, late = nodes(2)
    holder.sync(Store(store_root, "tiny", "v1"), [holder])

    class NoSlots:
        refused = 0

        def acquire(self, blocking=True):
            self.refused += 1
            return False

        def release(self):
            pass

    holder.server.slots = slots = NoSlots()
    store = Store(store_root, "tiny", "v1")
    syncing = threading.Thread(target=late.sync, args=(store, [holder, late]),
                               kwargs={"stall": 1.0}, daemon=True)
    syncing.start()
    syncing.join(60)
    assert not syncing.is_alive(), f"still syncing after 60 s ({slots.refused} refusals)"
    assert late.error is None, late.error
    verified(late, manifest)
    assert slots.refused > 0
    assert store.served == mf.total_size(manifest)
    assert late.result["bytes_from_peers"] == {}


def test_store_gone_after_the_first_node_finished(model, nodes):
    store_root, manifest = model
    first, pinned, unpinned = nodes(3)
    first.sync(Store(store_root, "tiny", "v1"), [first])
    store = Store(store_root, "tiny", "v1")
    store.down = True
    # With the digest pinned, the manifest may come from a peer: checked against it.
    pinned.sync(store, [first, pinned], pinned=manifest["digest"])
    assert pinned.error is None, pinned.error
    verified(pinned, manifest)
    # Without it, the store is the only root of trust: a clear failure, nothing left.
    unpinned.sync(store, [first, unpinned])
    assert "cannot connect to the object store" in str(unpinned.error)
    left = list((unpinned.cache / "tiny").iterdir()) if (unpinned.cache / "tiny").exists() else []
    assert [p.name for p in left if p.name != ".lock"] == []


def test_a_failed_sync_leaves_current_and_no_half_version(model, nodes):
    store_root, manifest = model
    node, = nodes(1)
    node.sync(Store(store_root, "tiny", "v1"), [node])
    # v2: the store dies after the manifest, and no peer holds any of it.
    v2 = store_root / "tiny" / "v2"
    v2.mkdir()
    (v2 / "a.safetensors").write_bytes(os.urandom(3 * MiB))
    (v2 / "manifest.json").write_text(mf.dumps(mf.scan(str(v2), "tiny", "v2", piece_size=MiB)))

    class DiesAfterTwo(Store):
        def fetch(self, entry, start, end, into, on_data):
            if self.served >= 2 * MiB:
                raise S3Unreachable("cannot connect to the object store (test)")
            super().fetch(entry, start, end, into, on_data)

    params = {"name": "tiny", "version": "v2", "cache_root": str(node.cache), "source": "path",
              "concurrency": 1}
    source = SwarmSource(DiesAfterTwo(store_root, "tiny", "v2"), node.name,
                         [{"name": node.name, "url": node.url}], TOKEN, "tiny", "v2")
    with pytest.raises(S3Unreachable):
        Syncer(params, source=source).run()
    model_dir = node.cache / "tiny"
    assert os.readlink(model_dir / "current") == "v1"
    assert sorted(p.name for p in model_dir.iterdir()) == [".lock", ".peer-v1.json", "current",
                                                           "v1"]


def _get(node, path, token=TOKEN):
    conn = http.client.HTTPConnection("127.0.0.1", node.server.server_address[1], timeout=5)
    conn.request("GET", path, headers={"Authorization": f"Bearer {token}"} if token else {})
    resp = conn.getresponse()
    return resp.status, resp.read()


def test_the_peer_server_serves_members_with_the_token_and_verified_pieces_only(model, nodes):
    store_root, manifest = model
    node, outsider = nodes(1)[0], nodes(1, allow=("10.0.0.0/8",))[0]
    assert _get(node, "/v1/tiny/v1/state")[0] == 404  # nothing held yet
    node.sync(Store(store_root, "tiny", "v1"), [node])
    assert _get(node, "/v1/tiny/v1/state", token="")[0] == 401
    assert _get(node, "/v1/tiny/v1/state", token="wrong")[0] == 401
    assert _get(outsider, "/v1/tiny/v1/state")[0] == 403
    status, body = _get(node, "/v1/tiny/v1/manifest")
    assert status == 200 and mf.loads(body)["digest"] == manifest["digest"]
    table = mf.piece_table(manifest)
    status, body = _get(node, "/v1/tiny/v1/piece/13")
    assert status == 200 and hashlib.sha256(body).hexdigest() == table[13][3]
    assert _get(node, f"/v1/tiny/v1/piece/{len(table)}")[0] == 404
    for path in ("/v1/tiny/v1/../../etc/passwd", "/v1/tiny/current/state",
                 "/v1/tiny/v1/piece/-1", "/v1/tiny/.lock/state"):
        assert _get(node, path)[0] == 404, path
    # An incomplete version offers only the pieces its state marks as verified.
    state = node.state()
    state["have"] = mf.pieces_hex({2}, len(table))
    (node.cache / "tiny" / ".peer-v1.json").write_text(json.dumps(state))
    assert _get(node, "/v1/tiny/v1/piece/2")[0] == 200
    assert _get(node, "/v1/tiny/v1/piece/3")[0] == 404
    # Evicted: no state, nothing served.
    (node.cache / "tiny" / ".peer-v1.json").unlink()
    assert _get(node, "/v1/tiny/v1/piece/2")[0] == 404


def test_the_peer_server_keeps_to_its_bandwidth_cap(model, nodes):
    store_root, _ = model
    node, = nodes(1, max_mbit=16)  # 2 MB/s for everything it sends
    node.sync(Store(store_root, "tiny", "v1"), [node])
    started = time.monotonic()
    threads = [threading.Thread(target=_get, args=(node, f"/v1/tiny/v1/piece/{i}"))
               for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # 4 MiB at 2 MB/s: at least 2 s whatever the number of connections (the first chunk
    # goes at once).
    assert time.monotonic() - started >= (4 * MiB - MiB) / 2e6


def test_a_format_1_manifest_is_fetched_from_the_store_with_a_warning(model, nodes, tmp_path):
    store_root, _ = model
    v1 = store_root / "tiny" / "v1"
    (v1 / "manifest.json").write_text(mf.dumps(mf.scan(str(v1), "tiny", "v1")))
    node, = nodes(1)
    store = Store(store_root, "tiny", "v1")
    node.sync(store, [node])
    assert node.error is None
    assert store.served == mf.total_size(mf.loads((v1 / "manifest.json").read_text()))
    assert not (node.cache / "tiny" / ".peer-v1.json").exists()
    assert any("format 1 manifest (no piece hashes)" in w for w in node.warnings)


def test_the_roles_list_of_peers_names_the_engine_nodes_that_take_part():
    from ansible.errors import AnsibleFilterError
    from ansible_collections.inferfleet.fleet.plugins.filter.model_sync import (
        model_sync_peer_list,
    )

    groups = {"inference": ["n2", "n1", "n3", "v6"], "loadbalancers": ["lb"]}
    hostvars = {"n1": {"inferfleet_address": "10.0.0.1"},
                "n2": {"ansible_host": "10.0.0.2", "model_sync_peer_port": 9000},
                "n3": {"ansible_host": "10.0.0.3", "model_sync_peers": False},
                "v6": {"inferfleet_address": "2001:db8::6"},
                "lb": {"ansible_host": "10.0.0.9"}}
    assert model_sync_peer_list(groups, hostvars, {"peers": True, "port": 8950}) == [
        {"name": "n1", "address": "10.0.0.1", "url": "http://10.0.0.1:8950"},
        {"name": "n2", "address": "10.0.0.2", "url": "http://10.0.0.2:9000"},
        {"name": "v6", "address": "2001:db8::6", "url": "http://[2001:db8::6]:8950"}]
    assert model_sync_peer_list(groups, hostvars, {"peers": False, "port": 8950}) == []
    hostvars["n1"] = {"ansible_host": "n1.example.com"}
    with pytest.raises(AnsibleFilterError, match="Set inferfleet_address for n1"):
        model_sync_peer_list(groups, hostvars, {"peers": True, "port": 8950})


# -- what only the nodes hold: a folder one node made (vLLM's compile cache) ---------------
@pytest.fixture
def made(tmp_path):
    """A compile cache as vLLM leaves it: a hash folder, a rank folder, a lock file."""
    root = tmp_path / "made" / "3f2a9c" / "rank_0_0"
    (root / "backbone").mkdir(parents=True)
    (root / "backbone" / "artifact_0").write_bytes(os.urandom(3 * MiB + 17))
    (root / "computation_graph.py").write_text("def forward(x):\n    return x\n")
    (root / ".lock").write_text("")  # hidden: not published
    files = {"3f2a9c/rank_0_0/backbone/artifact_0", "3f2a9c/rank_0_0/computation_graph.py"}
    return tmp_path / "made", files


def sync_params(node, source, peers, **extra):
    params = {"name": "vllm-compile", "version": "k1", "cache_root": str(node.cache),
              "source": source, "peers": [{"name": p.name, "url": p.url} for p in peers],
              "peer_name": node.name, "peer_token": TOKEN, "timeout": 5,
              "peer_stall_timeout": 2, "concurrency": 2}
    params.update(extra)
    return Syncer(params)


def held(node, version="k1"):
    folder = node.cache / "vllm-compile" / version
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*")
            if p.is_file() and not p.name.startswith(".") and p.name != "manifest.json"}


def test_a_folder_one_node_made_is_published_and_fetched_from_it_alone(made, nodes):
    folder, files = made
    maker, other = nodes(2)
    size = sum((folder / f).stat().st_size for f in files)
    first = sync_params(maker, "folder", [maker], path_source=str(folder)).run()
    assert first["changed"] and first["bytes_from_store"] == size
    assert set(held(maker)) == files  # the hidden lock file stays behind
    assert {k: v == (folder / k).read_bytes() for k, v in held(maker).items()} == \
        dict.fromkeys(files, True)
    state = json.loads((maker.cache / "vllm-compile" / ".peer-k1.json").read_text())
    assert (state["digest"], state["have"]) == (first["manifest_digest"], "all")
    assert sync_params(maker, "folder", [maker], path_source=str(folder)).run()["changed"] is False
    got = sync_params(other, "peers", [maker, other]).run()
    assert got["manifest_digest"] == first["manifest_digest"]
    assert got["bytes_from_store"] == 0
    assert got["bytes_from_peers"] == {"node1": size}
    assert held(other) == held(maker)
    # pinned to another digest: refused, nothing left behind
    third = nodes(1)[0]
    with pytest.raises(SyncError, match="no peer holds vllm-compile/k1 with digest sha256:0+"):
        sync_params(third, "peers", [maker, third], manifest_digest="sha256:" + "0" * 64).run()
    assert not (third.cache / "vllm-compile" / "k1").exists()


def test_source_peers_fails_clearly_when_no_peer_holds_it_whole(made, nodes, tmp_path):
    folder, _ = made
    maker, other = nodes(2)
    gone = Node(tmp_path, "gone")
    gone.stop()
    with pytest.raises(SyncError, match="no peer holds vllm-compile/k1"):
        sync_params(other, "peers", [maker, gone, other]).run()
    left = other.cache / "vllm-compile"
    assert not left.exists() or [p.name for p in left.iterdir() if p.name != ".lock"] == []
    with pytest.raises(SyncError, match="source=peers needs peers"):
        Syncer({"name": "vllm-compile", "version": "k1", "cache_root": str(other.cache),
                "source": "peers"})
    with pytest.raises(SyncError, match="source=folder needs path_source"):
        Syncer({"name": "vllm-compile", "version": "k1", "cache_root": str(other.cache),
                "source": "folder"})


def test_a_holder_serving_a_corrupted_piece_fails_the_fetch_or_is_replaced(made, nodes):
    folder, files = made
    bad, good, late = nodes(3)
    published = sync_params(bad, "folder", [bad], path_source=str(folder)).run()
    sync_params(good, "peers", [bad, good]).run()
    path = bad.cache / "vllm-compile" / "k1" / "3f2a9c" / "rank_0_0" / "backbone" / "artifact_0"
    data = bytearray(path.read_bytes())
    data[MiB] ^= 0xFF
    path.write_bytes(bytes(data))
    # The bad holder alone: dropped, and no store to fall back on: a clear failure.
    with pytest.raises(SyncError, match="no object store to fall back on"):
        sync_params(late, "peers", [bad, late]).run()
    assert not (late.cache / "vllm-compile" / "k1").exists()
    # A good holder beside it: the piece comes from the good one.
    got = sync_params(late, "peers", [bad, good, late]).run()
    assert got["manifest_digest"] == published["manifest_digest"]
    assert set(held(late)) == files and held(late) == held(good)
    assert set(got["peers_dropped"]) <= {"node1"}
