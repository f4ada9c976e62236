"""Fixtures for integration tests that need a real S3 server but no lab containers."""

from __future__ import annotations

import pytest

from inferfleet.lab.s3 import SeaweedS3


@pytest.fixture(scope="session")
def seaweed_s3(tmp_path_factory):
    """One SeaweedFS server (real S3 on loopback) for the whole session."""
    server = SeaweedS3(tmp_path_factory.mktemp("seaweedfs")).start()
    yield server
    server.stop()
