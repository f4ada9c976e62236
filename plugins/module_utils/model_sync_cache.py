"""model_sync's cache: versions under CACHE/NAME/VERSION with a completion marker,
the atomic switch of `current`, pruning, locking, and the Syncer that drives a
sync end to end. Shipped to nodes with the model_sync module."""

from __future__ import annotations

import errno
import fcntl
import grp
import json
import os
import pwd
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from ansible_collections.inferfleet.fleet.plugins.module_utils.manifest import (
    MANIFEST_FILE,
    ManifestError,
    check_name,
    compare,
    dumps,
    hash_file,
    loads,
)
from ansible_collections.inferfleet.fleet.plugins.module_utils.model_sync_swarm import (
    NoStore,
    SwarmSource,
    remove_state,
    state_path,
    write_state,
)
from ansible_collections.inferfleet.fleet.plugins.module_utils.model_sync_transfer import (
    CURRENT,
    INPLACE_PREFIX,
    LOCK_FILE,
    MARKER_FILE,
    TMP_PREFIX,
    TRASH_PREFIX,
    FolderSource,
    MiB,
    PathSource,
    S3Source,
    SyncError,
    Transfer,
    _fsync_dir,
    _os_error,
    _read_text,
    _remove_tree,
    _write_file,
    choose_prune,
    diff_text,
    disk_shortfall,
    filesystem_type,
    human_bytes,
    is_remote_fs,
    parse_mode,
    plan_fetch,
)
from ansible_collections.inferfleet.fleet.plugins.module_utils.s3 import S3Client, S3Error


