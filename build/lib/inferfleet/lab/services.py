"""The lab's shared services on a Docker network: the network itself and a SeaweedFS S3
server in a container, reachable by name from the nodes and by address from here.

Everything created carries the label `inferfleet.lab=<name>`, so `down` removes exactly
what `up` made and nothing else.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

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


def _running_on(container: str, network: str) -> bool:
    state = _docker(
        "inspect",
        "-f",
        "{{.State.Running}}{{range $net, $_ := .NetworkSettings.Networks}} {{$net}}{{end}}",
        container,
    ).split()
    return state[0] == "true" and network in state[1:]


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
    if _exists("container", container) and not _running_on(container, network):
        # Left behind stopped, or its network was removed under it: start afresh.
        _docker("rm", "--force", container)
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
            " -s3.config=/etc/s3.json -s3.port.iceberg=0 -s3.port.lance=0"
            " -volume.max=0 -master.volumeSizeLimitMB=1024",
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


def containers(name: str) -> list[tuple[str, str]]:
    """(name, status) of every container labelled for this lab."""
    out = _docker(
        "ps", "-a", "--filter", f"label={LABEL}={name}", "--format", "{{.Names}}\t{{.Status}}"
    )
    return [tuple(line.split("\t", 1)) for line in out.splitlines() if line]


def publish_tiny(
    lab: LabServices,
    bucket: str,
    prefix: str,
    name: str,
    version: str,
    seed: int,
    workdir: Path,
    broken: bool = False,
) -> bool:
    """Generate the tiny model for `seed` and publish it once (versions are immutable).
    Return whether it was published now (False: it already was).

    `broken`: a config that does not match the weights (twice the MLP width), with a
    correct manifest: it syncs and verifies, and the engine refuses to load it. This is
    what a bad conversion looks like to a rolling update."""
    from inferfleet.lab.tinymodel import generate
    from inferfleet.publish import make_client, publish

    env = lab.s3_env()
    client = make_client(
        env["AWS_ENDPOINT_URL"],
        env["AWS_ACCESS_KEY_ID"],
        env["AWS_SECRET_ACCESS_KEY"],
        env["AWS_DEFAULT_REGION"],
    )
    if bucket not in {b["Name"] for b in client.list_buckets().get("Buckets", [])}:
        client.create_bucket(Bucket=bucket)
    try:
        client.head_object(Bucket=bucket, Key=f"{prefix}/{name}/{version}/manifest.json")
        return False
    except client.exceptions.ClientError:
        pass
    model = generate(workdir / name / version, seed=seed)
    if broken:
        config = json.loads((model / "config.json").read_text())
        config["intermediate_size"] *= 2
        (model / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    publish(model, f"s3://{bucket}/{prefix}/{name}/{version}", client=client)
    return True


def main(argv: list[str] | None = None) -> None:
    """python -m inferfleet.lab.services up NAME [--publish BUCKET/PREFIX/MODEL/VERSION:SEED]
    | down NAME  (used by the molecule scenarios' prepare and cleanup steps); SEED may end
    in `:broken` (see publish_tiny)."""
    import argparse
    import tempfile

    from inferfleet.lab.image import ensure_node_image

    parser = argparse.ArgumentParser(prog="python -m inferfleet.lab.services")
    parser.add_argument("action", choices=["up", "down"])
    parser.add_argument("name")
    parser.add_argument(
        "--publish",
        action="append",
        default=[],
        metavar="BUCKET/PREFIX/MODEL/VERSION:SEED[:broken]",
    )
    args = parser.parse_args(argv)
    if args.action == "down":
        print("\n".join(down(args.name)))
        return
    lab = up(args.name, ensure_node_image())
    with tempfile.TemporaryDirectory() as work:
        for spec in args.publish:
            location, seed, *flags = spec.split(":")
            bucket, prefix, model, version = location.split("/")
            broken = flags == ["broken"]
            publish_tiny(lab, bucket, prefix, model, version, int(seed), Path(work), broken)
    print(json.dumps(asdict(lab), indent=2))


if __name__ == "__main__":
    main()
