"""Shared fixtures: the repository root and, for tests that need the lab, the node image."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

import inferfleet  # noqa: F401 (first: Ansible's collection loader, see its docstring)

ROOT = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def _exclusive(what: str):
    """One builder at a time across processes: the other waits, then finds it built."""
    lock_dir = Path.home() / ".cache" / "inferfleet"
    lock_dir.mkdir(parents=True, exist_ok=True)
    with open(lock_dir / f".{what}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@pytest.fixture
def free_port():
    """Gives a TCP port nothing listens on now (the kernel's pick for port 0), for a
    server the test starts on 127.0.0.1."""

    def pick() -> int:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            return probe.getsockname()[1]

    return pick


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT


@pytest.fixture
def runs_dir(tmp_path, monkeypatch):
    """The CLI's run records (and fleet locks) under this test's folder."""
    from inferfleet import runner

    monkeypatch.setattr(runner, "RUNS_DIR", tmp_path / "runs")
    return tmp_path / "runs"


@pytest.fixture(scope="session")
def node_image() -> str:
    """The lab's node image tag (built on first use); exported for molecule."""
    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        pytest.fail("no Docker engine answers: run `make setup` (scripts/ensure-docker.sh)")
    from inferfleet.lab.build import BuildError
    from inferfleet.lab.image import ensure_node_image

    with _exclusive("node-image"):  # make test runs two pytest lanes at once
        try:
            tag = ensure_node_image()
        except BuildError as err:
            pytest.fail(str(err), pytrace=False)
    os.environ["INFERFLEET_NODE_IMAGE"] = tag
    return tag


@pytest.fixture
def lab_names():
    """The lab's container names (inferfleet-lab-*) for one test at a time: `make test`'s
    lanes run the install test and the simulated fleet's at once otherwise. A lab that
    runs already (a developer's) is left alone, and the test fails saying so."""
    with _exclusive("lab"):
        running = subprocess.run(
            ["docker", "ps", "-aq", "--filter", "label=inferfleet.lab=inferfleet-lab"],
            capture_output=True, text=True, check=True,
        ).stdout.split()
        if running:
            pytest.fail(f"a lab runs here ({len(running)} containers): the test needs its "
                        "names; take it down with `inferfleet lab down`", pytrace=False)
        yield


@pytest.fixture(scope="session")
def venv_bin() -> Path:
    """The virtualenv's bin folder, first on PATH for tools run by the tests."""
    bin_dir = ROOT / ".venv" / "bin"
    if not (bin_dir / "ansible-playbook").exists():
        found = shutil.which("ansible-playbook")
        assert found, "ansible-playbook is missing: run `make setup`"
        bin_dir = Path(found).parent
    os.environ["PATH"] = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
    return bin_dir


@pytest.fixture(scope="session")
def wheelhouse() -> Path:
    """vLLM's CPU build and its dependencies, for node containers (mounted read-only)."""
    from inferfleet.lab.build import BuildError
    from inferfleet.lab.wheelhouse import DEFAULT_DIR, ensure_wheelhouse

    path = Path(os.environ.get("INFERFLEET_WHEELHOUSE", DEFAULT_DIR))
    with _exclusive("wheelhouse"):
        try:
            ensure_wheelhouse(path)
        except BuildError as err:
            pytest.fail(str(err), pytrace=False)
    os.environ["INFERFLEET_WHEELHOUSE"] = str(path)
    return path


@pytest.fixture(scope="session")
def engine_image(node_image, wheelhouse) -> str:
    """The node image with vLLM's CPU build installed by the role (inferfleet.lab.image),
    for molecule's engine nodes; exported as INFERFLEET_ENGINE_IMAGE."""
    from inferfleet.lab.build import BuildError
    from inferfleet.lab.image import ensure_engine_image

    with _exclusive("engine-image"):
        try:
            tag = ensure_engine_image(node_image, wheelhouse)
        except BuildError as err:
            pytest.fail(str(err), pytrace=False)
    os.environ["INFERFLEET_ENGINE_IMAGE"] = tag
    return tag
