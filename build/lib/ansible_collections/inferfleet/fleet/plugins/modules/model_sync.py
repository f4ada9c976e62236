#!/usr/bin/python
# Copyright: inferfleet contributors
# Apache License 2.0 (see pyproject.toml)
"""Ansible module model_sync: a content-verified, versioned local cache of model weights."""

from __future__ import annotations

import errno
import fcntl
import grp
import hashlib
import json
import mmap
import os
import pwd
import shutil
import tempfile
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

from ansible.module_utils.basic import AnsibleModule, env_fallback
from ansible_collections.inferfleet.fleet.plugins.module_utils.manifest import (
    MANIFEST_FILE,
    ManifestError,
    check_name,
    compare,
    dumps,
    hash_file,
    loads,
)
from ansible_collections.inferfleet.fleet.plugins.module_utils.s3 import S3Client, S3Error

DOCUMENTATION = r"""
---
module: model_sync
short_description: Fetch a model version into a content-verified local cache
description:
  - Reads the version's C(manifest.json) (see docs/model-sync.md), downloads the files that
    the local cache does not already hold with parallel ranged GETs, hashing every byte as
    it arrives, into a temporary folder on the cache's filesystem.
  - Every file's size and SHA-256 are verified and the files fsynced before the folder is
    renamed to C(CACHE_ROOT/NAME/VERSION); only then is C(CACHE_ROOT/NAME/current)
    switched, atomically, to the new version.
  - A re-run on a complete version (its marker file holds the manifest digest) downloads
    and hashes nothing and reports no change.
  - Any failure removes the temporary files and leaves C(current) as it was.
  - Runs on the node with the Python standard library only.
version_added: "0.1.0"
author: inferfleet contributors
options:
  name:
    description: Model name (the second to last segment of the version's location).
    type: str
    required: true
  version:
    description: Model version (the last segment of the version's location).
    type: str
    required: true
  cache_root:
    description:
      - Local folder holding one sub-folder per model. Must exist and be on a local
        filesystem (see O(allow_remote_cache)).
    type: path
    required: true
  source:
    description:
      - C(s3) reads C(s3://S3_BUCKET/S3_PREFIX/NAME/VERSION/); C(path) reads
        C(PATH_SOURCE/NAME/VERSION/) on a mounted filesystem (NFS, Lustre, ...).
    type: str
    choices: [s3, path]
    default: s3
  s3_endpoint:
    description: S3 endpoint URL, C(http(s)://HOST[:PORT]). Path-style addressing is used.
    type: str
  s3_bucket:
    description: Bucket holding the models.
    type: str
  s3_prefix:
    description: Key prefix above C(NAME/VERSION), without leading or trailing slash.
    type: str
    default: ""
  access_key:
    description: S3 access key; empty for anonymous access.
    type: str
    default: ""
  secret_key:
    description: S3 secret key.
    type: str
    default: ""
  session_token:
    description: Temporary-credential session token.
    type: str
    default: ""
  region:
    description: Region used in request signatures.
    type: str
    default: us-east-1
  validate_certs:
    description: Verify the endpoint's TLS certificate.
    type: bool
    default: true
  ca_bundle:
    description: CA bundle file for the endpoint's certificate (default the system's).
    type: path
  path_source:
    description: With O(source=path), the folder that holds C(NAME/VERSION/manifest.json).
    type: path
  use_in_place:
    description:
      - With O(source=path), verify the shared copy once and point C(current) at it instead
        of copying it. The verification is remembered (manifest digest plus each file's
        size and modification time) and redone only when one of them changes.
    type: bool
    default: false
  manifest_digest:
    description:
      - Expected manifest digest. The source's manifest must match it, and a local
        complete copy with this digest is used without contacting the source at all.
    type: str
  keep_versions:
    description: Previous versions kept besides the current one; older ones are removed.
    type: int
    default: 2
  activate:
    description:
      - Switch C(current) to this version once it is complete. With C(false) the version
        is only fetched and verified (a rolling update's pre-fetch while the old version
        serves); C(current) and the other versions are left alone, nothing is pruned.
    type: bool
    default: true
  concurrency:
    description: Parallel ranged GETs (or reads, for a path source).
    type: int
    default: 8
  part_size_mb:
    description:
      - Size of one ranged GET in MiB. The transfer holds at most 2 x O(concurrency)
        parts in memory while they wait to be hashed in order.
    type: int
    default: 16
  direct_io:
    description:
      - Write parts with O_DIRECT (no page-cache copy, so the fsync has little left to
        write). Filesystems without O_DIRECT fall back to buffered writes by themselves.
    type: bool
    default: true
  min_free_mb:
    description: Free space (MiB) that must remain on the cache filesystem after the download.
    type: int
    default: 0
  timeout:
    description: Seconds to wait on one network operation.
    type: int
    default: 60
  lock_timeout:
    description: Seconds to wait for another run on this node to release the model's lock.
    type: int
    default: 3600
  owner:
    description: Owner of the files and folders created (default the user running the module).
    type: str
  group:
    description: Group of the files and folders created.
    type: str
  file_mode:
    description: Mode of the model files.
    type: str
    default: "0644"
  dir_mode:
    description: Mode of the folders created.
    type: str
    default: "0755"
  allow_remote_cache:
    description:
      - Accept a cache root on a network filesystem (NFS, Lustre, CIFS, ...). Locks,
        renames and fsync are not reliable there; see docs/model-sync.md.
    type: bool
    default: false
notes:
  - Supports check mode (reports what it would fetch and prune) and diff mode (version,
    manifest digest and file list before and after).
"""

