"""model_sync's transfer engine: sources (S3 with parallel ranged GETs, a local
path), the buffer pool, per-file jobs that hash while they write, and the helpers
they share. Standard library only; shipped to nodes with the model_sync module."""

from __future__ import annotations

import errno
import hashlib
import mmap
import os
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor

from ansible_collections.inferfleet.fleet.plugins.module_utils.manifest import (
    MANIFEST_FILE,
    PIECE_SIZE,
    ManifestError,
    dumps,
    scan,
)
from ansible_collections.inferfleet.fleet.plugins.module_utils.s3 import S3Client

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


class FolderSource(PathSource):
    """A folder this node made itself (no manifest): its files are hashed into a format 2
    manifest, then read and checked like a path source's. Nothing vouches for what the
    folder holds: for a node's own output only (vLLM's compile cache, docs/engine.md)."""

    kind = "folder"

    def __init__(self, folder: str, name: str, version: str):
        self.root = folder
        self.name = name
        self.version = version

    def read_manifest(self) -> bytes:
        try:
            return dumps(scan(self.root, self.name, self.version, piece_size=PIECE_SIZE)).encode()
        except ManifestError as exc:
            raise SyncError(f"cannot publish {self.root}: {exc}") from None


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

    A source that checks every piece against the manifest's piece hashes before it
    delivers it (``verifies_pieces``: the swarm) makes the file hash redundant: every
    byte is then checked once, per piece. Such a source hears of each part once it is
    on disk (``written``), so it can offer it to others.
    """

    def __init__(self, source, concurrency: int = 8, part_size: int = 16 * MiB,
                 buffers: int = 0, direct_io: bool = True):
        self.source = source
        self.concurrency = max(1, concurrency)
        self.part_size = max(IO_CHUNK, part_size - part_size % DIRECT_ALIGN)
        self.direct_io = direct_io
        self.by_piece = bool(getattr(source, "verifies_pieces", False))
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
        if hasattr(self.source, "cancel"):
            self.source.cancel()

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
            if self.by_piece:
                self.source.written(job.entry, start, end)
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
                    if not self.by_piece:
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
            if not self.by_piece and digest != job.entry["sha256"]:
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


