"""The lab's hosts: systemd containers on the lab network, named as in inventories/lab.

`create` starts what is missing (and reuses what runs), `addresses` reads their
addresses back, and `write_state` writes the generated parts of the inventory:
host_vars/ with each host's address, group_vars/all/secrets.yml (mode 0600) with keys
(and, for `lab up --tls`, the load balancers' certificate), and `ca_file` the lab's CA.
`write_models` adds the hosts of the lab's second model (`lab up --models 2`) as an
inventory source of their own, models.yml; `write_nginx` a second load balancer, Nginx,
beside HAProxy (`lab up --nginx`), nginx.yml; `write_nodes` the engine nodes past the first
two and the engine they run (`lab up --nodes N --engine sim`), nodes.yml; `write_routing`
the HAProxy load balancers' routing (`lab up --routing prefix`), routing.yml;
`write_monitoring` a monitoring host (`lab up --monitoring`), monitoring.yml.
"""

from __future__ import annotations

import secrets
import subprocess
import time
from pathlib import Path

import yaml

from inferfleet.lab import tls
from inferfleet.lab.services import LABEL, S3_ACCESS_KEY, S3_SECRET_KEY
from inferfleet.paths import COLLECTION

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
# `lab up --routing cache_aware`: vllm-router's wheels, for the load balancers' routers.
ROUTER_WHEELS_MOUNT = "/opt/inferfleet/router-wheels"


# The lab's second model: its own weights (another seed), on a node of its own.
SECOND_MODEL = {"name": "tiny-coder", "version": "v1", "seed": 11, "host": "inferfleet-lab-node3"}


# `lab up --engine sim`: every engine node runs the SIMULATED engine (the inference_engine
# role's sim runtime, docs/engine.md) instead of vLLM's CPU build. The lab's other settings
# hold, the limit of 8 running sequences an engine included: each replica's capacity, not
# this machine's client, bounds what one replica serves (benchmarks/fleet_scale.py).
SIM_ENGINE_VARS = {"inference_engine_runtime": "sim"}
# ...and its one API key carries a whole fleet's load (the lab's limit is 600 a minute).
SIM_BALANCER_VARS = {"load_balancer_rate_limit_requests": 100000}
ENGINES = ("vllm", "sim")
NODES_FILE = "nodes.yml"
# `lab up --nginx`: an Nginx load balancer in front of the same engines, with the same
# keys; two endpoints without a shared address (a floating one is molecule/lb's).
NGINX_HOST = "inferfleet-lab-nginx"
NGINX_FILE = "nginx.yml"
# `lab up --monitoring`: the monitoring role's Prometheus and alert rules on a host of their
# own, scraping every engine, load balancer and router. On a simulated lab the monitoring
# host alone runs a node exporter: the nodes are containers on one machine, and each
# exporter would report that same machine.
MONITORING_HOST = "inferfleet-lab-monitor"
MONITORING_FILE = "monitoring.yml"


def node_name(index: int) -> str:
    return f"inferfleet-lab-node{index}"


def inventory_hosts(inventory: Path) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for source in ("hosts.yml", "models.yml", NGINX_FILE, NODES_FILE, MONITORING_FILE):
        if (inventory / source).is_file():
            children = yaml.safe_load((inventory / source).read_text())["all"]["children"]
            for group, spec in children.items():
                groups.setdefault(group, []).extend((spec or {}).get("hosts") or {})
    return {group: list(dict.fromkeys(hosts)) for group, hosts in groups.items()}


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


def write_nginx(inventory: Path, on: bool) -> None:
    """On, nginx.yml lists NGINX_HOST in `loadbalancers` (kind nginx) and says that the
    lab's load balancers share no address; off, there is no such file."""
    path = inventory / NGINX_FILE
    if not on:
        path.unlink(missing_ok=True)
        return
    hosts = {lb: {"load_balancer_ha": "none"} for lb in _own_balancers(inventory)}
    hosts[NGINX_HOST] = {"load_balancer_kind": "nginx", "load_balancer_ha": "none"}
    path.write_text(
        "---\n# written by `inferfleet lab up --nginx`: a second load balancer, Nginx\n"
        + yaml.safe_dump({"all": {"children": {"loadbalancers": {"hosts": hosts}}}})
    )