EXAMPLES = r"""
- name: Sync the model from S3
  model_sync:
    name: tiny-llama
    version: v3
    cache_root: /var/lib/inferfleet/models
    s3_endpoint: https://s3.example.internal
    s3_bucket: models
    s3_prefix: llm
    access_key: "{{ vault_s3_access_key }}"
    secret_key: "{{ vault_s3_secret_key }}"
    concurrency: 16
  register: synced

- name: Use a Lustre copy in place, verified once
  model_sync:
    name: tiny-llama
    version: v3
    cache_root: /var/lib/inferfleet/models
    source: path
    path_source: /lustre/models
    use_in_place: true
"""

RETURN = r"""
path:
  description: Folder of the version in the cache (a symlink to the shared copy when used in place).
  type: str
  returned: always
  sample: /var/lib/inferfleet/models/tiny-llama/v3
current_path:
  description: The C(current) symlink of the model, which points at RV(path) after a run.
  type: str
  returned: always
manifest_digest:
  description: Digest of the version's manifest.
  type: str
  returned: always
  sample: sha256:0f4c...
version:
  description: The version synced.
  type: str
  returned: always
previous_version:
  description: The version C(current) pointed at before the run (empty if none).
  type: str
  returned: always
bytes_downloaded:
  description: Bytes of model files fetched from the source (the manifest itself not counted).
  type: int
  returned: always
bytes_hashed:
  description: Bytes hashed on this node during the run.
  type: int
  returned: always
bytes_reused:
  description: Bytes taken from versions already in the cache (hard links) instead of fetched.
  type: int
  returned: always
files_fetched:
  description: Paths of the files fetched (or, in check mode, that would be).
  type: list
  elements: str
  returned: always
files_added:
  description: Paths in this version that the previous current version lacked.
  type: list
  elements: str
  returned: always
files_changed:
  description: Paths whose size or hash differ from the previous current version.
  type: list
  elements: str
  returned: always
pruned:
  description: Versions removed (or, in check mode, that would be).
  type: list
  elements: str
  returned: always
in_place:
  description: Whether the version is used in place on the shared filesystem.
  type: bool
  returned: always
seconds:
  description: Seconds the module took.
  type: float
  returned: always
"""

