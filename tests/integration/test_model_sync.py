"""model_sync end to end: the real module, run by ansible-playbook against localhost,
fetching from a real S3 server (SeaweedFS) what `inferfleet model publish` uploaded.

The module runs under the system's /usr/bin/python3 when there is one (standard library
only, as on a node), not under the virtualenv.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from inferfleet.lab.s3 import free_port
from inferfleet.publish import publish

REPO = Path(__file__).resolve().parents[2]
NODE_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
BUCKET = "models-it"
MiB = 1024 * 1024


# -- helpers ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def s3(seaweed_s3):
    client = seaweed_s3.client()
    existing = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
    if BUCKET not in existing:
        client.create_bucket(Bucket=BUCKET)
    return seaweed_s3


@pytest.fixture
def model_name() -> str:
    return "m-" + uuid.uuid4().hex[:10]


def make_model(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def publish_version(s3, tmp_path: Path, name: str, version: str, files: dict) -> dict:
    folder = make_model(tmp_path / f"src-{name}-{version}", files)
    result = publish(folder, f"s3://{BUCKET}/models/{name}/{version}", client=s3.client(),
                     part_size_mb=5)
    return result.manifest


def model_files(seed: int = 0) -> dict[str, bytes]:
    rnd = __import__("random").Random(seed)
    return {
        "config.json": b'{"model_type": "llama"}\n',
        "tokenizer.json": rnd.randbytes(300_000),
        "model-00001-of-00002.safetensors": rnd.randbytes(3 * MiB + 17),
        "model-00002-of-00002.safetensors": rnd.randbytes(2 * MiB),
    }


def sync_args(s3, name: str, version: str, cache: Path, **extra) -> dict:
    args = {
        "name": name, "version": version, "cache_root": str(cache),
        "s3_endpoint": s3.endpoint, "s3_bucket": BUCKET, "s3_prefix": "models",
        "access_key": s3.access_key, "secret_key": s3.secret_key,
        "concurrency": 4, "part_size_mb": 1,
    }
    args.update(extra)
    return args


def run_play(tmp_path: Path, tasks: list, *flags: str, callback: str = "ansible.posix.json",
             play_vars: dict | None = None) -> subprocess.CompletedProcess:
    play = [{
        "name": "model_sync integration", "hosts": "localhost", "connection": "local",
        "gather_facts": False,
        "vars": {"ansible_python_interpreter": NODE_PYTHON, **(play_vars or {})},
        "tasks": tasks,
    }]
    path = tmp_path / f"play-{uuid.uuid4().hex[:8]}.yml"
    path.write_text(yaml.safe_dump(play, sort_keys=False))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
               ANSIBLE_STDOUT_CALLBACK=callback, ANSIBLE_LOCALHOST_WARNING="false",
               ANSIBLE_INVENTORY_UNPARSED_WARNING="false", ANSIBLE_NOCOLOR="1")
    playbook = Path(sys.executable).parent / "ansible-playbook"
    return subprocess.run([str(playbook), "-i", "localhost,", str(path), *flags], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)


def task_results(proc: subprocess.CompletedProcess) -> dict:
    """Task name -> localhost's result, from the JSON callback."""
    data = json.loads(proc.stdout)
    out = {}
    for play in data["plays"]:
        for task in play["tasks"]:
            out[task["task"]["name"]] = task["hosts"]["localhost"]
    return out


def model_sync(tmp_path: Path, args: dict, *flags: str) -> dict:
    proc = run_play(tmp_path, [{"name": "sync", "inferfleet.fleet.model_sync": args}], *flags)
    result = task_results(proc)["sync"]
    assert (proc.returncode != 0) == bool(result.get("failed")), proc.stderr
    return result


def current(cache: Path, name: str) -> str:
    return os.readlink(cache / name / "current")


def leftovers(cache: Path, name: str) -> list[str]:
    folder = cache / name
    if not folder.exists():
        return []
    return sorted(p for p in os.listdir(folder) if p.startswith((".tmp-", ".trash-")))


