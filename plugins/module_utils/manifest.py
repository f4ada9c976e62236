# Copyright: inferfleet contributors
# Apache License 2.0 (see pyproject.toml)
"""The model manifest: one definition, shared by the CLI and the node-side module.

A version of a model is a folder of files plus ``manifest.json``::

    {
      "digest": "sha256:<hex of the canonical form below>",
      "files": [
        {"path": "config.json", "sha256": "<hex>", "size": 662},
        {"path": "model-00001-of-00002.safetensors", "sha256": "<hex>", "size": 4976}
      ],
      "format_version": 1,
      "name": "tiny-llama",
      "version": "v1"
    }

* ``files`` holds every file of the version (``manifest.json`` itself excluded),
  sorted by ``path``; ``path`` is relative, ``/``-separated, and no segment is empty,
  ``.``, ``..`` or hidden (starts with a dot: dot-names are reserved for inferfleet's
  own bookkeeping inside a version folder).
* ``digest`` is ``sha256:`` + the SHA-256 of the *canonical form*: the manifest
  without its ``digest`` key, serialised as JSON with sorted keys, no whitespace
  (``separators=(",", ":")``), non-ASCII characters kept, encoded as UTF-8.
  Two manifests with the same content have the same digest, so nodes can compare
  one string to know they hold the same weights.
* The file on disk / in the bucket is ``dumps(manifest)``: the same object with
  sorted keys, two-space indent and a trailing newline.
  ``tests/fixtures/manifest-vector`` pins the exact bytes.
* Format 2 (what ``inferfleet model publish`` writes) adds ``piece_size`` (bytes, a
  multiple of 1 MiB) and, on every file larger than one piece, ``pieces``: the SHA-256
  of each ``piece_size`` slice of the file, in order (the last one may be shorter). A
  file of one piece has its ``sha256`` as its piece hash. Nodes that fetch pieces from
  each other check every piece against these before they use or serve it. Format 1
  (no pieces) is still read.

Standard library only, Python 3.8+: the model_sync module ships this file to nodes,
and the CLI (`inferfleet model publish`) imports it from the collection.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from concurrent.futures import ThreadPoolExecutor

FORMAT_VERSION = 2  # what build() writes when given a piece size; 1 is still read
READABLE_FORMATS = (1, 2)
PIECE_SIZE = 16 * 1024 * 1024  # what `inferfleet model publish` uses
_PIECE_UNIT = 1024 * 1024
MANIFEST_FILE = "manifest.json"
DIGEST_PREFIX = "sha256:"
HASH_CHUNK = 4 * 1024 * 1024

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$")
_HEX64_RE = re.compile(r"^[0-9a-f]{64}$")
_RESERVED_VERSIONS = ("current",)


class ManifestError(ValueError):
    """A manifest, or a folder to describe, that breaks the format's rules."""


def check_name(value: object, what: str = "name") -> str:
    """A model name or version: 1-128 chars of letters, digits and ``._+-``."""
    if not isinstance(value, str) or not _NAME_RE.match(value):
        raise ManifestError(
            f"invalid model {what} {value!r}: use 1-128 letters, digits, '.', '_', '+' or '-', "
            "starting with a letter or digit")
    if what == "version" and value in _RESERVED_VERSIONS:
        raise ManifestError(f"invalid model version {value!r}: the name is reserved")
    return value


def check_path(path: object) -> str:
    """A file path inside a version: relative, '/'-separated, no hidden/empty/.. parts."""
    if not isinstance(path, str) or not path:
        raise ManifestError(f"invalid file path {path!r}: must be a non-empty string")
    if "\\" in path or "\x00" in path or path.startswith("/"):
        raise ManifestError(f"invalid file path {path!r}: must be relative and use '/'")
    for part in path.split("/"):
        if not part or part in (".", ".."):
            raise ManifestError(f"invalid file path {path!r}: empty, '.' or '..' segment")
        if part.startswith("."):
            raise ManifestError(f"invalid file path {path!r}: hidden segments are reserved")
    if path == MANIFEST_FILE:
        raise ManifestError(f"invalid file path {path!r}: reserved for the manifest")
    return path


