"""model_sync's pure helpers, its S3 client, and its cache logic with an in-memory source.

The module and its module_utils are imported from the collection
(``ansible_collections.inferfleet.fleet.plugins``).
"""

from __future__ import annotations

import errno
import hashlib
import http.server
import os
import threading
from pathlib import Path

import pytest
from ansible_collections.inferfleet.fleet.plugins.module_utils import manifest as mf
from ansible_collections.inferfleet.fleet.plugins.module_utils import model_sync_cache as mc
from ansible_collections.inferfleet.fleet.plugins.module_utils import model_sync_transfer as mt
from ansible_collections.inferfleet.fleet.plugins.module_utils import s3 as s3
from ansible_collections.inferfleet.fleet.plugins.modules import model_sync as ms

REPO = Path(__file__).resolve().parents[2]
MiB = 1024 * 1024


# -- pure helpers ---------------------------------------------------------------------
def test_plan_parts_cover_the_file_exactly():
    assert mt.plan_parts(0, 10) == [(0, 0)]
    assert mt.plan_parts(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert mt.plan_parts(8, 4) == [(0, 4), (4, 8)]
    with pytest.raises(ValueError):
        mt.plan_parts(8, 0)


def test_object_key():
    assert mt.object_key("", "m", "v1") == "m/v1/"
    assert mt.object_key("/models/llm/", "m", "v1", "a/b.bin") == "models/llm/m/v1/a/b.bin"


def test_parse_mode():
    assert mt.parse_mode("0640", "file_mode") == 0o640
    for bad in ("rw-r--r--", "99999"):
        with pytest.raises(mt.SyncError, match="file_mode"):
            mt.parse_mode(bad, "file_mode")


MOUNTINFO = """\
22 1 252:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
30 22 0:40 / /mnt/lustre rw - lustre 10.0.0.1@tcp:/fs rw,flock
31 22 0:41 / /mnt/nfs rw - nfs4 filer:/export rw
32 31 0:42 / /mnt/nfs/local\\040disk rw - xfs /dev/sdb rw
"""


@pytest.mark.parametrize(
    ("path", "expected", "remote"),
    [
        ("/var/lib/inferfleet/models", ("/", "ext4"), False),
        ("/mnt/lustre/cache", ("/mnt/lustre", "lustre"), True),
        ("/mnt/nfs", ("/mnt/nfs", "nfs4"), True),
        ("/mnt/nfsx", ("/", "ext4"), False),
        ("/mnt/nfs/local disk/c", ("/mnt/nfs/local disk", "xfs"), False),
    ],
)
def test_filesystem_type_and_remote_detection(path, expected, remote):
    assert mt.filesystem_type(path, MOUNTINFO) == expected
    assert mt.is_remote_fs(expected[1]) is remote


def test_fuse_network_filesystems_are_remote():
    assert mt.is_remote_fs("fuse.sshfs")
    assert not mt.is_remote_fs("tmpfs")


def test_disk_shortfall():
    assert mt.disk_shortfall(100, 150, 0) == 0
    assert mt.disk_shortfall(100, 150, 60) == 10
    assert mt.disk_shortfall(100, 40, 0) == 60


def test_choose_prune_keeps_current_and_the_most_recent_previous():
    versions = [("v1", 10), ("v2", 20), ("v3", 30), ("v4", 40)]
    assert mt.choose_prune(versions, "v4", 2) == ["v1"]
    assert mt.choose_prune(versions, "v4", 0) == ["v1", "v2", "v3"]
    # A rollback to v1 makes v1 current; the oldest activated others go first.
    assert mt.choose_prune(versions, "v1", 1) == ["v2", "v3"]
    assert mt.choose_prune(versions, "v9", 5) == []


def test_plan_fetch_reuses_by_content():
    sha = hashlib.sha256(b"x").hexdigest()
    m = mf.build("m", "v2", [{"path": "a", "size": 1, "sha256": sha},
                             {"path": "b", "size": 2, "sha256": "0" * 64}])
    fetch, reuse = mt.plan_fetch(m, {(sha, 1): "/cache/m/v1/other-name"})
    assert [f["path"] for f in fetch] == ["b"]
    assert [(e["path"], src) for e, src in reuse] == [("a", "/cache/m/v1/other-name")]
    # same hash but another size is not the same file
    fetch, reuse = mt.plan_fetch(m, {(sha, 5): "/x"})
    assert len(fetch) == 2 and not reuse


def test_diff_text_lists_version_digest_and_files():
    m = mf.build("m", "v1", [{"path": "a", "size": 1, "sha256": "1" * 64}])
    text = mt.diff_text("v1", m)
    assert text.splitlines() == ["version: v1", f"manifest_digest: {m['digest']}", "files:",
                                 f"  a  1  sha256:{'1' * 64}"]
    assert mt.diff_text("", None) == "version: (none)\n"


def test_human_bytes():
    assert mt.human_bytes(5) == "5 B"
    assert mt.human_bytes(5 * MiB) == "5.0 MiB"
    assert mt.human_bytes(3 * 1024 * MiB) == "3.0 GiB"


# -- the S3 client ------------------------------------------------------------------
SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


@pytest.mark.parametrize(
    ("path", "query", "headers", "signature"),
    [  # the examples of AWS's "Signature Version 4 for Amazon S3" documentation
        ("/test.txt", {}, {"Range": "bytes=0-9"},
         "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"),
        ("/", {"lifecycle": ""}, {},
         "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543"),
        ("/", {"max-keys": "2", "prefix": "J"}, {},
         "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7"),
    ],
)
def test_sigv4_matches_aws_examples(path, query, headers, signature):
    out = s3.sign_v4("GET", "examplebucket.s3.amazonaws.com", path, query, headers,
                     "AKIAIOSFODNN7EXAMPLE", SECRET, "us-east-1", "20130524T000000Z")
    assert out["Authorization"].endswith("Signature=" + signature)
    assert SECRET not in str(out)


def test_encode_path_and_content_range():
    assert s3.encode_path("/b/a b/ü+x~y") == "/b/a%20b/%C3%BC%2Bx~y"
    assert s3.parse_content_range("bytes 0-9/100") == (0, 9, 100)
    assert s3.parse_content_range("bytes 5-5/*") == (5, 5, None)
    with pytest.raises(ValueError):
        s3.parse_content_range("bytes */100")


class _FlakyHandler(http.server.BaseHTTPRequestHandler):
    """Serves one object; ``truncate`` lists how many bytes each response really sends."""

    data = b""
    truncate: list = []
    requests: list = []

    def log_message(self, *args):
        pass

    def do_GET(self):  # noqa: N802 (http.server's naming)
        first, last = self.headers["Range"].split("=")[1].split("-")
        first, last = int(first), int(last)
        type(self).requests.append((first, last))
        body = self.data[first:last + 1]
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {first}-{last}/{len(self.data)}")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        cut = self.truncate.pop(0) if self.truncate else len(body)
        self.wfile.write(body[:cut])
        if cut < len(body):
            self.close_connection = True


@pytest.fixture
def flaky_server():
    _FlakyHandler.data = os.urandom(300_000)
    _FlakyHandler.truncate = []
    _FlakyHandler.requests = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FlakyHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _collect(client, start, end, size):
    got = bytearray(end - start)
    seen = []

    def on_data(offset, view):
        seen.append((offset, len(view)))
        assert bytes(view) == bytes(got[offset - start:offset - start + len(view)])

    client.get_range("bkt", "obj", start, end, got, on_data, object_size=size,
                     chunk=64 * 1024)
    return bytes(got), seen


def test_get_range_resumes_after_a_truncated_body(flaky_server):
    _FlakyHandler.truncate = [100_000]
    client = s3.S3Client(f"http://127.0.0.1:{flaky_server.server_port}", retries=2)
    client.retries = 2
    data, chunks = _collect(client, 0, 300_000, 300_000)
    assert data == _FlakyHandler.data
    # every offset delivered once, in order, without gaps
    assert [off for off, _ in chunks] == list(
        __import__("itertools").accumulate([0] + [n for _, n in chunks[:-1]]))
    assert sum(n for _, n in chunks) == 300_000
    # the retry asked only for what was missing
    assert _FlakyHandler.requests[1][0] == 100_000


def test_get_range_gives_up_on_a_body_that_keeps_being_truncated(flaky_server):
    _FlakyHandler.truncate = [10, 10, 10, 10]
    client = s3.S3Client(f"http://127.0.0.1:{flaky_server.server_port}", retries=2)
    with pytest.raises(s3.S3Truncated, match="truncated body for s3://bkt/obj"):
        _collect(client, 0, 300_000, 300_000)


def test_get_range_refuses_an_object_of_another_size(flaky_server):
    client = s3.S3Client(f"http://127.0.0.1:{flaky_server.server_port}")
    with pytest.raises(s3.S3Error, match="300000 bytes in the store but the manifest says 7"):
        _collect(client, 0, 7, 7)


def test_unreachable_store_is_named():
    client = s3.S3Client("http://127.0.0.1:9", retries=0)
    with pytest.raises(s3.S3Unreachable, match="unreachable at http://127.0.0.1:9"):
        client.get_bytes("bkt", "m/v1/manifest.json")


# -- the cache, with an in-memory source --------------------------------------------
class MemorySource:
    kind = "memory"

    def __init__(self, name: str, version: str, files: dict, serve: dict | None = None):
        self.files = files
        self.serve = serve or files  # what the "store" really returns
        self.manifest = mf.build(name, version, [
            {"path": p, "size": len(b), "sha256": hashlib.sha256(b).hexdigest()}
            for p, b in files.items()])
        self.fetched = 0

    def where(self, rel=""):
        return f"mem://{self.manifest['name']}/{self.manifest['version']}/{rel}"

    def read_manifest(self):
        return mf.dumps(self.manifest).encode()

    def fetch(self, entry, start, end, into, on_data):
        data = self.serve[entry["path"]]
        pos = start
        while pos < end:
            chunk = memoryview(data)[pos:min(end, pos + 256 * 1024)]
            if not len(chunk):
                raise mt.SyncError(f"{self.where(entry['path'])} ended early")
            into[pos - start:pos - start + len(chunk)] = chunk
            on_data(pos, into[pos - start:pos - start + len(chunk)])
            self.fetched += len(chunk)
            pos += len(chunk)

    def close(self):
        pass


def _params(cache, version, **extra):
    params = {"name": "m", "version": version, "cache_root": str(cache), "source": "s3",
              "keep_versions": 2, "concurrency": 4, "part_size_mb": 1}
    params.update(extra)
    return params


def _sync(cache, version, files, check_mode=False, serve=None, **extra):
    source = MemorySource("m", version, files, serve)
    result = mc.Syncer(_params(cache, version, **extra), check_mode, source=source).run()
    return result, source


def _leftovers(cache):
    return [p for p in os.listdir(cache / "m") if p.startswith((".tmp-", ".trash-"))]


FILES_V1 = {"config.json": b"{}", "model.safetensors": os.urandom(3 * MiB + 5),
            "tok/vocab.txt": b"a\nb\n", "empty": b""}


def test_fresh_sync_rerun_and_new_version_reusing_files(tmp_path):
    r, src = _sync(tmp_path, "v1", FILES_V1)
    assert r["changed"] and r["bytes_downloaded"] == src.fetched == sum(map(len, FILES_V1.values()))
    assert os.readlink(tmp_path / "m" / "current") == "v1"
    for rel, data in FILES_V1.items():
        assert (tmp_path / "m" / "current" / rel).read_bytes() == data
    marker = (tmp_path / "m" / "v1" / ".inferfleet-complete").read_text().strip()
    assert marker == r["manifest_digest"]

    r, src = _sync(tmp_path, "v1", FILES_V1)
    assert not r["changed"] and r["bytes_downloaded"] == r["bytes_hashed"] == src.fetched == 0

    v2 = dict(FILES_V1, **{"config.json": b'{"x": 1}', "new.bin": b"new"})
    r, src = _sync(tmp_path, "v2", v2)
    assert r["changed"] and r["previous_version"] == "v1"
    assert sorted(r["files_fetched"]) == ["config.json", "new.bin"]
    assert r["files_added"] == ["new.bin"] and r["files_changed"] == ["config.json"]
    assert r["bytes_downloaded"] == src.fetched == len(b'{"x": 1}') + 3
    assert r["bytes_reused"] == len(FILES_V1["model.safetensors"]) + 4  # + vocab, empty
    same = [os.stat(tmp_path / "m" / v / "model.safetensors").st_ino for v in ("v1", "v2")]
    assert same[0] == same[1]  # hard link, not a copy
    assert os.readlink(tmp_path / "m" / "current") == "v2"
    assert (tmp_path / "m" / "v1").is_dir() and not _leftovers(tmp_path)


def test_prune_keeps_current_plus_previous_n(tmp_path):
    for i in range(1, 5):
        r, _ = _sync(tmp_path, f"v{i}", {"f": f"{i}".encode()}, keep_versions=2)
    assert r["pruned"] == ["v1"]
    assert sorted(p for p in os.listdir(tmp_path / "m") if not p.startswith(".")) == [
        "current", "v2", "v3", "v4"]
    # rollback to v2: current flips, nothing fetched, v3 and v4 stay (2 previous)
    r, src = _sync(tmp_path, "v2", {"f": b"2"}, keep_versions=2)
    assert r["changed"] and src.fetched == 0 and r["pruned"] == []
    assert os.readlink(tmp_path / "m" / "current") == "v2"
    r, _ = _sync(tmp_path, "v2", {"f": b"2"}, keep_versions=0)
    assert sorted(r["pruned"]) == ["v3", "v4"]


def test_check_mode_changes_nothing_and_reports_the_plan(tmp_path):
    r, src = _sync(tmp_path, "v1", FILES_V1, check_mode=True)
    assert r["changed"] and sorted(r["files_fetched"]) == sorted(FILES_V1)
    assert src.fetched == 0 and os.listdir(tmp_path) == []
    _sync(tmp_path, "v1", FILES_V1)
    before = sorted(os.listdir(tmp_path / "m"))
    r, src = _sync(tmp_path, "v2", dict(FILES_V1, extra=b"1"), check_mode=True)
    assert r["files_fetched"] == ["extra"] and src.fetched == 0
    assert sorted(os.listdir(tmp_path / "m")) == before
    assert os.readlink(tmp_path / "m" / "current") == "v1"


def test_corrupt_bytes_fail_and_leave_current(tmp_path):
    _sync(tmp_path, "v1", FILES_V1)
    v2 = {"a.bin": os.urandom(2 * MiB)}
    bad = {"a.bin": bytearray(v2["a.bin"])}
    bad["a.bin"][MiB + 3] ^= 1
    with pytest.raises(mt.SyncError, match="checksum mismatch for mem://m/v2/a.bin"):
        _sync(tmp_path, "v2", v2, serve={"a.bin": bytes(bad["a.bin"])})
    assert os.readlink(tmp_path / "m" / "current") == "v1"
    assert not (tmp_path / "m" / "v2").exists() and not _leftovers(tmp_path)


def test_disk_full_mid_way_fails_cleanly(tmp_path, monkeypatch):
    _sync(tmp_path, "v1", FILES_V1)
    real_pwrite = os.pwrite
    calls = {"n": 0}

    def pwrite(fd, data, offset):
        calls["n"] += 1
        if calls["n"] > 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", pwrite)
    with pytest.raises(mt.SyncError, match=r"disk full: cannot write .*/m/\.tmp-v2-"):
        _sync(tmp_path, "v2", {"big.bin": os.urandom(4 * MiB)})
    monkeypatch.setattr(os, "pwrite", real_pwrite)
    assert os.readlink(tmp_path / "m" / "current") == "v1"
    assert not (tmp_path / "m" / "v2").exists() and not _leftovers(tmp_path)


def test_leftovers_of_a_killed_run_are_removed(tmp_path):
    _sync(tmp_path, "v1", FILES_V1)
    (tmp_path / "m" / ".tmp-v2-dead").mkdir()
    (tmp_path / "m" / ".tmp-v2-dead" / "half.bin").write_bytes(b"x")
    _sync(tmp_path, "v2", {"f": b"2"})
    assert not _leftovers(tmp_path)


def test_a_version_without_a_valid_marker_is_fetched_again(tmp_path):
    _sync(tmp_path, "v1", FILES_V1)
    (tmp_path / "m" / "v1" / ".inferfleet-complete").write_text("sha256:" + "0" * 64)
    r, src = _sync(tmp_path, "v1", FILES_V1)
    assert r["changed"] and src.fetched == sum(map(len, FILES_V1.values()))
    assert (tmp_path / "m" / "v1" / ".inferfleet-complete").read_text().strip() == \
        r["manifest_digest"]


def test_expected_digest_skips_the_source_when_the_copy_is_complete(tmp_path):
    r, _ = _sync(tmp_path, "v1", FILES_V1)

    class Unreachable(MemorySource):
        def read_manifest(self):
            raise AssertionError("the source must not be asked")

    source = Unreachable("m", "v1", FILES_V1)
    again = mc.Syncer(_params(tmp_path, "v1", manifest_digest=r["manifest_digest"]),
                      source=source).run()
    assert not again["changed"]
    with pytest.raises(mt.SyncError, match="expected sha256:0000"):
        _sync(tmp_path, "v2", FILES_V1, manifest_digest="sha256:" + "0" * 64)


def test_owner_and_modes_apply(tmp_path):
    _sync(tmp_path, "v1", {"f": b"1"}, file_mode="0640", dir_mode="0750", owner="root",
          group="root")
    assert (tmp_path / "m" / "v1" / "f").stat().st_mode & 0o777 == 0o640
    assert (tmp_path / "m" / "v1").stat().st_mode & 0o777 == 0o750
    with pytest.raises(mt.SyncError, match="owner 'no-such-user' does not exist"):
        _sync(tmp_path, "v2", {"f": b"1"}, owner="no-such-user")


def _publish_tree(root: Path, name: str, version: str, files: dict) -> dict:
    folder = root / name / version
    for rel, data in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    manifest = mf.scan(str(folder), name, version)
    (folder / "manifest.json").write_text(mf.dumps(manifest))
    return manifest


def test_path_source_copy_and_in_place(tmp_path):
    shared = tmp_path / "shared"
    cache = tmp_path / "cache"
    cache.mkdir()
    _publish_tree(shared, "m", "v1", FILES_V1)
    params = _params(cache, "v1", source="path", path_source=str(shared))
    r = mc.Syncer(params).run()
    assert r["changed"] and not r["in_place"]
    assert (cache / "m" / "v1").is_dir() and not (cache / "m" / "v1").is_symlink()
    assert (cache / "m" / "current" / "model.safetensors").read_bytes() == \
        FILES_V1["model.safetensors"]

    _publish_tree(shared, "m", "v2", dict(FILES_V1, extra=b"e"))
    in_place = _params(cache, "v2", source="path", path_source=str(shared), use_in_place=True)
    r = mc.Syncer(in_place).run()
    assert r["changed"] and r["in_place"] and r["bytes_downloaded"] == 0
    assert r["bytes_hashed"] == sum(map(len, FILES_V1.values())) + 1
    assert os.readlink(cache / "m" / "v2") == str((shared / "m" / "v2").resolve())
    r = mc.Syncer(in_place).run()
    assert not r["changed"] and r["bytes_hashed"] == 0  # verified once, remembered

    # the shared copy changes under us: verified again, and refused
    target = shared / "m" / "v2" / "extra"
    target.write_bytes(b"E")
    with pytest.raises(mt.SyncError, match="checksum mismatch for .*/shared/m/v2/extra"):
        mc.Syncer(in_place).run()
    assert os.readlink(cache / "m" / "current") == "v2"  # was current already; not removed

    # pruning an in-place version removes the link, never the shared files
    _publish_tree(shared, "m", "v3", {"f": b"3"})
    mc.Syncer(_params(cache, "v3", source="path", path_source=str(shared), keep_versions=0)).run()
    assert not os.path.lexists(cache / "m" / "v2") and target.exists()


def test_use_in_place_needs_a_path_source(tmp_path):
    with pytest.raises(mt.SyncError, match="use_in_place needs source=path"):
        mc.Syncer(_params(tmp_path, "v1", use_in_place=True, s3_endpoint="http://x",
                          s3_bucket="bkt"))


def test_cache_root_must_exist(tmp_path):
    with pytest.raises(mt.SyncError, match="does not exist"):
        _sync(tmp_path / "nope", "v1", {"f": b"1"})


@pytest.mark.parametrize("direct_io", [True, False], ids=["o_direct", "buffered"])
def test_transfer_stress_many_files_few_buffers(tmp_path, direct_io):
    """Parts finish out of order; a pool smaller than the fetchers must not deadlock."""
    import random

    rnd = random.Random(7)
    files = {f"f{i:02d}.bin": rnd.randbytes(rnd.choice([0, 1, 1000, MiB, 2 * MiB + 1,
                                                         5 * MiB - 3]))
             for i in range(24)}

    class Jittery(MemorySource):
        def fetch(self, entry, start, end, into, on_data):
            data = self.serve[entry["path"]]
            pos = start
            while pos < end:
                n = min(end - pos, rnd.randint(1, 300_000))
                into[pos - start:pos - start + n] = data[pos:pos + n]
                if rnd.random() < 0.05:
                    __import__("time").sleep(0.001)
                on_data(pos, into[pos - start:pos - start + n])
                pos += n

    for round_ in range(5):
        source = Jittery("m", "v1", files)
        dest = tmp_path / f"round{round_}"
        dest.mkdir()
        transfer = mt.Transfer(source, concurrency=6, part_size=MiB, buffers=2,
                               direct_io=direct_io)
        transfer.run([(e, str(dest / e["path"])) for e in source.manifest["files"]])
        assert transfer.bytes_hashed == sum(map(len, files.values()))
        for rel, data in files.items():
            assert (dest / rel).read_bytes() == data


def test_documentation_matches_the_argument_spec():
    import yaml

    options = yaml.safe_load(ms.DOCUMENTATION)["options"]
    assert set(options) == set(ms.ARGUMENT_SPEC)
    for name, spec in ms.ARGUMENT_SPEC.items():
        doc = options[name]
        assert doc["type"] == spec["type"], name
        assert doc.get("default") == spec.get("default"), name
        assert doc.get("choices") == spec.get("choices"), name
        assert bool(doc.get("required")) == bool(spec.get("required")), name
    assert {n for n, s in ms.ARGUMENT_SPEC.items() if s.get("no_log")} == {
        "access_key", "secret_key", "session_token", "peer_token"}
    yaml.safe_load(ms.EXAMPLES)
    assert "manifest_digest" in yaml.safe_load(ms.RETURN)


def test_filesystems_without_o_direct_fall_back_to_buffered_writes(tmp_path, monkeypatch):
    real_open = os.open
    direct_tries = []

    def no_direct(path, flags, *args):
        if flags & getattr(os, "O_DIRECT", 0):
            direct_tries.append(path)
            real_open(path, flags & ~os.O_DIRECT, *args)  # the file is created, then refused
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", no_direct)
    files = {"a.bin": os.urandom(3 * MiB + 11), "b.txt": b"tail"}
    r, _ = _sync(tmp_path, "v1", files)
    assert direct_tries and r["bytes_hashed"] == sum(map(len, files.values()))
    for rel, data in files.items():
        assert (tmp_path / "m" / "v1" / rel).read_bytes() == data


def test_o_direct_writes_are_truncated_to_the_real_size(tmp_path):
    files = {"odd.bin": os.urandom(MiB + 1), "tiny": b"x", "exact": os.urandom(8192)}
    _sync(tmp_path, "v1", files, direct_io=True)
    for rel, data in files.items():
        assert (tmp_path / "m" / "v1" / rel).stat().st_size == len(data)
        assert (tmp_path / "m" / "v1" / rel).read_bytes() == data