MARKER_FILE = ".inferfleet-complete"
LOCK_FILE = ".lock"
CURRENT = "current"
TMP_PREFIX = ".tmp-"
TRASH_PREFIX = ".trash-"
INPLACE_PREFIX = ".inplace-"
IO_CHUNK = 1024 * 1024
DIRECT_ALIGN = 4096  # O_DIRECT offsets and lengths: a multiple of the block size
MiB = 1024 * 1024

REMOTE_FILESYSTEMS = frozenset([
    "nfs", "nfs4", "lustre", "cifs", "smb3", "smbfs", "ceph", "glusterfs", "gpfs",
    "beegfs", "9p", "afs", "fuse.sshfs", "fuse.s3fs", "fuse.gcsfuse", "fuse.rclone",
    "fuse.glusterfs", "fuse.ceph", "fuse.juicefs", "fuse.mountpoint-s3", "fuse.goofys",
])


class SyncError(Exception):
    """A failure with a message that says what and where."""


# ---------------------------------------------------------------------------------------
# Pure helpers
# ---------------------------------------------------------------------------------------
def human_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # unreachable


def plan_parts(size: int, part_size: int) -> list:
    """[start, end) byte ranges of one file; one empty range for an empty file."""
    if part_size <= 0:
        raise ValueError("part size must be positive")
    if size == 0:
        return [(0, 0)]
    return [(start, min(start + part_size, size)) for start in range(0, size, part_size)]


def object_key(prefix: str, name: str, version: str, rel: str = "") -> str:
    parts = [p for p in (prefix or "").strip("/").split("/") if p]
    parts += [name, version]
    key = "/".join(parts) + "/"
    return key + rel if rel else key


def parse_mode(value, what: str) -> int:
    try:
        mode = int(str(value), 8)
    except ValueError:
        raise SyncError(f"{what} {value!r} is not an octal mode such as 0644") from None
    if not 0 <= mode <= 0o7777:
        raise SyncError(f"{what} {value!r} is out of range")
    return mode


def filesystem_type(path: str, mountinfo: str) -> tuple:
    """(mount point, fs type) of the mount holding ``path``, from /proc/self/mountinfo text."""
    best = ("", "")
    for line in mountinfo.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        mount_point = fields[4].replace("\\040", " ")
        fstype = line.split(" - ", 1)[1].split()[0]
        inside = path == mount_point or path.startswith(mount_point.rstrip("/") + "/")
        if inside and len(mount_point) >= len(best[0]):
            best = (mount_point, fstype)
    return best


def is_remote_fs(fstype: str) -> bool:
    return fstype in REMOTE_FILESYSTEMS or fstype.split(".")[0] in REMOTE_FILESYSTEMS


def disk_shortfall(needed: int, free: int, reserve: int) -> int:
    """Bytes missing so that ``needed`` fits while leaving ``reserve`` free (0 if it fits)."""
    return max(0, needed + reserve - free)


def choose_prune(versions: list, current: str, keep: int) -> list:
    """Versions to remove: all but ``current`` and the ``keep`` most recently activated.

    ``versions`` holds (name, activation_time) pairs.
    """
    previous = sorted((v for v in versions if v[0] != current), key=lambda v: (v[1], v[0]),
                      reverse=True)
    return sorted(name for name, _ in previous[max(keep, 0):])


def plan_fetch(manifest: dict, local_files: dict) -> tuple:
    """Split the manifest's files into (to_fetch, to_reuse).

    ``local_files`` maps (sha256, size) to a path of a verified local copy; matching
    files are reused (hard-linked), the others fetched.
    """
    fetch, reuse = [], []
    for entry in manifest["files"]:
        src = local_files.get((entry["sha256"], entry["size"]))
        if src:
            reuse.append((entry, src))
        else:
            fetch.append(entry)
    return fetch, reuse


def diff_text(version: str, manifest) -> str:
    if not manifest:
        return "version: %s\n" % (version or "(none)")
    lines = [f"version: {version}", f"manifest_digest: {manifest['digest']}", "files:"]
    lines += [f"  {f['path']}  {f['size']}  sha256:{f['sha256']}" for f in manifest["files"]]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------
