"""Build the lab's node image locally, with no registry.

debootstrap makes a minimal Debian 12 root, `docker import` turns it into a base image,
and a `docker build` over the recipe in image/Dockerfile adds systemd, Python and sshd.
Both tags carry a hash of what produced them, so an image is rebuilt only when its
recipe (or the host's extra CA certificates, copied in) changes.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path

from inferfleet.lab.build import BuildError, run_step

RECIPE_DIR = Path(__file__).parent / "image"
HOST_CA_DIR = Path("/usr/local/share/ca-certificates")
SUITE = "bookworm"
BASE_PACKAGES = "python3,ca-certificates"
BASE_REPO = "inferfleet-base"
NODE_REPO = "inferfleet-node"


def _digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()[:12]


def host_ca_files() -> list[Path]:
    return sorted(HOST_CA_DIR.glob("**/*.crt")) if HOST_CA_DIR.is_dir() else []


def base_tag() -> str:
    return f"{BASE_REPO}:{SUITE}-{_digest(SUITE.encode(), BASE_PACKAGES.encode())}"


def node_tag() -> str:
    parts = [base_tag().encode(), (RECIPE_DIR / "Dockerfile").read_bytes()]
    parts += [p.name.encode() + p.read_bytes() for p in host_ca_files()]
    return f"{NODE_REPO}:{_digest(*parts)}"


def image_exists(tag: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode == 0


def build_base(tag: str) -> None:
    if shutil.which("debootstrap") is None:
        raise BuildError(
            f"cannot build {tag}: debootstrap is missing; run `make setup`, or apt-get "
            "install debootstrap"
        )
    with tempfile.TemporaryDirectory(prefix="inferfleet-rootfs-") as root:
        run_step(
            ["debootstrap", "--variant=minbase", f"--include={BASE_PACKAGES}", SUITE, root],
            f"cannot build {tag}: debootstrap {SUITE} from Debian's archive",
            "check that this machine reaches Debian's archive (apt-get update answers)",
        )
        tar = subprocess.Popen(["tar", "-C", root, "-c", "."], stdout=subprocess.PIPE)
        run_step(["docker", "import", "-", tag], f"cannot build {tag}: docker import",
                 "check that the Docker engine answers (docker info)", stdin=tar.stdout)
        if tar.wait() != 0:
            raise BuildError(f"cannot build {tag}: tar of the debootstrap root failed")


def build_node(tag: str, base: str) -> None:
    with tempfile.TemporaryDirectory(prefix="inferfleet-image-") as ctx:
        shutil.copy(RECIPE_DIR / "Dockerfile", ctx)
        ca = Path(ctx) / "ca"
        ca.mkdir()
        for cert in host_ca_files():
            shutil.copy(cert, ca / cert.name)
        run_step(
            ["docker", "build", "-q", "--build-arg", f"BASE={base}", "-t", tag, ctx],
            f"cannot build {tag}: docker build over {base}",
            "check that a container reaches Debian's archive (the host's CA certificates "
            f"in {HOST_CA_DIR} are copied in)",
        )


def ensure_node_image(log=print) -> str:
    """Return the node image's tag, building what is missing."""
    tag = node_tag()
    if image_exists(tag):
        return tag
    base = base_tag()
    if not image_exists(base):
        log(f"building base image {base} with debootstrap (about a minute)")
        build_base(base)
    log(f"building node image {tag}")
    build_node(tag, base)
    return tag


if __name__ == "__main__":
    print(ensure_node_image())
