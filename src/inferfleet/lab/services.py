"""The lab's shared services on a Docker network: the network itself and a SeaweedFS S3
server in a container, reachable by name from the nodes and by address from here.

Everything created carries the label `inferfleet.lab=<name>`, so `down` removes exactly
what `up` made and nothing else.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import asdict, dataclass

from inferfleet.lab.s3 import wait_for_s3, weed_binary

LABEL = "inferfleet.lab"
S3_PORT = 8333
S3_ACCESS_KEY = "inferfleet-lab"
S3_SECRET_KEY = "inferfleet-lab-secret"  # a lab-only credential, not a secret of any fleet


@dataclass
class LabServices:
    name: str
    network: str
    s3_container: str
    s3_endpoint_nodes: str  # as the node containers reach it (by name)
    s3_endpoint_host: str  # as this machine reaches it (the container's address)
    access_key: str = S3_ACCESS_KEY
    secret_key: str = S3_SECRET_KEY

    def s3_env(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.s3_endpoint_host,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": "us-east-1",
        }


def _docker(*args: str, check: bool = True) -> str:
    done = subprocess.run(["docker", *args], capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args[:2])} failed: {done.stderr.strip()}")
    return done.stdout.strip()


def _exists(kind: str, name: str) -> bool:
    return subprocess.run(["docker", kind, "inspect", name], capture_output=True).returncode == 0


def ensure_network(name: str) -> None:
    if not _exists("network", name):
        _docker("network", "create", "--label", f"{LABEL}={name}", name)


def _s3_config(access_key: str, secret_key: str) -> str:
    return json.dumps(
        {
            "identities": [
                {
                    "name": "lab",
                    "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                }
            ]
        }
    )


def ensure_s3(name: str, network: str, image: str) -> tuple[str, str]:
    """Start (or reuse) the SeaweedFS container; return (node endpoint, host endpoint)."""
    container = f"{name}-s3"
    if not _exists("container", container):
        _docker(
            "run",
            "-d",
            "--name",
            container,
            "--hostname",
            container,
            "--network",
            network,
            "--label",
            f"{LABEL}={name}",
            "-e",
            f"S3_CONFIG={_s3_config(S3_ACCESS_KEY, S3_SECRET_KEY)}",
            "-v",
            f"{weed_binary()}:/usr/local/bin/weed:ro",
            "--entrypoint",
            "/bin/sh",
            image,
            "-c",
            "mkdir -p /data && printf '%s' \"$S3_CONFIG\" > /etc/s3.json && exec weed server"
            f" -dir=/data -ip={container} -ip.bind=0.0.0.0 -s3 -s3.port={S3_PORT}"
            " -s3.config=/etc/s3.json -volume.max=0 -master.volumeSizeLimitMB=1024",
        )
    address = _docker(
        "inspect",
        "-f",
        f'{{{{(index .NetworkSettings.Networks "{network}").IPAddress}}}}',
        container,
    )
    host_endpoint = f"http://{address}:{S3_PORT}"
    wait_for_s3(host_endpoint)
    return f"http://{container}:{S3_PORT}", host_endpoint


def up(name: str, image: str) -> LabServices:
    network = name
    ensure_network(network)
    nodes, host = ensure_s3(name, network, image)
    return LabServices(
        name=name,
        network=network,
        s3_container=f"{name}-s3",
        s3_endpoint_nodes=nodes,
        s3_endpoint_host=host,
    )


def down(name: str) -> list[str]:
    """Remove every container and network labelled for this lab; return what was removed."""
    removed = []
    ids = _docker("ps", "-aq", "--filter", f"label={LABEL}={name}").split()
    if ids:
        _docker("rm", "-f", "-v", *ids)
        removed += ids
    nets = _docker("network", "ls", "-q", "--filter", f"label={LABEL}={name}").split()
    if nets:
        _docker("network", "rm", *nets)
        removed += nets
    return removed


if __name__ == "__main__":
    import sys

    from inferfleet.lab.image import ensure_node_image

    lab = sys.argv[2] if len(sys.argv) > 2 else "inferfleet-lab"
    if sys.argv[1] == "up":
        print(json.dumps(asdict(up(lab, ensure_node_image())), indent=2))
    else:
        print("\n".join(down(lab)))
