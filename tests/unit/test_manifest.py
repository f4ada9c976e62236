"""The manifest format: pinned by tests/fixtures/manifest-vector, plus its rules."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from ansible_collections.inferfleet.fleet.plugins.module_utils import manifest as mf

VECTOR = Path(__file__).resolve().parents[1] / "fixtures" / "manifest-vector"
VECTOR_DIGEST = "sha256:aa1c6312e58b81f7bb6819de8c61a3358f0318fd73b807474ce0289989f67fb6"
REPO = Path(__file__).resolve().parents[2]


def test_package_and_node_share_one_definition():
    """The CLI publishes with the collection's module_utils, the one model_sync ships."""
    from inferfleet import publish

    assert not (REPO / "src" / "inferfleet" / "manifest.py").exists()
    assert publish.scan is mf.scan
    assert Path(mf.__file__).resolve() == REPO / "plugins" / "module_utils" / "manifest.py"


def test_vector_manifest_is_reproduced_byte_for_byte():
    built = mf.scan(str(VECTOR / "model"), "tiny-vector", "v1")
    assert mf.dumps(built) == (VECTOR / "manifest.json").read_text(encoding="utf-8")
    assert built["digest"] == VECTOR_DIGEST
    assert (VECTOR / "digest.txt").read_text().strip() == VECTOR_DIGEST


def test_vector_digest_matches_an_independent_canonical_form():
    data = json.loads((VECTOR / "manifest.json").read_text(encoding="utf-8"))
    entries = ",".join(
        f'{{"path":"{f["path"]}","sha256":"{f["sha256"]}","size":{f["size"]}}}'
        for f in data["files"]
    )
    canonical = ('{"files":[' + entries + '],"format_version":1,"name":"tiny-vector",'
                 '"version":"v1"}')
    assert "sha256:" + hashlib.sha256(canonical.encode()).hexdigest() == VECTOR_DIGEST
    assert mf.canonical_bytes(data) == canonical.encode()


def test_vector_file_hashes_are_plain_sha256_of_the_bytes():
    data = mf.loads((VECTOR / "manifest.json").read_bytes())
    for f in data["files"]:
        raw = (VECTOR / "model" / f["path"]).read_bytes()
        assert f["size"] == len(raw)
        assert f["sha256"] == hashlib.sha256(raw).hexdigest()


def test_loads_round_trips_and_rejects_a_wrong_digest():
    text = (VECTOR / "manifest.json").read_text()
    assert mf.loads(text)["digest"] == VECTOR_DIGEST
    tampered = json.loads(text)
    tampered["files"][0]["size"] += 1
    with pytest.raises(mf.ManifestError, match="does not match its content"):
        mf.loads(json.dumps(tampered))


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(format_version=3), "not supported"),
        (lambda d: d.update(format_version=True), "not supported"),
        (lambda d: d.update(piece_size=1 << 20), "unknown \\['piece_size'\\]"),
        (lambda d: d.pop("name"), "missing"),
        (lambda d: d.update(extra=1), "unknown"),
        (lambda d: d["files"].reverse(), "not sorted"),
        (lambda d: d["files"].append(dict(d["files"][0])), "not sorted|duplicate"),
        (lambda d: d["files"][0].update(sha256="ABC"), "64 lowercase hex"),
        (lambda d: d["files"][0].update(size=-1), "invalid size"),
        (lambda d: d["files"][0].update(size=True), "invalid size"),
        (lambda d: d["files"][0].update(path="../etc/passwd"), "'..'"),
        (lambda d: d["files"][0].update(path="/abs"), "relative"),
        (lambda d: d["files"][0].update(path="a//b"), "empty"),
        (lambda d: d["files"][0].update(path=".hidden"), "hidden"),
        (lambda d: d["files"][0].update(path="a\\b"), "relative"),
        (lambda d: d.update(version="current"), "reserved"),
        (lambda d: d.update(name="a/b"), "invalid model name"),
        (lambda d: d["files"][0].update(extra=1), "exactly path, size, sha256"),
    ],
)
def test_loads_rejects_what_breaks_the_rules(mutate, message):
    data = json.loads((VECTOR / "manifest.json").read_text())
    mutate(data)
    data["digest"] = mf.compute_digest(data)  # a correct digest: the rule itself must catch it
    with pytest.raises(mf.ManifestError, match=message):
        mf.loads(json.dumps(data))


def test_loads_rejects_garbage():
    for raw in (b"\xff\xfe", b"not json", b"[]"):
        with pytest.raises(mf.ManifestError):
            mf.loads(raw)


def test_file_that_is_also_a_folder_is_refused():
    sha = "0" * 64
    with pytest.raises(mf.ManifestError, match="both a file and a folder"):
        mf.build("m", "v1", [{"path": "a", "size": 1, "sha256": sha},
                             {"path": "a/b", "size": 1, "sha256": sha}])


def test_canonical_form_keeps_non_ascii_as_utf8():
    m = mf.build("m", "v1", [{"path": "notes-café.txt", "size": 0,
                              "sha256": hashlib.sha256(b"").hexdigest()}])
    assert "café".encode() in mf.canonical_bytes(m)
    assert "café" in mf.dumps(m)
    assert m["digest"] == "sha256:" + hashlib.sha256(mf.canonical_bytes(m)).hexdigest()
    assert mf.loads(mf.dumps(m).encode("utf-8")) == m


def test_digest_depends_on_content_not_on_entry_order():
    a = {"path": "a", "size": 1, "sha256": "1" * 64}
    b = {"path": "b", "size": 2, "sha256": "2" * 64}
    assert mf.build("m", "v1", [a, b]) == mf.build("m", "v1", [b, a])
    assert mf.build("m", "v1", [a, b])["digest"] != mf.build("m", "v2", [a, b])["digest"]


