"""Build the lab's node image locally, with no registry.

debootstrap makes a minimal Debian 12 root, `docker import` turns it into a base image,
and a `docker build` over the recipe in image/Dockerfile adds systemd, Python and sshd.
Both tags carry a hash of what produced them, so an image is rebuilt only when its
recipe (or the host's extra CA certificates, copied in) changes.

The engine image is the node image with vLLM's CPU build already installed, by the
inference_engine role's own install tasks (image/engine.yml) from the wheelhouse, then
`docker commit`: molecule's engine nodes start from it, so each scenario does not install
the same virtualenv again on every node (about 2.5 minutes of each converge here). The
role finds its install marker and skips the install; the lab (`make demo`, the install
test) still installs on plain nodes, and so proves that path. Its tag hashes the node
image's tag, the role's install files and the wheelhouse's pins.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from inferfleet.lab.build import BuildError, run_step
from inferfleet.paths import COLLECTION

RECIPE_DIR = Path(__file__).parent / "image"
HOST_CA_DIR = Path("/usr/local/share/ca-certificates")
SUITE = "bookworm"
BASE_PACKAGES = "python3,ca-certificates"
BASE_REPO = "inferfleet-base"
NODE_REPO = "inferfleet-node"
ENGINE_REPO = "inferfleet-node-engine"
ENGINE_PLAYBOOK = RECIPE_DIR / "engine.yml"
# What the engine's install is: the role's install tasks, what they read and run.
ENGINE_INPUTS = [
    "roles/inference_engine/tasks/install.yml",
    "roles/inference_engine/tasks/install-venv.yml",
    "roles/inference_engine/vars/main.yml",
    "roles/inference_engine/defaults/main.yml",
    "roles/inference_engine/files/requirements_of.py",
    "roles/package_lists/tasks/main.yml",
    "roles/package_lists/tasks/installed.yml",
    "roles/package_lists/tasks/missing.yml",
    "roles/package_lists/tasks/install-missing.yml",
]
ENGINE_WHEELHOUSE = "/opt/inferfleet/wheelhouse"  # where molecule mounts it, too


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


def engine_tag(node: str, wheelhouse: Path, collection: Path = COLLECTION) -> str:
    from inferfleet.lab.wheelhouse import MARKER

    if not (wheelhouse / MARKER).is_file():
        raise BuildError(f"cannot build the engine image: {wheelhouse} is not a complete "
                         "wheelhouse; run `python -m inferfleet.lab.wheelhouse` first")
    parts = [node.encode(), ENGINE_PLAYBOOK.read_bytes(), (wheelhouse / MARKER).read_bytes()]
    parts += [name.encode() + (collection / name).read_bytes() for name in ENGINE_INPUTS]
    return f"{ENGINE_REPO}:{_digest(*parts)}"


def build_engine(tag: str, node: str, wheelhouse: Path) -> None:
    """Run the role's install tasks in a container of the node image, then commit it."""
    name = "inferfleet-engine-image-build"
    subprocess.run(["docker", "rm", "-f", name], capture_output=True)
    run_step(
        ["docker", "run", "-d", "--name", name, "-v", f"{wheelhouse}:{ENGINE_WHEELHOUSE}:ro",
         node, "sleep", "infinity"],
        f"cannot build {tag}: docker run of {node}", "check that the Docker engine answers",
    )
    try:
        run_step(
            [str(Path(sys.executable).parent / "ansible-playbook"), "-i", f"{name},",
             "-c", "community.docker.docker",
             "-e", f"inference_engine_pip_find_links={ENGINE_WHEELHOUSE}", str(ENGINE_PLAYBOOK)],
            f"cannot build {tag}: the inference_engine role's install in {name}",
            f"check that the wheelhouse ({wheelhouse}) is complete (python -m "
            "inferfleet.lab.wheelhouse) and that a container reaches Debian's archive",
        )
        run_step(
            ["docker", "commit", "--change", 'CMD ["/sbin/init"]', name, tag],
            f"cannot build {tag}: docker commit", "check the Docker engine's free disk space",
        )
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)


def ensure_engine_image(node: str, wheelhouse: Path, log=print) -> str:
    """Return the engine image's tag (the node image `node` with vLLM installed from
    `wheelhouse`), building it when missing."""
    tag = engine_tag(node, wheelhouse)
    if not image_exists(tag):
        log(f"building engine image {tag} (vLLM's CPU build installed, about 3 minutes)")
        build_engine(tag, node, wheelhouse)
    return tag


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


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
    # `python -m inferfleet.lab.image`: the node image's tag; `... engine [WHEELHOUSE]`:
    # the engine image's (molecule's INFERFLEET_ENGINE_IMAGE).
    if sys.argv[1:2] == ["engine"]:
        from inferfleet.lab.wheelhouse import DEFAULT_DIR, ensure_wheelhouse

        house = Path(sys.argv[2]) if len(sys.argv) > 2 else DEFAULT_DIR
        ensure_wheelhouse(house, log=_stderr)
        print(ensure_engine_image(ensure_node_image(log=_stderr), house, log=_stderr))
    else:
        print(ensure_node_image(log=_stderr))
