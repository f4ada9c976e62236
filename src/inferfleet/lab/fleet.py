"""The lab's hosts: systemd containers on the lab network, named as in inventories/lab.

`create` starts what is missing (and reuses what runs), `addresses` reads their
addresses back, and `write_state` writes the generated parts of the inventory:
host_vars/ with each host's address, group_vars/all/secrets.yml (mode 0600) with keys
(and, for `lab up --tls`, the load balancer's certificate), and `ca_file` the lab's CA.
`write_models` adds the hosts of the lab's second model (`lab up --models 2`) as an
inventory source of their own, models.yml.
"""

from __future__ import annotations

import secrets
import subprocess
from pathlib import Path

import yaml

from inferfleet.lab import tls
from inferfleet.lab.services import LABEL, S3_ACCESS_KEY, S3_SECRET_KEY

SYSTEMD_FLAGS = [
    "--cap-add",
    "SYS_ADMIN",
    "--tmpfs",
    "/run",
    "--tmpfs",
    "/run/lock",
    "--tmpfs",
    "/tmp",
    "-v",
    "/sys/fs/cgroup:/sys/fs/cgroup:ro",
]
WHEELHOUSE_MOUNT = "/opt/inferfleet/wheelhouse"


# The lab's second model: its own weights (another seed), on a node of its own.
SECOND_MODEL = {"name": "tiny-coder", "version": "v1", "seed": 11, "host": "inferfleet-lab-node3"}


def inventory_hosts(inventory: Path) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for source in ("hosts.yml", "models.yml"):
        if (inventory / source).is_file():
            children = yaml.safe_load((inventory / source).read_text())["all"]["children"]
            for group, spec in children.items():
                groups.setdefault(group, []).extend((spec or {}).get("hosts") or {})
    return groups


def write_models(inventory: Path, models: int) -> None:
    """With 2 models, models.yml lists the second model's node in `inference`, serving it;
    with 1, there is no such file."""
    path = inventory / "models.yml"
    if models == 1:
        path.unlink(missing_ok=True)
        return
    node = {
        "inferfleet_model_name": SECOND_MODEL["name"],
        "inferfleet_model_version": SECOND_MODEL["version"],
    }
    path.write_text(
        "---\n# written by `inferfleet lab up --models 2`: the second model's node\n"
        + yaml.safe_dump(
            {"all": {"children": {"inference": {"hosts": {SECOND_MODEL["host"]: node}}}}}
        )
    )


def create(lab: str, network: str, image: str, hosts: list[str], wheelhouse: Path) -> None:
    for host in hosts:
        if (
            subprocess.run(["docker", "container", "inspect", host], capture_output=True).returncode
            == 0
        ):
            subprocess.run(["docker", "start", host], check=True, capture_output=True)
            continue
        subprocess.run(
            [
                "docker",
                "run",
                "-d",
                "--name",
                host,
                "--hostname",
                host,
                "--network",
                network,
                "--label",
                f"{LABEL}={lab}",
                *SYSTEMD_FLAGS,
                "--shm-size",
                "1g",
                "-v",
                f"{wheelhouse}:{WHEELHOUSE_MOUNT}:ro",
                image,
                "/sbin/init",
            ],
            check=True,
            capture_output=True,
            text=True,
        )


def address(host: str, network: str) -> str:
    fmt = f'{{{{(index .NetworkSettings.Networks "{network}").IPAddress}}}}'
    return subprocess.run(
        ["docker", "inspect", "-f", fmt, host], check=True, capture_output=True, text=True
    ).stdout.strip()


def write_state(
    inventory: Path, addresses: dict[str, str], tls_host: str | None = None
) -> dict:
    """Write host_vars and (once) the secrets file; return the secrets. With `tls_host`
    (the load balancer), the secrets hold a certificate for it from a lab CA of their own
    (kept while the lab lives), and `ca_file` that CA for clients; without, neither."""
    host_vars = inventory / "host_vars"
    host_vars.mkdir(exist_ok=True)
    for host, addr in addresses.items():
        (host_vars / f"{host}.yml").write_text(
            "---\n# written by `inferfleet lab up`\n" + yaml.safe_dump({"inferfleet_address": addr})
        )
    secrets_file = inventory / "group_vars" / "all" / "secrets.yml"
    values = yaml.safe_load(secrets_file.read_text()) if secrets_file.exists() else {
        "inferfleet_lab_api_key": "sk-lab-" + secrets.token_urlsafe(24),
        "inferfleet_lab_engine_key": "sk-engine-" + secrets.token_urlsafe(24),
        "inferfleet_lab_s3_access_key": S3_ACCESS_KEY,
        "inferfleet_lab_s3_secret_key": S3_SECRET_KEY,
    }
    if tls_host is None:
        values = {k: v for k, v in values.items() if not k.startswith("inferfleet_lab_tls_")}
        ca_file(inventory).unlink(missing_ok=True)
    elif "inferfleet_lab_tls_key" not in values:
        issued = tls.issue(tls_host, addresses[tls_host])
        values |= {f"inferfleet_lab_tls_{k}": v for k, v in issued.items()}
    if tls_host is not None:
        ca_file(inventory).write_text(values["inferfleet_lab_tls_ca"])
    secrets_file.touch(mode=0o600)
    secrets_file.chmod(0o600)
    secrets_file.write_text(
        "---\n# written by `inferfleet lab up`; never commit\n" + yaml.safe_dump(values)
    )
    return values


def remove_state(inventory: Path) -> None:
    for path in (inventory / "host_vars").glob("*.yml"):
        path.unlink()
    (inventory / "models.yml").unlink(missing_ok=True)
    (inventory / "group_vars" / "all" / "secrets.yml").unlink(missing_ok=True)
    ca_file(inventory).unlink(missing_ok=True)


def ca_file(inventory: Path) -> Path:
    """The lab CA's certificate, for clients: beside the inventory, never in it (Ansible
    reads every file of an inventory directory as a source)."""
    return inventory.with_name(f"{inventory.name}-ca.pem")


if __name__ == "__main__":
    # `python -m inferfleet.lab.fleet address HOST NETWORK`: a container's address on a
    # network, for inventories whose host names resolve only inside that network.
    import sys

    if sys.argv[1:2] != ["address"] or len(sys.argv) != 4:
        sys.exit("usage: python -m inferfleet.lab.fleet address HOST NETWORK")
    print(address(sys.argv[2], sys.argv[3]))