# Sources
# ---------------------------------------------------------------------------------------
class S3Source:
    kind = "s3"

    def __init__(self, client: S3Client, bucket: str, prefix: str, name: str, version: str):
        self.client = client
        self.bucket = bucket
        self.prefix = prefix
        self.name = name
        self.version = version

    def where(self, rel: str = "") -> str:
        return f"s3://{self.bucket}/{object_key(self.prefix, self.name, self.version, rel)}"

    def read_manifest(self) -> bytes:
        return self.client.get_bytes(self.bucket,
                                     object_key(self.prefix, self.name, self.version,
                                                MANIFEST_FILE))

    def fetch(self, entry: dict, start: int, end: int, into: memoryview, on_data) -> None:
        key = object_key(self.prefix, self.name, self.version, entry["path"])
        self.client.get_range(self.bucket, key, start, end, into, on_data,
                              object_size=entry["size"], chunk=IO_CHUNK)

    def close(self) -> None:
        self.client.close()


class PathSource:
    kind = "path"

    def __init__(self, root: str, name: str, version: str):
        self.root = os.path.join(root, name, version)

    def where(self, rel: str = "") -> str:
        return os.path.join(self.root, *rel.split("/")) if rel else self.root

    def read_manifest(self) -> bytes:
        path = self.where(MANIFEST_FILE)
        try:
            with open(path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            raise SyncError(f"manifest not found: {path}") from None
        except OSError as exc:
            raise SyncError(f"cannot read {path}: {exc.strerror}") from None

    def fetch(self, entry: dict, start: int, end: int, into: memoryview, on_data) -> None:
        path = self.where(entry["path"])
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            raise SyncError(f"file not found: {path}") from None
        except OSError as exc:
            raise SyncError(f"cannot read {path}: {exc.strerror}") from None
        try:
            actual = os.fstat(fd).st_size
            if actual != entry["size"]:
                raise SyncError(f"{path} is {actual} bytes but the manifest says {entry['size']}")
            pos = start
            while pos < end:
                at = pos - start
                chunk = into[at:at + min(IO_CHUNK, end - pos)]
                n = os.preadv(fd, [chunk], pos)
                if not n:
                    raise SyncError(f"{path} ended at byte {pos}, the manifest says "
                                    f"{entry['size']}")
                on_data(pos, chunk[:n])
                pos += n
        except OSError as exc:
            raise SyncError(f"cannot read {path}: {exc.strerror}") from None
        finally:
            os.close(fd)

    def close(self) -> None:
        pass


# ---------------------------------------------------------------------------------------
# The transfer engine: parallel part fetches, every file hashed in order from memory
# ---------------------------------------------------------------------------------------
class _Abort(Exception):
    pass


class _BufferPool:
    """A fixed set of part-sized, page-aligned buffers: bounds the memory a transfer holds.

    Buffers are handed out strictly in the order the parts were queued (``seq``).
    A part keeps its buffer until it has been hashed and written, so this order is
    what guarantees progress: the oldest part holding a buffer is always the next one
    its file's hash needs, and frees its buffer once it has arrived.
    """

    def __init__(self, count: int, size: int):
        self.size = size
        self._free = []
        self._all = []
        self._count = max(1, count)
        self._next = 0
        self._cond = threading.Condition()

    def get(self, seq: int, failed: threading.Event) -> mmap.mmap:
        with self._cond:
            while seq != self._next or (not self._free and len(self._all) >= self._count):
                if failed.is_set():
                    raise _Abort()
                self._cond.wait(0.5)
            self._next += 1
            self._cond.notify_all()
            if self._free:
                return self._free.pop()
            buf = mmap.mmap(-1, self.size)  # anonymous memory: page-aligned, for O_DIRECT
            self._all.append(buf)
            return buf

    def put(self, buf: mmap.mmap) -> None:
        with self._cond:
            self._free.append(buf)
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            for buf in self._all:
                try:
                    buf.close()
                except BufferError:  # still viewed by a thread that is stopping
                    pass
            self._all, self._free = [], []


class _FileJob:
    """One file of a transfer: its parts, its destination and its running hash.

    Parts arrive in any order (each into its own buffer); the hash advances over the
    bytes in file order, on whichever thread finds the next bytes ready. A part's
    buffer goes back to the pool once the part is hashed and written.
    """

    def __init__(self, entry: dict, dest: str, part_size: int, direct: bool):
        self.entry = entry
        self.dest = dest
        self.size = entry["size"]
        self.parts = plan_parts(self.size, part_size)
        self.received = [s for s, _ in self.parts]  # per part: bytes in up to this offset
        self.buffers = [None] * len(self.parts)
        # per part: what must still happen before its buffer is free (hash [, write])
        self.holds = [2 if direct else 1] * len(self.parts)
        # before the file can be finished: the hash, and (direct) every part's write
        self.pending = 1 + (len(self.parts) if direct else 0)
        self.want_direct = direct
        self.direct = False
        self.sha = hashlib.sha256()
        self.hashed = 0  # bytes hashed, from offset 0
        self.lock = threading.Lock()  # guards the fields above
        self.drain_lock = threading.Lock()  # held by the one thread hashing this file
        self.fd = -1
        self.verified = False  # size and hash checked, data fsynced
        self.closed = False

    def open(self) -> int:
        """The destination's descriptor, created on first use (O_DIRECT where possible)."""
        with self.lock:
            if self.closed:
                raise SyncError(f"{self.dest} was used after it was verified")
            if self.fd < 0:
                self.fd, self.direct = _create_exclusive(self.dest, self.want_direct)
                if self.want_direct and not self.direct:  # no O_DIRECT here: write as it comes
                    self.holds = [1] * len(self.parts)
                    self.pending = 1
            return self.fd

    def release(self, index: int) -> object:
        """Drop one hold on a part; its buffer when it is free (caller holds lock)."""
        self.holds[index] -= 1
        if self.holds[index]:
            return None
        buf, self.buffers[index] = self.buffers[index], None
        return buf

    def close(self) -> None:
        with self.lock:
            self.closed = True
            if self.fd >= 0:
                os.close(self.fd)
                self.fd = -1


class Transfer:
    """Fetch files into destinations, verifying the size and SHA-256 of every byte.

    ``concurrency`` threads fetch parts of ``part_size`` bytes (ranged GETs) into
    buffers from a bounded pool. The SHA-256 of each file advances in file order over
    those buffers, on the fetching threads, as the bytes arrive; nothing is read back
    from disk. Each part is written with O_DIRECT once it is complete (no page-cache
    copy, no writeback left for the fsync), or, where the filesystem has no O_DIRECT,
    chunk by chunk as it arrives. A file is checked and fsynced as soon as it is
    hashed and written, while later files still download.
    """

    def __init__(self, source, concurrency: int = 8, part_size: int = 16 * MiB,
                 buffers: int = 0, direct_io: bool = True):
        self.source = source
        self.concurrency = max(1, concurrency)
        self.part_size = max(IO_CHUNK, part_size - part_size % DIRECT_ALIGN)
        self.direct_io = direct_io
        self.pool = _BufferPool(buffers or 2 * self.concurrency, self.part_size)
        self.bytes_written = 0
        self.bytes_hashed = 0
        self._lock = threading.Lock()
        self._failed = threading.Event()
        self._errors = []
        self._finisher = None

    def _fail(self, exc: BaseException) -> None:
        with self._lock:
            self._errors.append(exc)
        self._failed.set()

    # -- fetching ----------------------------------------------------------------------
    def _fetch_part(self, job: _FileJob, index: int, seq: int) -> None:
        if self._failed.is_set():
            return
        start, end = job.parts[index]
        try:
            fd = job.open()
            buf = self.pool.get(seq, self._failed)
            with job.lock:
                job.buffers[index] = buf
            view = memoryview(buf)

            def on_data(offset: int, data: memoryview) -> None:
                if self._failed.is_set():
                    raise _Abort()
                if not job.direct:
                    _pwrite_all(fd, data, offset, job.dest)
                with job.lock:
                    job.received[index] = offset + len(data)
                self._drain(job)

            self.source.fetch(job.entry, start, end, view[:end - start], on_data)
            if job.received[index] != end:
                where = self.source.where(job.entry["path"])
                raise SyncError(f"short read of {where}: bytes {job.received[index]}-{end - 1} "
                                "missing")
            if job.direct:
                _pwrite_direct(fd, view, start, end - start, job.dest)
            with self._lock:
                self.bytes_written += end - start
            if job.direct:
                with job.lock:
                    free = job.release(index)
                    job.pending -= 1
                    finish = job.pending == 0
                if free is not None:
                    self.pool.put(free)
                if finish:
                    self._finisher.submit(self._finish, job)
            self._drain(job)
        except _Abort:
            pass
        except BaseException as exc:  # noqa: B036 - re-raised in the caller's thread
            self._fail(exc)

    # -- hashing -----------------------------------------------------------------------
    def _drain(self, job: _FileJob) -> None:
        """Hash whatever bytes are ready at the file's hash position, in order."""
        while job.drain_lock.acquire(blocking=False):
            finish = False
            try:
                while True:
                    with job.lock:
                        if job.hashed >= job.size:
                            break
                        index = job.hashed // self.part_size
                        start, end = job.parts[index]
                        ready = job.received[index]
                        buf = job.buffers[index]
                    if ready <= job.hashed:
                        break
                    job.sha.update(memoryview(buf)[job.hashed - start:ready - start])
                    free = None
                    with job.lock:
                        job.hashed = ready
                        if ready == end:
                            free = job.release(index)
                            if ready == job.size:
                                job.pending -= 1
                                finish = job.pending == 0
                    if free is not None:
                        self.pool.put(free)
            finally:
                job.drain_lock.release()
            if finish:
                self._finisher.submit(self._finish, job)
            if job.hashed >= job.size:
                return
            # Bytes may have arrived while the lock was being released: look again.
            with job.lock:
                index = job.hashed // self.part_size
                if job.received[index] <= job.hashed:
                    return

    def _finish(self, job: _FileJob) -> None:
        try:
            where = self.source.where(job.entry["path"])
            if job.hashed != job.size:
                raise SyncError(f"size mismatch for {where}: got {job.hashed} bytes, the "
                                f"manifest says {job.size}")
            digest = job.sha.hexdigest()
            if digest != job.entry["sha256"]:
                raise SyncError(f"checksum mismatch for {where}: the manifest says sha256 "
                                f"{job.entry['sha256']}, the bytes received hash to {digest}")
            fd = job.open()
            if job.direct:
                os.ftruncate(fd, job.size)  # the last block was written padded
            os.fsync(fd)
            job.close()
            job.verified = True
            with self._lock:
                self.bytes_hashed += job.size
        except OSError as exc:
            self._fail(_os_error(exc, "write", job.dest))
        except BaseException as exc:  # noqa: B036 - re-raised in the caller's thread
            self._fail(exc)

    @staticmethod
    def _order(file_jobs: list) -> list:
        """(job, part index) in fetch order: file after file.

        Files then complete one after another, and each one's fsync overlaps the
        download of the next instead of all of them piling up at the end.
        """
        return [(j, i) for j in file_jobs if j.size for i in range(len(j.parts))]

    def run(self, jobs: list) -> None:
        """Fetch every (entry, dest) pair; raises the first failure after all threads stop."""
        file_jobs = [_FileJob(entry, dest, self.part_size, self.direct_io)
                     for entry, dest in jobs]
        try:
            with ThreadPoolExecutor(2, "model-sync-fsync") as finisher:
                self._finisher = finisher
                for job in file_jobs:
                    if job.size == 0:
                        job.want_direct = False
                        finisher.submit(self._finish, job)
                with ThreadPoolExecutor(self.concurrency, "model-sync-get") as fetchers:
                    for seq, (job, index) in enumerate(self._order(file_jobs)):
                        fetchers.submit(self._fetch_part, job, index, seq)
        except BaseException as exc:  # noqa: B036
            self._fail(exc)
        finally:
            self._finisher = None
            for job in file_jobs:
                job.close()
            self.pool.close()
        if self._errors:
            real = [e for e in self._errors if not isinstance(e, _Abort)]
            raise (real or self._errors)[0]
        unfinished = [j.entry["path"] for j in file_jobs if not j.verified]
        if unfinished:
            raise SyncError(f"internal error: {unfinished[0]} was not verified")


def _pwrite_all(fd: int, data: memoryview, offset: int, dest: str) -> None:
    try:
        while len(data):
            n = os.pwrite(fd, data, offset)
            data = data[n:]
            offset += n
    except OSError as exc:
        raise _os_error(exc, "write", dest) from None


def _pwrite_direct(fd: int, view: memoryview, offset: int, length: int, dest: str) -> None:
    """Write one part with O_DIRECT: whole blocks, the last one zero-padded."""
    padded = -(-length // DIRECT_ALIGN) * DIRECT_ALIGN
    if padded != length:
        view[length:padded] = bytes(padded - length)
    try:
        done = os.pwrite(fd, view[:padded], offset)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            raise SyncError(f"cannot write {dest} with O_DIRECT ({exc.strerror}): this "
                            "filesystem refuses aligned direct writes; set direct_io: false "
                            "(model_sync_direct_io)") from None
        raise _os_error(exc, "write", dest) from None
    if done != padded:
        raise SyncError(f"short write to {dest}: {done} of {padded} bytes at {offset}")


def _create_exclusive(path: str, direct: bool = False) -> tuple:
    """(descriptor, whether it is O_DIRECT) of a new file, mode 0600."""
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    o_direct = getattr(os, "O_DIRECT", 0) if direct else 0
    try:
        if o_direct:
            try:
                return os.open(path, flags | o_direct, 0o600), True
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                # The filesystem has no O_DIRECT (tmpfs, some FUSE): the file may exist now.
                return os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0),
                               0o600), False
        return os.open(path, flags, 0o600), False
    except OSError as exc:
        raise _os_error(exc, "create", path) from None