def assert_same_files(folder: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        assert (folder / rel).read_bytes() == data, rel


# -- the life cycle -----------------------------------------------------------------------
def test_check_mode_then_fresh_sync_then_idempotent_rerun(s3, tmp_path, model_name):
    files = model_files(1)
    manifest = publish_version(s3, tmp_path, model_name, "v1", files)
    total = sum(map(len, files.values()))
    cache = tmp_path / "cache"
    cache.mkdir()
    args = sync_args(s3, model_name, "v1", cache)

    r = model_sync(tmp_path, args, "--check")
    assert r["changed"] is True
    assert sorted(r["files_fetched"]) == sorted(files)
    assert r["bytes_downloaded"] == 0
    assert os.listdir(cache) == []  # check mode touched nothing

    r = model_sync(tmp_path, args)
    assert r["changed"] is True
    assert r["bytes_downloaded"] == total and r["bytes_hashed"] == total
    assert r["manifest_digest"] == manifest["digest"]
    assert r["path"] == str(cache / model_name / "v1")
    assert r["current_path"] == str(cache / model_name / "current")
    assert current(cache, model_name) == "v1"
    assert_same_files(cache / model_name / "current", files)
    marker = cache / model_name / "v1" / ".inferfleet-complete"
    assert marker.read_text().strip() == manifest["digest"]
    assert json.loads((cache / model_name / "v1" / "manifest.json").read_text()) == manifest
    assert leftovers(cache, model_name) == []

    r = model_sync(tmp_path, args)
    assert r["changed"] is False
    assert r["bytes_downloaded"] == 0 and r["bytes_hashed"] == 0 and r["files_fetched"] == []
    assert r["seconds"] < 0.5


def test_new_version_keeps_the_old_one_and_flips_current(s3, tmp_path, model_name):
    v1 = model_files(2)
    publish_version(s3, tmp_path, model_name, "v1", v1)
    v2 = dict(v1)
    v2["model-00002-of-00002.safetensors"] = os.urandom(2 * MiB)
    v2["generation_config.json"] = b'{"temperature": 0.7}\n'
    publish_version(s3, tmp_path, model_name, "v2", v2)
    cache = tmp_path / "cache"
    cache.mkdir()
    assert model_sync(tmp_path, sync_args(s3, model_name, "v1", cache))["changed"]

    r = model_sync(tmp_path, sync_args(s3, model_name, "v2", cache), "--diff")
    assert r["changed"] and r["previous_version"] == "v1"
    assert r["files_added"] == ["generation_config.json"]
    assert r["files_changed"] == ["model-00002-of-00002.safetensors"]
    # only what changed came over the network; the rest was linked from v1
    assert sorted(r["files_fetched"]) == ["generation_config.json",
                                          "model-00002-of-00002.safetensors"]
    assert r["bytes_downloaded"] == 2 * MiB + len(v2["generation_config.json"])
    assert current(cache, model_name) == "v2"
    assert_same_files(cache / model_name / "current", v2)
    assert_same_files(cache / model_name / "v1", v1)  # the old version is intact
    diff = r["diff"]
    assert "version: v1" in diff["before"] and "version: v2" in diff["after"]
    assert "generation_config.json" in diff["after"]
    assert "generation_config.json" not in diff["before"]

    # a rollback is a symlink flip: nothing fetched
    r = model_sync(tmp_path, sync_args(s3, model_name, "v1", cache))
    assert r["changed"] and r["bytes_downloaded"] == 0 and current(cache, model_name) == "v1"


def test_old_versions_are_pruned_never_the_current_one(s3, tmp_path, model_name):
    cache = tmp_path / "cache"
    cache.mkdir()
    for i in range(1, 5):
        publish_version(s3, tmp_path, model_name, f"v{i}", {"w.bin": os.urandom(1000 + i)})
        r = model_sync(tmp_path, sync_args(s3, model_name, f"v{i}", cache, keep_versions=1))
    assert r["pruned"] == ["v2"]
    versions = sorted(p for p in os.listdir(cache / model_name) if not p.startswith("."))
    assert versions == ["current", "v3", "v4"]


# -- failures: the task fails, says what and where, and changes nothing --------------------
@pytest.fixture
def synced_v1(s3, tmp_path, model_name):
    """A cache whose current version is v1, and a published v2 to break."""
    publish_version(s3, tmp_path, model_name, "v1", model_files(3))
    cache = tmp_path / "cache"
    cache.mkdir()
    assert model_sync(tmp_path, sync_args(s3, model_name, "v1", cache))["changed"]
    files = model_files(4)
    publish_version(s3, tmp_path, model_name, "v2", files)
    return cache, files


def assert_nothing_changed(cache: Path, name: str) -> None:
    assert current(cache, name) == "v1"
    assert not (cache / name / "v2").exists()
    assert leftovers(cache, name) == []


def test_corrupted_object_fails_and_leaves_current(s3, tmp_path, model_name, synced_v1):
    cache, files = synced_v1
    rel = "model-00001-of-00002.safetensors"
    bad = bytearray(files[rel])
    bad[len(bad) // 2] ^= 0xFF  # same size, one bit pattern off: only the hash can tell
    key = f"models/{model_name}/v2/{rel}"
    s3.client().put_object(Bucket=BUCKET, Key=key, Body=bytes(bad))

    r = model_sync(tmp_path, sync_args(s3, model_name, "v2", cache))
    assert r["failed"]
    assert f"checksum mismatch for s3://{BUCKET}/{key}" in r["msg"]
    assert "still points to v1" in r["msg"]
    assert_nothing_changed(cache, model_name)


def test_missing_object_fails_and_leaves_current(s3, tmp_path, model_name, synced_v1):
    cache, _ = synced_v1
    key = f"models/{model_name}/v2/tokenizer.json"
    s3.client().delete_object(Bucket=BUCKET, Key=key)

    r = model_sync(tmp_path, sync_args(s3, model_name, "v2", cache))
    assert r["failed"]
    assert f"object not found: s3://{BUCKET}/{key}" in r["msg"]
    assert_nothing_changed(cache, model_name)


def test_missing_version_fails_on_its_manifest(s3, tmp_path, model_name, synced_v1):
    cache, _ = synced_v1
    r = model_sync(tmp_path, sync_args(s3, model_name, "v9", cache))
    assert r["failed"]
    assert f"s3://{BUCKET}/models/{model_name}/v9/manifest.json" in r["msg"]
    assert current(cache, model_name) == "v1" and leftovers(cache, model_name) == []


def test_unreachable_store_fails_and_leaves_current(s3, tmp_path, model_name, synced_v1):
    cache, _ = synced_v1
    args = sync_args(s3, model_name, "v2", cache, s3_endpoint="http://127.0.0.1:9",
                     timeout=5)
    r = model_sync(tmp_path, args)
    assert r["failed"] and "unreachable at http://127.0.0.1:9" in r["msg"]
    assert_nothing_changed(cache, model_name)


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 5 MiB tmpfs (this suite runs as root; the mount is undone afterwards)."""
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=5m", "tmpfs", str(mount_point)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.fail(f"cannot mount a tmpfs (needs root): {done.stderr.strip()}")
    yield mount_point
    subprocess.run(["umount", str(mount_point)], check=True)


def test_not_enough_disk_fails_before_downloading(s3, tmp_path, model_name, small_tmpfs):
    files = model_files(5)  # about 5.3 MiB: more than the 5 MiB tmpfs holds
    publish_version(s3, tmp_path, model_name, "v1", files)
    r = model_sync(tmp_path, sync_args(s3, model_name, "v1", small_tmpfs))
    assert r["failed"]
    assert f"not enough free space in {small_tmpfs}" in r["msg"]
    needed = sum(map(len, files.values()))
    assert f"({needed} bytes)" in r["msg"]  # the numbers, exact
    assert os.listdir(small_tmpfs) == []  # nothing downloaded, nothing created

    # the same with room for the files but not for the reserve asked for
    small = {"config.json": b"{}", "w.bin": os.urandom(MiB)}
    publish_version(s3, tmp_path, model_name, "v2", small)
    r = model_sync(tmp_path, sync_args(s3, model_name, "v2", small_tmpfs, min_free_mb=4096))
    assert r["failed"] and "kept free (min_free_mb)" in r["msg"]
    r = model_sync(tmp_path, sync_args(s3, model_name, "v2", small_tmpfs))
    assert r["changed"] and current(small_tmpfs, model_name) == "v2"


# -- concurrency, secrets, shared filesystems, the role ------------------------------------
def _module_processes() -> int:
    count = 0
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"AnsiballZ_model_sync" in f.read():
                    count += 1
        except OSError:
            continue
    return count


def test_concurrent_runs_on_one_node_do_not_corrupt_each_other(s3, tmp_path, model_name):
    files = model_files(6)
    publish_version(s3, tmp_path, model_name, "v1", files)
    cache = tmp_path / "cache"
    (cache / model_name).mkdir(parents=True)
    args = sync_args(s3, model_name, "v1", cache)
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
               ANSIBLE_STDOUT_CALLBACK="ansible.posix.json", ANSIBLE_LOCALHOST_WARNING="false")
    # Hold the model's lock while three runs start, so they really contend for it.
    lock = open(cache / model_name / ".lock", "w")  # noqa: SIM115 (released below)
    fcntl.flock(lock, fcntl.LOCK_EX)
    procs = []
    try:
        for i in range(3):
            workdir = tmp_path / f"run{i}"
            workdir.mkdir()
            path = workdir / "play.yml"
            path.write_text(yaml.safe_dump([{
                "name": "concurrent", "hosts": "localhost", "connection": "local",
                "gather_facts": False, "vars": {"ansible_python_interpreter": NODE_PYTHON},
                "tasks": [{"name": "sync", "inferfleet.fleet.model_sync": args}]}]))
            procs.append(subprocess.Popen(
                [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,",
                 str(path)], env=env, cwd=workdir, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True))
        deadline = time.monotonic() + 60
        while _module_processes() < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.5)  # from module start to waiting on the lock
        assert all(p.poll() is None for p in procs), "a run finished while the lock was held"
        held = sorted(os.listdir(cache / model_name))
        assert held == [".lock"], f"a run wrote into the cache while the lock was held: {held}"
    finally:
        fcntl.flock(lock, fcntl.LOCK_UN)
        lock.close()
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, out[-2000:] + err
        results.append(task_results(subprocess.CompletedProcess([], 0, out, err))["sync"])
    total = sum(map(len, files.values()))
    # exactly one run downloaded; the others waited on the lock and found it done
    assert sorted(r["bytes_downloaded"] for r in results) == [0, 0, total]
    assert sum(r["changed"] for r in results) == 1
    assert_same_files(cache / model_name / "current", files)
    assert leftovers(cache, model_name) == []


def test_credentials_never_appear_in_output_or_files(s3, tmp_path, model_name):
    files = {"config.json": b"{}", "w.bin": os.urandom(MiB)}
    publish_version(s3, tmp_path, model_name, "v1", files)
    cache = tmp_path / "cache"
    cache.mkdir()
    # Distinct values (this SeaweedFS accepts any key), so masking one cannot hide the other.
    key_id = "AKIA" + uuid.uuid4().hex[:16].upper()
    secret = "sk-" + uuid.uuid4().hex
    ok = sync_args(s3, model_name, "v1", cache, access_key=key_id, secret_key=secret)
    failing = sync_args(s3, model_name, "v404", cache, access_key=key_id, secret_key=secret)
    for args, flags in ((ok, ("--diff",)), (failing, ("--diff",)), (ok, ("--check",))):
        proc = run_play(tmp_path, [{"name": "sync", "inferfleet.fleet.model_sync": args}], "-vvv",
                        *flags, callback="default")
        text = proc.stdout + proc.stderr
        assert "model_sync" in text and ("changed" in text or "FAILED" in text)
        assert secret not in text and key_id not in text
    assert "VALUE_SPECIFIED_IN_NO_LOG_PARAMETER" in text  # the arguments were masked
    for path in cache.rglob("*"):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            assert secret.encode() not in data and key_id.encode() not in data, path
    assert (cache / model_name / ".lock").stat().st_mode & 0o777 == 0o600


def test_shared_filesystem_copied_or_used_in_place(tmp_path, model_name):
    from ansible_collections.inferfleet.fleet.plugins.module_utils.manifest import dumps, scan

    shared = tmp_path / "shared"
    folder = make_model(shared / model_name / "v1", model_files(7))
    (folder / "manifest.json").write_text(dumps(scan(str(folder), model_name, "v1")))
    cache = tmp_path / "cache"
    cache.mkdir()
    base = {"name": model_name, "version": "v1", "cache_root": str(cache), "source": "path",
            "path_source": str(shared)}
    r = model_sync(tmp_path, base)
    assert r["changed"] and not r["in_place"] and r["bytes_downloaded"] == r["bytes_hashed"]
    assert not (cache / model_name / "v1").is_symlink()
    assert_same_files(cache / model_name / "current", model_files(7))

    shutil.rmtree(cache / model_name)
    in_place = dict(base, use_in_place=True)
    r = model_sync(tmp_path, in_place)
    assert r["changed"] and r["in_place"] and r["bytes_downloaded"] == 0
    assert os.path.realpath(cache / model_name / "current") == str(folder.resolve())
    r = model_sync(tmp_path, in_place)
    assert not r["changed"] and r["bytes_hashed"] == 0  # verified once, marker kept


def test_role_installs_creates_the_cache_and_exports_facts(s3, tmp_path, model_name):
    files = {"config.json": b"{}", "w.bin": os.urandom(MiB)}
    manifest = publish_version(s3, tmp_path, model_name, "v1", files)
    cache = tmp_path / "var" / "models"
    tasks = [
        {"name": "model_sync role",
         "ansible.builtin.include_role": {"name": "inferfleet.fleet.model_sync"}},
        {"name": "facts", "ansible.builtin.debug": {
            "msg": "{{ model_sync_model_path }} {{ model_sync_manifest_digest }}"}},
    ]
    play_vars = {
        "inferfleet_model_name": model_name, "inferfleet_model_version": "v1",
        "model_sync_s3_endpoint": s3.endpoint, "model_sync_s3_bucket": BUCKET,
        "model_sync_s3_access_key": s3.access_key, "model_sync_s3_secret_key": s3.secret_key,
        "model_sync_cache_root": str(cache), "model_sync_dir_mode": "0750",
        "model_sync_min_free_mb": 0,
    }
    proc = run_play(tmp_path, tasks, play_vars=play_vars)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    facts = task_results(proc)["facts"]["msg"]
    assert facts == f"{cache / model_name / 'current'} {manifest['digest']}"
    assert cache.stat().st_mode & 0o777 == 0o750
    assert_same_files(cache / model_name / "current", files)

    play_vars["model_sync_source"] = "path"  # without model_sync_path_source
    proc = run_play(tmp_path, tasks, play_vars=play_vars)
    assert proc.returncode != 0
    assert "model_sync_source path needs model_sync_path_source" in proc.stdout


def test_unwritable_cache_fails_and_leaves_current(s3, tmp_path, model_name, small_tmpfs):
    publish_version(s3, tmp_path, model_name, "v1", {"w.bin": os.urandom(1000)})
    publish_version(s3, tmp_path, model_name, "v2", {"w.bin": os.urandom(1000)})
    assert model_sync(tmp_path, sync_args(s3, model_name, "v1", small_tmpfs))["changed"]
    subprocess.run(["mount", "-o", "remount,ro", str(small_tmpfs)], check=True)
    try:
        r = model_sync(tmp_path, sync_args(s3, model_name, "v2", small_tmpfs))
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(small_tmpfs)], check=True)
    assert r["failed"]
    assert f"permission denied: cannot create the lock file {small_tmpfs}/{model_name}" in r["msg"]
    assert "Read-only file system" in r["msg"]
    assert current(small_tmpfs, model_name) == "v1"
    assert not (small_tmpfs / model_name / "v2").exists() and not leftovers(small_tmpfs,
                                                                            model_name)


def test_prefetch_leaves_current_then_activation_is_a_flip(s3, tmp_path, model_name):
    v1, v2 = model_files(5), model_files(6)
    publish_version(s3, tmp_path, model_name, "v1", v1)
    publish_version(s3, tmp_path, model_name, "v2", v2)
    cache = tmp_path / "cache"
    cache.mkdir()
    model_sync(tmp_path, sync_args(s3, model_name, "v1", cache, keep_versions=0))

    r = model_sync(tmp_path, sync_args(s3, model_name, "v2", cache, keep_versions=0,
                                       activate=False))
    assert r["changed"] and r["bytes_downloaded"] > 0 and r["pruned"] == []
    assert current(cache, model_name) == "v1"  # the old version still serves
    assert_same_files(cache / model_name / "v1", v1)
    assert_same_files(cache / model_name / "v2", v2)

    again = model_sync(tmp_path, sync_args(s3, model_name, "v2", cache, keep_versions=0,
                                           activate=False))
    assert not again["changed"]

    flip = model_sync(tmp_path, sync_args(s3, model_name, "v2", cache, keep_versions=0))
    assert flip["changed"] and flip["bytes_downloaded"] == 0
    assert current(cache, model_name) == "v2" and flip["pruned"] == ["v1"]


def test_two_nodes_share_pieces_through_their_peer_servers(s3, tmp_path, model_name):
    """The real module (two runs at once, as two nodes) and the role's peer server (its
    files as the role installs them, under the node's Python): each piece from the store
    about once, every node verified, the second run of a node a no-change."""
    files = {"model-00001-of-00002.safetensors": os.urandom(40 * MiB + 5),
             "model-00002-of-00002.safetensors": os.urandom(24 * MiB),
             "config.json": b'{"model_type": "llama"}\n'}
    manifest = publish_version(s3, tmp_path, model_name, "v1", files)
    assert manifest["format_version"] == 2
    size = sum(len(d) for d in files.values())
    server_dir = tmp_path / "model-peer"
    server_dir.mkdir()
    shutil.copy(REPO / "roles" / "model_sync" / "files" / "model_peer.py", server_dir)
    shutil.copy(REPO / "plugins" / "module_utils" / "manifest.py", server_dir)
    nodes, servers = {}, []
    try:
        for name in ("node-a", "node-b"):
            port = free_port()
            cache = tmp_path / name
            cache.mkdir()
            settings = tmp_path / f"{name}.json"
            settings.write_text(json.dumps({
                "cache_root": str(cache), "address": "127.0.0.1", "port": port,
                "allow": ["127.0.0.1"], "token": "tok-0123456789", "max_mbit": 0,
                "max_connections": 4}))
            servers.append(subprocess.Popen([NODE_PYTHON, str(server_dir / "model_peer.py"),
                                             str(settings)]))
            nodes[name] = (cache, f"http://127.0.0.1:{port}")
        deadline = time.monotonic() + 10
        for _, url in nodes.values():
            while subprocess.run(["curl", "-s", "-o", "/dev/null", url],
                                 check=False).returncode and time.monotonic() < deadline:
                time.sleep(0.1)
        peers = [{"name": n, "url": url} for n, (_, url) in nodes.items()]

        def args(name):
            return sync_args(s3, model_name, "v1", nodes[name][0], peers=peers, peer_name=name,
                             peer_token="tok-0123456789")

        for name in nodes:
            (tmp_path / f"{name}-plays").mkdir()
        with ThreadPoolExecutor(2) as pool:
            results = dict(zip(nodes, pool.map(
                lambda n: model_sync(tmp_path / f"{n}-plays", args(n)), nodes), strict=True))
        for name, r in results.items():
            assert not r.get("failed"), r.get("msg")
            assert r["manifest_digest"] == manifest["digest"]
            assert_same_files(nodes[name][0] / model_name / "current", files)
            assert r["bytes_from_store"] + sum(r["bytes_from_peers"].values()) == size
            assert "tok-0123456789" not in json.dumps(r)
        from_store = sum(r["bytes_from_store"] for r in results.values())
        assert from_store == size, (from_store, size)  # each piece from the store once
        assert not model_sync(tmp_path / "node-a-plays", args("node-a"))["changed"]
    finally:
        for server in servers:
            server.terminate()
            server.wait(10)
