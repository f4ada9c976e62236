"""Fixtures for integration tests that need a real S3 server but no lab containers."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from inferfleet.lab.s3 import SeaweedS3


@pytest.fixture(scope="session")
def seaweed_s3(tmp_path_factory):
    """One SeaweedFS server (real S3 on loopback) for the whole session."""
    server = SeaweedS3(tmp_path_factory.mktemp("seaweedfs")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def torch_python(request, tmp_path_factory) -> Path:
    """A Python like the GPU validation machine's: PyTorch (here the CPU build from the
    lab's wheelhouse), transformers and safetensors, no Ansible. INFERFLEET_TORCH_PYTHON
    names one to use instead."""
    if os.environ.get("INFERFLEET_TORCH_PYTHON"):
        return Path(os.environ["INFERFLEET_TORCH_PYTHON"])
    wheelhouse = request.getfixturevalue("wheelhouse")
    venv = tmp_path_factory.mktemp("torch") / "python"
    subprocess.run(["python3", "-m", "venv", venv], check=True)
    subprocess.run([venv / "bin" / "pip", "install", "--quiet", "--no-index", "--find-links",
                    wheelhouse, "torch", "transformers", "safetensors"], check=True)
    return venv / "bin" / "python"