def test_scan_skips_hidden_and_manifest_follows_file_links(tmp_path):
    root = tmp_path / "model"
    (root / ".cache" / "huggingface").mkdir(parents=True)
    (root / ".cache" / "huggingface" / "x").write_text("ignored")
    (root / ".gitattributes").write_text("ignored")
    (root / "manifest.json").write_text("an old manifest: ignored")
    blob = tmp_path / "blob"
    blob.write_bytes(b"weights")
    os.symlink(blob, root / "model.safetensors")
    m = mf.scan(str(root), "m", "v1")
    assert [f["path"] for f in m["files"]] == ["model.safetensors"]
    assert m["files"][0]["sha256"] == hashlib.sha256(b"weights").hexdigest()


def test_scan_refuses_folder_symlinks(tmp_path):
    root = tmp_path / "model"
    root.mkdir()
    (tmp_path / "other").mkdir()
    os.symlink(tmp_path / "other", root / "sub")
    with pytest.raises(mf.ManifestError, match="symlink to a folder"):
        mf.scan(str(root), "m", "v1")


def test_compare_reports_added_changed_removed():
    old = mf.build("m", "v1", [{"path": "a", "size": 1, "sha256": "1" * 64},
                               {"path": "b", "size": 1, "sha256": "2" * 64},
                               {"path": "gone", "size": 1, "sha256": "3" * 64}])
    new = mf.build("m", "v2", [{"path": "a", "size": 1, "sha256": "1" * 64},
                               {"path": "b", "size": 1, "sha256": "4" * 64},
                               {"path": "c", "size": 1, "sha256": "5" * 64}])
    assert mf.compare(old, new) == {"added": ["c"], "changed": ["b"], "removed": ["gone"],
                                    "unchanged": ["a"]}
    assert mf.compare(None, new)["added"] == ["a", "b", "c"]


def test_hash_file_reads_in_chunks(tmp_path):
    data = os.urandom(3 * 1024 + 7)
    (tmp_path / "f").write_bytes(data)
    assert mf.hash_file(str(tmp_path / "f"), chunk=1024) == (
        len(data), hashlib.sha256(data).hexdigest(), None)


MiB = 1024 * 1024


def _pieced_model(tmp_path) -> Path:
    """A folder with a file of 2.5 pieces of 1 MiB, one of exactly one piece, an empty one."""
    root = tmp_path / "model"
    root.mkdir()
    (root / "big.safetensors").write_bytes(os.urandom(2 * MiB + MiB // 2))
    (root / "one.bin").write_bytes(os.urandom(MiB))
    (root / "empty.txt").write_bytes(b"")
    return root


def test_format_2_holds_a_hash_per_piece_of_every_file_larger_than_a_piece(tmp_path):
    root = _pieced_model(tmp_path)
    m = mf.scan(str(root), "m", "v1", piece_size=MiB)
    assert m["format_version"] == 2 and m["piece_size"] == MiB
    files = {f["path"]: f for f in m["files"]}
    raw = (root / "big.safetensors").read_bytes()
    assert files["big.safetensors"]["pieces"] == [
        hashlib.sha256(raw[i:i + MiB]).hexdigest() for i in range(0, len(raw), MiB)]
    assert files["big.safetensors"]["sha256"] == hashlib.sha256(raw).hexdigest()
    assert "pieces" not in files["one.bin"] and "pieces" not in files["empty.txt"]
    # A file of one piece is its own piece; an empty file has none.
    assert mf.piece_hashes(m, files["one.bin"]) == [files["one.bin"]["sha256"]]
    assert mf.piece_hashes(m, files["empty.txt"]) == []
    assert mf.loads(mf.dumps(m)) == m
    # Hashing in chunks that straddle pieces gives the same pieces.
    assert mf.hash_file(str(root / "big.safetensors"), chunk=3 * MiB // 4,
                        piece_size=MiB)[2] == files["big.safetensors"]["pieces"]
    assert mf.piece_hashes(mf.scan(str(root), "m", "v1"), files["one.bin"]) is None
    # Pieces are numbered file after file; an empty file has none.
    big = files["big.safetensors"]["pieces"]
    assert mf.piece_table(m) == [("big.safetensors", 0, MiB, big[0]),
                                 ("big.safetensors", MiB, 2 * MiB, big[1]),
                                 ("big.safetensors", 2 * MiB, len(raw), big[2]),
                                 ("one.bin", 0, MiB, files["one.bin"]["sha256"])]


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.pop("piece_size"), "missing \\['piece_size'\\]"),
        (lambda d: d.update(piece_size=MiB + 1), "multiple of 1 MiB"),
        (lambda d: d.update(piece_size=0), "multiple of 1 MiB"),
        (lambda d: d["files"][0]["pieces"].pop(), "needs 3 piece hashes"),
        (lambda d: d["files"][0].pop("pieces"), "needs 3 piece hashes"),
        (lambda d: d["files"][0]["pieces"].__setitem__(0, "X"), "invalid piece hash"),
        (lambda d: d["files"][2].update(pieces=["0" * 64]), "not larger than one piece"),
        (lambda d: d["files"][0].update(other=1), "and pieces"),
    ],
)
def test_format_2_loads_rejects_what_breaks_its_rules(tmp_path, mutate, message):
    data = mf.scan(str(_pieced_model(tmp_path)), "m", "v1", piece_size=MiB)
    assert [f["path"] for f in data["files"]] == ["big.safetensors", "empty.txt", "one.bin"]
    mutate(data)
    data["digest"] = mf.compute_digest(data)
    with pytest.raises(mf.ManifestError, match=message):
        mf.loads(json.dumps(data))