def write_monitoring(inventory: Path, on: bool, engine: str) -> None:
    """On, monitoring.yml lists MONITORING_HOST in `monitoring` and binds each load
    balancer's admin address (its metrics) to its name on the lab network, where
    Prometheus reaches it; for `sim`, only the monitoring host runs a node exporter. Off,
    there is no such file. Call it after write_nginx (it names every load balancer)."""
    path = inventory / MONITORING_FILE
    if not on:
        path.unlink(missing_ok=True)
        return
    children: dict = {
        "monitoring": {"hosts": {MONITORING_HOST: None}},
        "loadbalancers": {"hosts": {lb: {"load_balancer_admin_address": lb}
                                    for lb in balancers(inventory)}},
    }
    if engine == "sim":
        off = {"monitoring_node_exporter_enabled": False}
        children["inference"] = {"vars": dict(off)}
        children["loadbalancers"]["vars"] = dict(off)
    path.write_text(
        "---\n# written by `inferfleet lab up --monitoring`: Prometheus and the fleet's alerts\n"
        + yaml.safe_dump({"all": {"children": children}})
    )


def has_monitoring(inventory: Path) -> bool:
    return (inventory / MONITORING_FILE).is_file()


# The load balancer role's own list (its argument spec).
ROUTINGS = tuple(yaml.safe_load(
    (COLLECTION / "roles" / "load_balancer" / "meta" / "argument_specs.yml").read_text()
)["argument_specs"]["main"]["options"]["load_balancer_routing"]["choices"])
ROUTING_FILE = "routing.yml"


def write_routing(inventory: Path, routing: str) -> None:
    """routing.yml: the lab's HAProxy hosts with load_balancer_routing (Nginx keeps
    leastconn: it has no prefix routing); with leastconn, the role's default, no such file."""
    path = inventory / ROUTING_FILE
    if routing == "leastconn":
        path.unlink(missing_ok=True)
        return
    settings: dict = {"load_balancer_routing": routing}
    if routing == "cache_aware":  # the router installs from the wheels `lab up` mounts
        settings["load_balancer_router_pip_find_links"] = ROUTER_WHEELS_MOUNT
    hosts = {lb: dict(settings) for lb in _own_balancers(inventory)}
    path.write_text(
        f"---\n# written by `inferfleet lab up --routing {routing}`\n"
        + yaml.safe_dump({"all": {"children": {"loadbalancers": {"hosts": hosts}}}})
    )


def _own_balancers(inventory: Path) -> list[str]:
    """The load balancers the lab's own hosts.yml lists."""
    own = yaml.safe_load((inventory / "hosts.yml").read_text())["all"]["children"]
    return list(own["loadbalancers"]["hosts"])


def balancers(inventory: Path) -> list[str]:
    """The lab's load balancers: its own (hosts.yml), and Nginx after `lab up --nginx`."""
    extra = [NGINX_HOST] if (inventory / NGINX_FILE).is_file() else []
    return [*_own_balancers(inventory), *extra]


def write_nodes(inventory: Path, nodes: int, engine: str) -> None:
    """nodes.yml: engine nodes 1 to `nodes` in `inference` and, under `sim`, the engine
    settings as host variables (an inventory source's group variables rank below the lab's
    group_vars/all); with 2 vLLM nodes (the lab's own), no such file."""
    path = inventory / NODES_FILE
    if engine == "vllm" and nodes == 2:
        path.unlink(missing_ok=True)
        return
    sim = engine == "sim"
    children = {  # a dict per host: no YAML aliases in the file
        "inference": {
            "hosts": {node_name(i): dict(SIM_ENGINE_VARS) if sim else None
                      for i in range(1, nodes + 1)}
        },
        "loadbalancers": {
            "hosts": {lb: dict(SIM_BALANCER_VARS) if sim else None
                      for lb in balancers(inventory)}
        },
    }
    path.write_text(
        f"---\n# written by `inferfleet lab up --nodes {nodes} --engine {engine}`\n"
        + yaml.safe_dump({"all": {"children": children}})
    )


def read_nodes(inventory: Path) -> tuple[int, str]:
    """The lab's shape as `write_nodes` left it: (engine nodes, engine)."""
    path = inventory / NODES_FILE
    if not path.is_file():
        return 2, "vllm"
    hosts = yaml.safe_load(path.read_text())["all"]["children"]["inference"]["hosts"]
    runtimes = {(spec or {}).get("inference_engine_runtime") for spec in hosts.values()}
    return len(hosts), "sim" if runtimes == {"sim"} else "vllm"


# A lab host's systemd holds about 5 inotify instances: on a machine allowing 128 (the
# default), the 26th container's systemd exited at boot (status 255, nothing logged).
INOTIFY_PER_HOST = 5
INOTIFY_LIMIT = Path("/proc/sys/fs/inotify/max_user_instances")