def file_entry(path: str, size: int, sha256: str, pieces=None, piece_size: int = 0) -> dict:
    """One element of ``files``, checked; with a piece size (format 2), ``pieces`` must
    hold one hash per piece when the file is larger than one piece, and be None otherwise."""
    check_path(path)
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ManifestError(f"invalid size {size!r} for {path}")
    if not isinstance(sha256, str) or not _HEX64_RE.match(sha256):
        raise ManifestError(f"invalid sha256 {sha256!r} for {path}: 64 lowercase hex digits")
    entry = {"path": path, "size": size, "sha256": sha256}
    if piece_size and size > piece_size:
        count = -(-size // piece_size)
        if not isinstance(pieces, list) or len(pieces) != count:
            raise ManifestError(f"{path} needs {count} piece hashes ({size} bytes in pieces of "
                                f"{piece_size}), the manifest has "
                                f"{len(pieces) if isinstance(pieces, list) else 'none'}")
        for h in pieces:
            if not isinstance(h, str) or not _HEX64_RE.match(h):
                raise ManifestError(f"invalid piece hash {h!r} for {path}: 64 lowercase hex "
                                    "digits")
        entry["pieces"] = list(pieces)
    elif pieces is not None:
        raise ManifestError(f"{path} has piece hashes but is not larger than one piece "
                            f"({size} bytes, piece_size {piece_size or 'none'})")
    return entry


def check_piece_size(value: object) -> int:
    if (isinstance(value, bool) or not isinstance(value, int) or value < _PIECE_UNIT
            or value % _PIECE_UNIT):
        raise ManifestError(f"invalid piece_size {value!r}: a multiple of 1 MiB (1048576), "
                            "at least 1 MiB")
    return value


def piece_hashes(manifest: dict, entry: dict):
    """The SHA-256 of each piece of a file, in order; None for a format 1 manifest."""
    if "piece_size" not in manifest:
        return None
    if "pieces" in entry:
        return entry["pieces"]
    return [entry["sha256"]] if entry["size"] else []


def canonical_bytes(manifest: dict) -> bytes:
    """The bytes the digest is computed over: the manifest without ``digest``."""
    body = {k: v for k, v in manifest.items() if k != "digest"}
    return json.dumps(body, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False).encode("utf-8")


def compute_digest(manifest: dict) -> str:
    return DIGEST_PREFIX + hashlib.sha256(canonical_bytes(manifest)).hexdigest()


def piece_table(manifest: dict) -> list:
    """Every piece of a format 2 manifest as (path, start, end, sha256), numbered in this
    list's order: file after file, by path, each from its first byte (empty files have
    none). Peers name pieces by this number."""
    size = manifest["piece_size"]
    table = []
    for entry in manifest["files"]:
        for i, digest in enumerate(piece_hashes(manifest, entry)):
            table.append((entry["path"], i * size, min((i + 1) * size, entry["size"]), digest))
    return table


def pieces_hex(indexes, count: int) -> str:
    """A set of piece numbers (of ``count``) as a hex bitfield, piece 0 the highest bit of
    the first byte: how peers tell each other which pieces they hold."""
    field = bytearray((count + 7) // 8)
    for i in indexes:
        field[i // 8] |= 0x80 >> (i % 8)
    return field.hex()


def hex_has(field: str, index: int) -> bool:
    """Whether a hex bitfield of pieces_hex() holds piece ``index``."""
    byte = index // 8
    if byte * 2 + 2 > len(field):
        return False
    return bool(int(field[byte * 2:byte * 2 + 2], 16) & (0x80 >> (index % 8)))


def peer_state_file(version: str) -> str:
    """The file, in a model's cache folder, that says what a node offers its peers of a
    version (written by model_sync, read by the role's peer server)."""
    return f".peer-{check_name(version, 'version')}.json"


def build(name: str, version: str, files: list, piece_size: int = 0) -> dict:
    """A complete manifest (digest included) from entries of path, size, sha256; with a
    piece size, format 2 (the entries larger than one piece carry their ``pieces``)."""
    if piece_size:
        check_piece_size(piece_size)
    entries = [file_entry(f["path"], f["size"], f["sha256"], f.get("pieces"), piece_size)
               for f in files]
    entries.sort(key=lambda e: e["path"])
    _check_layout([e["path"] for e in entries])
    manifest = {
        "format_version": FORMAT_VERSION if piece_size else 1,
        "name": check_name(name, "name"),
        "version": check_name(version, "version"),
        "files": entries,
    }
    if piece_size:
        manifest["piece_size"] = piece_size
    manifest["digest"] = compute_digest(manifest)
    return manifest


def _check_layout(paths: list) -> None:
    """Sorted, unique, and no path is both a file and a folder of another path."""
    seen = set()
    for i, path in enumerate(paths):
        if i and paths[i - 1] >= path:
            if paths[i - 1] == path:
                raise ManifestError(f"duplicate file path {path!r}")
            raise ManifestError(f"files are not sorted by path at {path!r}")
        seen.add(path)
    for path in paths:
        parts = path.split("/")
        for n in range(1, len(parts)):
            if "/".join(parts[:n]) in seen:
                folder = "/".join(parts[:n])
                raise ManifestError(f"path {folder!r} is both a file and a folder")


def dumps(manifest: dict) -> str:
    """The exact text of ``manifest.json``."""
    return json.dumps(manifest, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def loads(text) -> dict:
    """Parse and check a manifest; raises ManifestError with what is wrong."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ManifestError(f"manifest is not UTF-8: {exc}") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ManifestError(f"manifest is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ManifestError("manifest must be a JSON object")
    fmt = data.get("format_version")
    if isinstance(fmt, bool) or fmt not in READABLE_FORMATS:
        raise ManifestError(f"manifest format_version {fmt!r} is not supported (this code "
                            f"reads {', '.join(map(str, READABLE_FORMATS))})")
    expected = {"format_version", "name", "version", "files", "digest"}
    if fmt == 2:
        expected.add("piece_size")
    if set(data) != expected:
        missing = sorted(expected - set(data))
        extra = sorted(set(data) - expected)
        raise ManifestError(
            f"manifest keys differ from format {fmt}: missing {missing}, unknown {extra}")
    piece_size = check_piece_size(data["piece_size"]) if fmt == 2 else 0
    check_name(data["name"], "name")
    check_name(data["version"], "version")
    if not isinstance(data["files"], list):
        raise ManifestError("manifest 'files' must be a list")
    allowed = ({"path", "size", "sha256"}, {"path", "size", "sha256", "pieces"})
    for f in data["files"]:
        if not isinstance(f, dict) or set(f) not in allowed[:fmt]:
            raise ManifestError(f"manifest file entry {f!r} must have exactly path, size, "
                                f"sha256{' (and pieces, when larger than a piece)' * (fmt - 1)}")
        file_entry(f["path"], f["size"], f["sha256"], f.get("pieces"), piece_size)
    _check_layout([f["path"] for f in data["files"]])
    actual = compute_digest(data)
    if data["digest"] != actual:
        raise ManifestError(
            f"manifest digest {data['digest']!r} does not match its content ({actual})")
    return data


def total_size(manifest: dict) -> int:
    return sum(f["size"] for f in manifest["files"])


def hash_file(path: str, chunk: int = HASH_CHUNK, piece_size: int = 0) -> tuple:
    """(size, sha256 hex, piece hashes) of a file, read once; the piece hashes (one per
    ``piece_size`` slice) only with a piece size and a file larger than one piece, else
    None."""
    h = hashlib.sha256()
    pieces = []
    piece = hashlib.sha256()
    in_piece = 0
    size = 0
    buf = bytearray(chunk)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(buf)
            if not n:
                break
            h.update(view[:n])
            size += n
            at = 0
            while piece_size and at < n:
                take = min(n - at, piece_size - in_piece)
                piece.update(view[at:at + take])
                at += take
                in_piece += take
                if in_piece == piece_size:
                    pieces.append(piece.hexdigest())
                    piece, in_piece = hashlib.sha256(), 0
    if in_piece:
        pieces.append(piece.hexdigest())
    return size, h.hexdigest(), (pieces if piece_size and size > piece_size else None)


def list_files(root: str) -> list:
    """Relative paths of the regular files under root that a manifest describes.

    Hidden files and folders (``.git``, ``.cache``, ...) and a top-level
    ``manifest.json`` are left out. Symlinks to files are followed (a Hugging Face
    snapshot is made of them); a symlink to a folder is refused.
    """
    if not os.path.isdir(root):
        raise ManifestError(f"{root} is not a folder")
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        rel_dir = "" if rel_dir == "." else rel_dir.replace(os.sep, "/") + "/"
        keep = []
        for d in sorted(dirnames):
            if d.startswith("."):
                continue
            if os.path.islink(os.path.join(dirpath, d)):
                raise ManifestError(f"{rel_dir}{d} is a symlink to a folder: not supported")
            keep.append(d)
        dirnames[:] = keep
        for name in filenames:
            if name.startswith("."):
                continue
            rel = rel_dir + name
            if rel == MANIFEST_FILE:
                continue
            full = os.path.join(dirpath, name)
            try:
                mode = os.stat(full).st_mode
            except OSError as exc:
                raise ManifestError(f"cannot read {full}: {exc.strerror}") from None
            if not stat.S_ISREG(mode):
                raise ManifestError(f"{full} is not a regular file")
            found.append(check_path(rel))
    found.sort()
    return found


def scan(root: str, name: str, version: str, workers: int = 0, piece_size: int = 0) -> dict:
    """The manifest of a local folder, hashing files in parallel; with a piece size, in
    format 2 (piece hashes)."""
    check_name(name, "name")
    check_name(version, "version")
    if piece_size:
        check_piece_size(piece_size)
    paths = list_files(root)
    workers = workers or min(8, os.cpu_count() or 2)

    def one(rel: str) -> dict:
        size, digest, pieces = hash_file(os.path.join(root, *rel.split("/")),
                                         piece_size=piece_size)
        entry = {"path": rel, "size": size, "sha256": digest}
        if pieces is not None:
            entry["pieces"] = pieces
        return entry

    if workers > 1 and len(paths) > 1:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            files = list(pool.map(one, paths))
    else:
        files = [one(p) for p in paths]
    return build(name, version, files, piece_size)


def compare(old, new: dict) -> dict:
    """Paths added, changed (other size or hash), removed and unchanged from old to new."""
    before = {f["path"]: f for f in (old or {}).get("files", [])}
    after = {f["path"]: f for f in new["files"]}
    result = {"added": [], "changed": [], "removed": [], "unchanged": []}
    for path, f in after.items():
        prev = before.get(path)
        if prev is None:
            result["added"].append(path)
        elif prev["sha256"] != f["sha256"] or prev["size"] != f["size"]:
            result["changed"].append(path)
        else:
            result["unchanged"].append(path)
    result["removed"] = sorted(p for p in before if p not in after)
    for key in ("added", "changed", "unchanged"):
        result[key].sort()
    return result