class ModelCache:
    """``CACHE_ROOT/NAME``: versions, the ``current`` link, markers and the lock."""

    def __init__(self, cache_root: str, name: str):
        self.root = cache_root
        self.dir = os.path.join(cache_root, name)
        self.current_link = os.path.join(self.dir, CURRENT)
        self._lock_fd = -1

    def version_path(self, version: str) -> str:
        return os.path.join(self.dir, version)

    def inplace_marker(self, version: str) -> str:
        return os.path.join(self.dir, INPLACE_PREFIX + version + ".json")

    def current_version(self) -> str:
        try:
            target = os.readlink(self.current_link)
        except OSError:
            return ""
        return os.path.basename(target.rstrip("/"))

    def served(self) -> dict:
        """What the node serves: {version current points at, the digest it was verified
        against ('' when not complete), path (the current link), cache_dir}."""
        version = self.current_version()
        return {"version": version, "digest": self.marker_digest(version) if version else "",
                "path": self.current_link, "cache_dir": os.path.abspath(self.dir)}

    def marker_digest(self, version: str) -> str:
        """Digest a complete local copy was verified against ('' if none)."""
        path = self.version_path(version)
        if os.path.islink(path):
            data = self._inplace_record(version)
            return data.get("manifest_digest", "") if data else ""
        return _read_text(os.path.join(path, MARKER_FILE)).strip()

    def _inplace_record(self, version: str):
        try:
            return json.loads(_read_text(self.inplace_marker(version)) or "null")
        except ValueError:
            return None

    def is_complete(self, version: str, digest: str) -> bool:
        path = self.version_path(version)
        if not digest or self.marker_digest(version) != digest:
            return False
        if os.path.islink(path):
            return self.inplace_unchanged(version)
        return os.path.isdir(path)

    def inplace_unchanged(self, version: str) -> bool:
        """Every file of an in-place version still has the size and mtime seen at verification."""
        record = self._inplace_record(version) or {}
        target = os.readlink(self.version_path(version))
        stats = record.get("files") or {}
        if record.get("target") != target or not stats:
            return False
        for rel, (size, mtime_ns) in stats.items():
            try:
                st = os.stat(os.path.join(target, *rel.split("/")))
            except OSError:
                return False
            if st.st_size != size or st.st_mtime_ns != mtime_ns:
                return False
        return True

    def manifest_of(self, version: str):
        """The manifest of a complete local version, or None."""
        path = os.path.join(self.version_path(version), MANIFEST_FILE)
        try:
            with open(path, "rb") as f:
                manifest = loads(f.read())
        except (OSError, ManifestError):
            return None
        if self.marker_digest(version) != manifest["digest"]:
            return None
        return manifest

    def versions(self) -> list:
        """(version, activation time) of every version this module manages in the cache."""
        found = []
        try:
            names = os.listdir(self.dir)
        except OSError:
            return found
        for entry in names:
            if entry.startswith(".") or entry == CURRENT:
                continue
            path = self.version_path(entry)
            marker = (self.inplace_marker(entry) if os.path.islink(path)
                      else os.path.join(path, MARKER_FILE))
            try:
                found.append((entry, os.stat(marker).st_mtime))
            except OSError:
                continue  # not ours (or not complete): left alone
        return found

    def local_files(self, exclude: str = "") -> dict:
        """(sha256, size) -> path for files of complete local (not in-place) versions."""
        table = {}
        current = self.current_version()
        ordered = sorted(self.versions(), key=lambda v: (v[0] != current, -v[1]))
        for version, _ in ordered:
            if version == exclude or os.path.islink(self.version_path(version)):
                continue
            manifest = self.manifest_of(version)
            if not manifest:
                continue
            for f in manifest["files"]:
                path = os.path.join(self.version_path(version), *f["path"].split("/"))
                table.setdefault((f["sha256"], f["size"]), path)
        return table

    # -- changes (the lock held) -----------------------------------------------------
    def lock(self, timeout: float) -> None:
        path = os.path.join(self.dir, LOCK_FILE)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
        except OSError as exc:
            raise _os_error(exc, "create the lock file", path) from None
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    os.close(fd)
                    raise SyncError(f"cannot lock {path}: {exc.strerror} (is the cache on a "
                                    "filesystem without locks?)") from None
                if time.monotonic() > deadline:
                    os.close(fd)
                    raise SyncError(f"another model_sync run holds {path} for more than "
                                    f"{timeout:.0f} s") from None
                time.sleep(0.2)
        self._lock_fd = fd

    def unlock(self) -> None:
        if self._lock_fd >= 0:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = -1

    def clean_leftovers(self) -> list:
        """Remove temporary and trash folders of runs that died (the lock is held)."""
        removed = []
        for entry in os.listdir(self.dir):
            if entry.startswith((TMP_PREFIX, TRASH_PREFIX)) or entry.startswith(".current-"):
                _remove_tree(os.path.join(self.dir, entry))
                removed.append(entry)
        return removed

    def activate(self, version: str) -> None:
        """Point ``current`` at ``version`` atomically (symlink + rename)."""
        tmp = os.path.join(self.dir, f".current-{os.getpid()}")
        if os.path.lexists(tmp):
            os.unlink(tmp)
        os.symlink(version, tmp)
        os.replace(tmp, self.current_link)
        _fsync_dir(self.dir)

    def touch_marker(self, version: str) -> None:
        path = self.version_path(version)
        marker = (self.inplace_marker(version) if os.path.islink(path)
                  else os.path.join(path, MARKER_FILE))
        os.utime(marker, None)

    def remove_version(self, version: str) -> None:
        """Remove a version: a folder disappears at once (renamed aside, then deleted),
        and peers are no longer offered it."""
        remove_state(self.dir, version)
        self.discard(version)
        self.clean_leftovers()

    def discard(self, version: str) -> None:
        """Move a version entry out of the way; an in-place link loses only the link."""
        path = self.version_path(version)
        if os.path.islink(path):  # in place: never touch the shared copy
            os.unlink(path)
            if os.path.lexists(self.inplace_marker(version)):
                os.unlink(self.inplace_marker(version))
            return
        trash = tempfile.mkdtemp(prefix=TRASH_PREFIX, dir=self.dir)
        os.rename(path, os.path.join(trash, version))

    def link_version(self, version: str, target: str) -> None:
        """Make ``NAME/VERSION`` a symlink to a verified shared copy, atomically."""
        tmp = os.path.join(self.dir, f".current-link-{os.getpid()}")
        if os.path.lexists(tmp):
            os.unlink(tmp)
        os.symlink(target, tmp)
        os.replace(tmp, self.version_path(version))
        _fsync_dir(self.dir)


# ---------------------------------------------------------------------------------------
# The sync
# ---------------------------------------------------------------------------------------
class LocalCopySource(PathSource):
    """Files of other versions in the cache, copied (and verified) where hard links fail."""

    kind = "local"

    def __init__(self, paths: dict):
        self.paths = paths  # manifest path -> absolute source path
        self.root = ""

    def where(self, rel: str = "") -> str:
        return self.paths.get(rel, rel)