def _os_error(exc: OSError, action: str, path: str) -> SyncError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return SyncError(f"disk full: cannot {action} {path} ({exc.strerror})")
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return SyncError(f"permission denied: cannot {action} {path} ({exc.strerror})")
    return SyncError(f"cannot {action} {path}: {exc.strerror or exc}")


# ---------------------------------------------------------------------------------------
# The cache
# ---------------------------------------------------------------------------------------
def _read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return ""


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_file(path: str, text: str, mode: int = 0o644) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0),
                 mode)
    try:
        data = text.encode("utf-8")
        while data:
            data = data[os.write(fd, data):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(path, mode)


def _remove_tree(path: str) -> None:
    if os.path.islink(path) or os.path.isfile(path):
        os.unlink(path)
    elif os.path.isdir(path):
        shutil.rmtree(path)


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
        """Remove a version: a folder disappears at once (renamed aside, then deleted)."""
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
        }
        self.warnings = []
        self.diff = {}
        self._tmp = ""

    def _make_source(self):
        p = self.p
        if p.get("source", "s3") == "path":
            if not p.get("path_source"):
                raise SyncError("source=path needs path_source")
            return PathSource(p["path_source"], self.name, self.version)
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
        self.result["changed"] = ((not complete) or (activate and previous != self.version)
                                  or bool(prune))
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
            self.result["in_place"] = os.path.islink(cache.version_path(self.version))
            self.result["pruned"] = self._prune() if activate else []
            self.result["changed"] = changed or bool(self.result["pruned"])
        finally:
            cache.unlock()

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
            transfer = Transfer(self.source, int(self.p.get("concurrency") or 8),
                                int(self.p.get("part_size_mb") or 16) * MiB,
                                direct_io=direct_io)
            transfer.run([(e, self._dest(e)) for e in fetch])
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
            _write_file(os.path.join(self._tmp, MANIFEST_FILE), dumps(manifest))
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
            cache.clean_leftovers()
        finally:
            if self._tmp:
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
                size, digest = hash_file(path)
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
ARGUMENT_SPEC = dict(
    name=dict(type="str", required=True),
    version=dict(type="str", required=True),
    cache_root=dict(type="path", required=True),
    source=dict(type="str", choices=["s3", "path"], default="s3"),
    s3_endpoint=dict(type="str", fallback=(env_fallback, ["AWS_ENDPOINT_URL"])),
    s3_bucket=dict(type="str"),
    s3_prefix=dict(type="str", default=""),
    access_key=dict(type="str", default="", no_log=True,
                    fallback=(env_fallback, ["AWS_ACCESS_KEY_ID"])),
    secret_key=dict(type="str", default="", no_log=True,
                    fallback=(env_fallback, ["AWS_SECRET_ACCESS_KEY"])),
    session_token=dict(type="str", default="", no_log=True,
                       fallback=(env_fallback, ["AWS_SESSION_TOKEN"])),
    region=dict(type="str", default="us-east-1"),
    validate_certs=dict(type="bool", default=True),
    ca_bundle=dict(type="path"),
    path_source=dict(type="path"),
    use_in_place=dict(type="bool", default=False),
    manifest_digest=dict(type="str"),
    keep_versions=dict(type="int", default=2),
    activate=dict(type="bool", default=True),
    concurrency=dict(type="int", default=8),
    part_size_mb=dict(type="int", default=16),
    direct_io=dict(type="bool", default=True),
    min_free_mb=dict(type="int", default=0),
    timeout=dict(type="int", default=60),
    lock_timeout=dict(type="int", default=3600),
    owner=dict(type="str"),
    group=dict(type="str"),
    file_mode=dict(type="str", default="0644"),
    dir_mode=dict(type="str", default="0755"),
    allow_remote_cache=dict(type="bool", default=False),
)


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    params = dict(module.params)
    for key in ("concurrency", "part_size_mb"):
        if params[key] < 1:
            module.fail_json(msg=f"{key} must be at least 1, got {params[key]}")
    for key in ("keep_versions", "min_free_mb"):
        if params[key] < 0:
            module.fail_json(msg=f"{key} must not be negative, got {params[key]}")
    started = time.monotonic()
    syncer = None
    try:
        syncer = Syncer(params, check_mode=module.check_mode)
        result = syncer.run()
    except (SyncError, ManifestError, S3Error) as exc:
        _fail(module, syncer, str(exc), started)
    except OSError as exc:
        where = exc.filename or params["cache_root"]
        _fail(module, syncer, str(_os_error(exc, "write", where)), started,
              traceback.format_exc())
    except Exception as exc:  # an unexpected bug: keep the trace for the report
        _fail(module, syncer, f"model_sync failed unexpectedly: {exc}", started,
              traceback.format_exc())
    for warning in syncer.warnings:
        module.warn(warning)
    if module._diff and result["changed"]:
        module.exit_json(diff=syncer.diff, **result)
    module.exit_json(**result)


def _fail(module, syncer, msg: str, started: float, trace: str = None) -> None:
    current = syncer.cache.current_version() if syncer else ""
    where = syncer.cache.current_link if syncer else ""
    if current:
        msg += f"; nothing changed: {where} still points to {current}"
    else:
        msg += "; nothing changed"
    extra = {"seconds": round(time.monotonic() - started, 3)}
    if trace:
        extra["exception"] = trace
    module.fail_json(msg=msg, **extra)


if __name__ == "__main__":
    main()