def inotify_fix(need: int) -> str:
    limit = INOTIFY_LIMIT.read_text().strip() if INOTIFY_LIMIT.exists() else "?"
    return (
        f"this machine allows {limit} inotify instances per user "
        f"(fs.inotify.max_user_instances): raise it, as root: sysctl -w "
        f"fs.inotify.max_user_instances={max(1024, 2 * need)}; or ask for fewer --nodes"
    )


def inotify_shortfall(hosts: int, limit: int | None = None) -> str:
    """Why `hosts` systemd containers cannot all boot on this machine, or ""."""
    if limit is None:
        try:
            limit = int(INOTIFY_LIMIT.read_text())
        except (OSError, ValueError):
            return ""
    need = INOTIFY_PER_HOST * hosts
    if need <= limit:
        return ""
    return f"{hosts} lab hosts need about {need} inotify instances, and " + inotify_fix(need)


def mounts(host: str) -> list[str] | None:
    """Where a lab host's container has folders mounted; None when there is no such
    container."""
    out = subprocess.run(
        ["docker", "container", "inspect", "-f", "{{range .Mounts}}{{.Destination}} {{end}}",
         host], capture_output=True, text=True,
    )
    return out.stdout.split() if out.returncode == 0 else None


def create(
    lab: str, network: str, image: str, hosts: list[str], wheelhouse: Path | None,
    router_wheels: Path | None = None,
) -> None:
    """Start each host's container (the wheelhouse mounted, for vLLM's install, and the
    router's wheels, for cache_aware routing), and raise BootError naming those whose
    systemd did not stay up."""
    mount = ["-v", f"{wheelhouse}:{WHEELHOUSE_MOUNT}:ro"] if wheelhouse else []
    if router_wheels:
        mount += ["-v", f"{router_wheels}:{ROUTER_WHEELS_MOUNT}:ro"]
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
                *mount,
                image,
                "/sbin/init",
            ],
            check=True,
            capture_output=True,
            text=True,
        )
    time.sleep(2)  # a systemd that cannot start exits within a second
    down = [
        host
        for host in hosts
        if subprocess.run(
            ["docker", "inspect", "-f", "{{.State.Running}}", host],
            capture_output=True,
            text=True,
        ).stdout.strip()
        != "true"
    ]
    if down:
        raise BootError(
            f"{', '.join(down)} stopped at boot (a container's systemd exits when the user "
            f"has no inotify instance left); {inotify_fix(INOTIFY_PER_HOST * len(hosts))}; "
            "then run `inferfleet lab up` again"
        )


class BootError(Exception):
    """A lab host's container did not stay up."""


def address(host: str, network: str) -> str:
    fmt = f'{{{{(index .NetworkSettings.Networks "{network}").IPAddress}}}}'
    return subprocess.run(
        ["docker", "inspect", "-f", fmt, host], check=True, capture_output=True, text=True
    ).stdout.strip()


def write_state(
    inventory: Path, addresses: dict[str, str], tls_hosts: list[str] | None = None
) -> dict:
    """Write host_vars and (once) the secrets file; return the secrets. With `tls_hosts`
    (the load balancers), the secrets hold a certificate for them from a lab CA of their
    own (kept while the lab lives and it names them all; issued again, with a new CA, when
    one is added), and `ca_file` that CA for clients; without, neither."""
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
    # Added after the others: a lab made before them gets them on its next `lab up`.
    values.setdefault("inferfleet_lab_peer_token", "peer-" + secrets.token_urlsafe(24))
    values.setdefault("inferfleet_lab_limited_key", "sk-limited-" + secrets.token_urlsafe(24))
    if not tls_hosts:
        values = {k: v for k, v in values.items() if not k.startswith("inferfleet_lab_tls_")}
        ca_file(inventory).unlink(missing_ok=True)
    else:
        names = {*tls_hosts, *(addresses[h] for h in tls_hosts)}
        if "inferfleet_lab_tls_key" not in values or not names <= tls.names(
            values["inferfleet_lab_tls_certificate"]
        ):
            issued = tls.issue({h: addresses[h] for h in tls_hosts})
            values |= {f"inferfleet_lab_tls_{k}": v for k, v in issued.items()}
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
    (inventory / NGINX_FILE).unlink(missing_ok=True)
    (inventory / NODES_FILE).unlink(missing_ok=True)
    (inventory / ROUTING_FILE).unlink(missing_ok=True)
    (inventory / MONITORING_FILE).unlink(missing_ok=True)
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