class Syncer:
    """One model_sync run: plan, then (unless in check mode) fetch, verify, activate, prune."""

    def __init__(self, params: dict, check_mode: bool = False, source=None):
        self.p = params
        self.check_mode = check_mode
        self.name = check_name(params["name"], "name")
        self.version = check_name(params["version"], "version")
        self.cache = ModelCache(params["cache_root"], self.name)
        self.in_place = bool(params.get("use_in_place"))
        if self.in_place and params.get("source", "s3") != "path":
            raise SyncError("use_in_place needs source=path (a shared filesystem)")
        self.file_mode = parse_mode(params.get("file_mode") or "0644", "file_mode")
        self.dir_mode = parse_mode(params.get("dir_mode") or "0755", "dir_mode")
        self.uid, self.gid = self._owner()
        self.source = source or self._make_source()
        self.result = {
            "changed": False, "path": self.cache.version_path(self.version),
            "current_path": self.cache.current_link, "version": self.version,
            "previous_version": "", "manifest_digest": "", "bytes_downloaded": 0,
            "bytes_hashed": 0, "bytes_reused": 0, "files_fetched": [], "files_added": [],
            "files_changed": [], "pruned": [], "in_place": False, "seconds": 0.0,
            "bytes_from_store": 0, "bytes_from_peers": {}, "peers_dropped": {},
        }
        self.warnings = []
        self.diff = {}
        self._tmp = ""

    def _make_source(self):
        p = self.p
        kind = p.get("source", "s3")
        if kind in ("path", "folder") and not p.get("path_source"):
            raise SyncError(f"source={kind} needs path_source")
        if kind == "path":
            store = PathSource(p["path_source"], self.name, self.version)
        elif kind == "folder":
            store = FolderSource(p["path_source"], self.name, self.version)
        elif kind == "peers":
            if not p.get("peers"):
                raise SyncError("source=peers needs peers: the nodes that may hold the version")
            store = NoStore(self.name, self.version)
        else:
            store = self._s3_store()
        if not p.get("peers"):
            return store
        if not p.get("peer_name"):
            raise SyncError("peers need peer_name: this node's name among them")
        return SwarmSource(store, p["peer_name"], p["peers"], p.get("peer_token") or "",
                           self.name, self.version, timeout=float(p.get("timeout") or 60),
                           stall=float(p.get("peer_stall_timeout") or 30),
                           pinned_digest=p.get("manifest_digest") or "")

    def _s3_store(self):
        p = self.p
        if not p.get("s3_endpoint") or not p.get("s3_bucket"):
            raise SyncError("source=s3 needs s3_endpoint and s3_bucket")
        try:
            client = S3Client(p["s3_endpoint"], p.get("access_key") or "",
                              p.get("secret_key") or "", p.get("region") or "us-east-1",
                              p.get("session_token") or "", float(p.get("timeout") or 60),
                              bool(p.get("validate_certs", True)), p.get("ca_bundle") or "")
        except S3Error as exc:
            raise SyncError(str(exc)) from None
        return S3Source(client, p["s3_bucket"], p.get("s3_prefix") or "", self.name,
                        self.version)

    def _owner(self) -> tuple:
        uid = gid = -1
        if self.p.get("owner"):
            try:
                uid = pwd.getpwnam(self.p["owner"]).pw_uid
            except KeyError:
                raise SyncError(f"owner {self.p['owner']!r} does not exist on this node") from None
        if self.p.get("group"):
            try:
                gid = grp.getgrnam(self.p["group"]).gr_gid
            except KeyError:
                raise SyncError(f"group {self.p['group']!r} does not exist on this node") from None
        return uid, gid

    # -- reading and planning ----------------------------------------------------------
    def _check_cache_root(self) -> None:
        root = self.p["cache_root"]
        if not os.path.isdir(root):
            raise SyncError(f"cache_root {root} does not exist (the model_sync role creates it)")
        if self.p.get("allow_remote_cache"):
            return
        try:
            with open("/proc/self/mountinfo") as f:
                mountinfo = f.read()
        except OSError:
            return
        mount_point, fstype = filesystem_type(os.path.realpath(root), mountinfo)
        if is_remote_fs(fstype):
            raise SyncError(
                f"cache_root {root} is on a {fstype} filesystem (mounted at {mount_point}): the "
                "cache must be on a local disk, where locks, renames and fsync are reliable; use "
                "source=path to read a shared copy, or allow_remote_cache=true")

    def _read_manifest(self) -> dict:
        try:
            raw = self.source.read_manifest()
        except S3Error as exc:
            raise SyncError(f"cannot read the manifest of {self.name}/{self.version}: "
                            f"{exc}") from None
        try:
            manifest = loads(raw)
        except ManifestError as exc:
            raise SyncError(f"bad manifest at {self.source.where(MANIFEST_FILE)}: {exc}") from None
        if manifest["name"] != self.name or manifest["version"] != self.version:
            raise SyncError(f"the manifest at {self.source.where(MANIFEST_FILE)} describes "
                            f"{manifest['name']}/{manifest['version']}, not "
                            f"{self.name}/{self.version}")
        expected = self.p.get("manifest_digest")
        if expected and manifest["digest"] != expected:
            raise SyncError(f"the manifest at {self.source.where(MANIFEST_FILE)} has digest "
                            f"{manifest['digest']}, expected {expected}")
        return manifest

    def _check_space(self, fetch: list) -> None:
        needed = sum(f["size"] for f in fetch)
        reserve = int(self.p.get("min_free_mb") or 0) * MiB
        st = os.statvfs(self.p["cache_root"])
        free = st.f_bavail * st.f_frsize
        missing = disk_shortfall(needed, free, reserve)
        if missing:
            kept = f" plus {human_bytes(reserve)} kept free (min_free_mb)" if reserve else ""
            raise SyncError(
                f"not enough free space in {self.p['cache_root']} for {self.name}/{self.version}: "
                f"need {human_bytes(needed)} ({needed} bytes) for {len(fetch)} files{kept}, "
                f"{human_bytes(free)} ({free} bytes) free; free {human_bytes(missing)} more or "
                "lower min_free_mb")

    def _plan(self, manifest: dict) -> tuple:
        """(files to fetch, (entry, local path) pairs to reuse)."""
        if self.in_place:
            return [], []
        return plan_fetch(manifest, self.cache.local_files(exclude=self.version))

    def _prune_plan(self) -> list:
        keep = self.p.get("keep_versions")
        keep = 2 if keep is None else int(keep)
        versions = [v for v in self.cache.versions() if v[0] != self.version]
        return choose_prune(versions + [(self.version, time.time() + 1)], self.version, keep)

    # -- the run ----------------------------------------------------------------------
    def run(self) -> dict:
        started = time.monotonic()
        try:
            self._check_cache_root()
            self._run()
        finally:
            self.result["seconds"] = round(time.monotonic() - started, 3)
            self.source.close()
        return self.result

    def _run(self) -> None:
        cache = self.cache
        previous = cache.current_version()
        self.result["previous_version"] = previous
        expected = self.p.get("manifest_digest")
        manifest = None
        if expected and cache.is_complete(self.version, expected):
            manifest = cache.manifest_of(self.version)  # known good: the source is not asked
        if manifest is None:
            manifest = self._read_manifest()
        if isinstance(self.source, SwarmSource) and "piece_size" not in manifest:
            self.warnings.append(
                f"{self.name}/{self.version} has a format 1 manifest (no piece hashes): "
                "fetched from the object store only; publish it again to share it between "
                "nodes")
            self.source = self.source.store
        digest = manifest["digest"]
        self.result["manifest_digest"] = digest
        complete = cache.is_complete(self.version, digest)
        self.result["in_place"] = (os.path.islink(cache.version_path(self.version))
                                   if complete else self.in_place)

        previous_manifest = manifest if previous == self.version and complete else (
            cache.manifest_of(previous) if previous else None)
        changes = compare(previous_manifest, manifest)
        self.result["files_added"] = changes["added"]
        self.result["files_changed"] = changes["changed"]
        self.diff = {"before": diff_text(previous, previous_manifest),
                     "after": diff_text(self.version, manifest),
                     "before_header": cache.current_link, "after_header": cache.current_link}
        activate = self.p.get("activate", True)
        if not activate:  # only the version's own folder may change
            self.diff = {"before": diff_text(self.version, manifest) if complete else "",
                         "after": diff_text(self.version, manifest),
                         "before_header": cache.version_path(self.version),
                         "after_header": cache.version_path(self.version)}

        if not complete:
            fetch, reuse = self._plan(manifest)
            self.result["files_fetched"] = [f["path"] for f in fetch]
            self.result["bytes_reused"] = sum(f["size"] for f, _ in reuse)
            self._check_space(fetch)
        prune = self._prune_plan() if activate else []
        offer = complete and self._offers() and not self._offered(digest)
        self.result["changed"] = ((not complete) or (activate and previous != self.version)
                                  or bool(prune) or offer)
        if self.check_mode:
            self.result["pruned"] = prune
            return
        if not self.result["changed"]:
            return

        self._ensure_dir(cache.dir)
        cache.lock(float(self.p.get("lock_timeout") or 3600))
        try:
            cache.clean_leftovers()
            # Another run may have done the work while this one waited for the lock:
            # look again, and report only what this run changed.
            changed = False
            if cache.is_complete(self.version, digest):
                self.result["files_fetched"] = []
                self.result["bytes_reused"] = 0
            elif self.in_place:
                self._verify_in_place(manifest)
                changed = True
            else:
                self._fetch_version(manifest)
                changed = True
            if activate and cache.current_version() != self.version:
                cache.touch_marker(self.version)
                cache.activate(self.version)
                changed = True
            if self._offers() and not self._offered(digest):
                write_state(cache.dir, self.version, digest, self.version)
                changed = True
            self.result["in_place"] = os.path.islink(cache.version_path(self.version))
            self.result["pruned"] = self._prune() if activate else []
            self.result["changed"] = changed or bool(self.result["pruned"])
        finally:
            cache.unlock()

    def _offers(self) -> bool:
        """Whether this node offers its verified versions to peers (it has peers, and the
        version is a copy of its own, not a shared filesystem's)."""
        return isinstance(self.source, SwarmSource) and not os.path.islink(
            self.cache.version_path(self.version))

    def _offered(self, digest: str) -> bool:
        try:
            state = json.loads(_read_text(state_path(self.cache.dir, self.version)))
        except (OSError, ValueError):
            return False
        return (state.get("digest"), state.get("dir"), state.get("have")) == (
            digest, self.version, "all")

    def _ensure_dir(self, path: str) -> None:
        if os.path.isdir(path):
            return
        try:
            os.mkdir(path, self.dir_mode)
            os.chmod(path, self.dir_mode)
            if self.uid >= 0 or self.gid >= 0:
                os.chown(path, self.uid, self.gid)
        except OSError as exc:
            raise _os_error(exc, "create", path) from None

    def _fetch_version(self, manifest: dict) -> None:
        cache = self.cache
        fetch, reuse = self._plan(manifest)
        self._check_space(fetch)
        try:
            self._tmp = tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{self.version}-",
                                         dir=cache.dir)
        except OSError as exc:
            raise _os_error(exc, "create a temporary folder in", cache.dir) from None
        try:
            dirs = {self._tmp}
            for entry in manifest["files"]:
                parent = os.path.dirname(self._dest(entry))
                if parent not in dirs:
                    os.makedirs(parent, exist_ok=True)
                    dirs.update(_parents(parent, self._tmp))
            copies = {}
            for entry, src in reuse:
                try:
                    os.link(src, self._dest(entry))
                except OSError:
                    copies[entry["path"]] = src  # no hard links here: copy it, verified
            direct_io = bool(self.p.get("direct_io", True))
            part_size = int(self.p.get("part_size_mb") or 16) * MiB
            # Written first: a peer reads the pieces' table from it while this run fetches.
            _write_file(os.path.join(self._tmp, MANIFEST_FILE), dumps(manifest))
            swarm = isinstance(self.source, SwarmSource)
            if swarm:
                part_size = manifest["piece_size"]  # a part is a piece: checked as one
                folder = os.path.basename(self._tmp)
                self.source.begin(manifest, lambda have, busy: write_state(
                    cache.dir, self.version, manifest["digest"], folder, have, busy),
                    held=[e for e, _ in reuse if e["path"] not in copies])
            transfer = Transfer(self.source, int(self.p.get("concurrency") or 8), part_size,
                                direct_io=direct_io)
            try:
                transfer.run([(e, self._dest(e)) for e in fetch])
            finally:
                if swarm:
                    self.source.finish()
                    self.result["bytes_from_store"] = self.source.bytes_from_store
                    self.result["bytes_from_peers"] = dict(self.source.bytes_from_peers)
                    self.result["peers_dropped"] = dict(self.source.dropped)
                    self.warnings.extend(self.source.warnings)
            if not swarm:
                self.result["bytes_from_store"] = transfer.bytes_written
            hashed = transfer.bytes_hashed
            if copies:
                copier = Transfer(LocalCopySource(copies), 4, 16 * MiB, direct_io=direct_io)
                copier.run([(e, self._dest(e)) for e, _ in reuse if e["path"] in copies])
                hashed += copier.bytes_hashed
            self.result["bytes_downloaded"] = transfer.bytes_written
            self.result["bytes_hashed"] = hashed
            self.result["bytes_reused"] = sum(e["size"] for e, _ in reuse)
            self.result["files_fetched"] = [e["path"] for e in fetch]
            # The marker can go in now: the rename below is what makes the version appear.
            _write_file(os.path.join(self._tmp, MARKER_FILE), manifest["digest"] + "\n")
            self._apply_ownership(dirs)
            for d in sorted(dirs, key=len, reverse=True):
                _fsync_dir(d)
            target = cache.version_path(self.version)
            if os.path.lexists(target):  # an incomplete or outdated copy: move it aside
                cache.discard(self.version)
            os.rename(self._tmp, target)
            self._tmp = ""
            _fsync_dir(cache.dir)
            if swarm:  # offered whole from now on, from its final folder
                write_state(cache.dir, self.version, manifest["digest"], self.version)
            cache.clean_leftovers()
        finally:
            if self._tmp:
                if isinstance(self.source, SwarmSource):
                    remove_state(cache.dir, self.version)
                shutil.rmtree(self._tmp, ignore_errors=True)
                self._tmp = ""

    def _dest(self, entry: dict) -> str:
        return os.path.join(self._tmp, *entry["path"].split("/"))

    def _apply_ownership(self, dirs) -> None:
        for dirpath, _, filenames in os.walk(self._tmp):
            for name in filenames:
                path = os.path.join(dirpath, name)
                os.chmod(path, self.file_mode)
                if self.uid >= 0 or self.gid >= 0:
                    os.chown(path, self.uid, self.gid)
        for d in dirs:
            os.chmod(d, self.dir_mode)
            if self.uid >= 0 or self.gid >= 0:
                os.chown(d, self.uid, self.gid)

    def _verify_in_place(self, manifest: dict) -> None:
        """Hash the shared copy once; remember it with a marker in the cache."""
        stats = {}
        workers = max(1, min(int(self.p.get("concurrency") or 8), 16))

        def check(entry: dict) -> int:
            path = self.source.where(entry["path"])
            try:
                st = os.stat(path)
                size, digest, _ = hash_file(path)
            except FileNotFoundError:
                raise SyncError(f"file not found: {path}") from None
            except OSError as exc:
                raise SyncError(f"cannot read {path}: {exc.strerror}") from None
            if size != entry["size"]:
                raise SyncError(f"size mismatch for {path}: {size} bytes, the manifest says "
                                f"{entry['size']}")
            if digest != entry["sha256"]:
                raise SyncError("checksum mismatch for {}: the manifest says sha256 {}, the "
                                "file hashes to {}".format(path, entry["sha256"], digest))
            stats[entry["path"]] = [st.st_size, st.st_mtime_ns]
            return size

        with ThreadPoolExecutor(workers) as pool:
            self.result["bytes_hashed"] = sum(pool.map(check, manifest["files"]))
        real = os.path.realpath(self.source.where())
        record = {"manifest_digest": manifest["digest"], "target": real, "files": stats}
        _write_file(self.cache.inplace_marker(self.version),
                    json.dumps(record, sort_keys=True) + "\n")
        if os.path.lexists(self.cache.version_path(self.version)):
            self.cache.discard(self.version)
        self.cache.link_version(self.version, real)
        self.cache.clean_leftovers()

    def _prune(self) -> list:
        removed = []
        for version in self._prune_plan():
            if version in (self.cache.current_version(), self.version):
                continue
            try:
                self.cache.remove_version(version)
            except OSError as exc:
                self.warnings.append(f"could not remove old version "
                                     f"{self.cache.version_path(version)}: {exc.strerror}")
                continue
            removed.append(version)
        return removed


def _parents(path: str, top: str) -> list:
    """``path`` and its parents up to (excluding) ``top``."""
    out = []
    while path != top and path.startswith(top):
        out.append(path)
        path = os.path.dirname(path)
    return out


# ---------------------------------------------------------------------------------------
# Ansible entry point
# ---------------------------------------------------------------------------------------
