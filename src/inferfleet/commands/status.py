"""`inferfleet status`: per instance and node, what the fleet reports right now."""

from __future__ import annotations

import json
import math
from pathlib import Path

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from inferfleet import fleet as fleet_mod
from inferfleet import utilization as u
from inferfleet import verify as v
from inferfleet.commands.common import console, fail, resolve_inventory
from inferfleet.runner import run_playbook
from inferfleet.verify import metric_sums


def lb_view(balancers: dict[str, dict], instance: str) -> str:
    """`lb: STATE` for every load balancer: HAProxy's server state, or what Nginx cannot tell."""
    views = []
    for lb, msg in sorted(balancers.items()):
        if msg.get("kind") == "nginx":
            views.append(f"{lb}: passive")
        else:
            views.append(f"{lb}: {(msg.get('backends') or {}).get(instance, 'unknown')}")
    return ", ".join(views)


def router_lines(balancers: dict[str, dict]) -> list[str]:
    """cache_aware: per load balancer and backend, how its router has routed since it
    started: to the engine holding the prompt's prefix, or (none holding it) the least busy."""
    lines = []
    for lb, msg in sorted(balancers.items()):
        for backend, seen in sorted((msg.get("routers") or {}).items()):
            hit, miss = seen.get("prefix_hit", 0.0), seen.get("prefix_miss", 0.0)
            share = f" ({hit / (hit + miss):.0%})" if hit + miss else ""
            lines.append(f"router {lb}/{backend}: {hit + miss:.0f} requests routed, "
                         f"{hit:.0f}{share} to the engine holding their prefix, {miss:.0f} "
                         "to the least busy")
    return lines


PROMETHEUS_FIGURES = ("requests_per_s", "ttft_p95_s", "kv_cache_use")


def prometheus_view(host: str, msg: dict) -> dict:
    """Per-instance figures and the firing alerts from status.yml's Prometheus report
    (Prometheus' instant-query results: [{"metric": {...}, "value": [time, "text"]}])."""
    answers = msg.get("answers") or {}
    instances: dict[str, dict] = {}
    for name in PROMETHEUS_FIGURES:
        for sample in answers.get(name) or []:
            value = float(sample["value"][1])
            if math.isnan(value):  # a percentile over no requests
                continue
            instance = sample["metric"].get("inferfleet_instance", "")
            instances.setdefault(instance, {})[name] = value
    alerts = sorted(
        (
            {
                "alert": s["metric"].get("alertname", ""),
                "severity": s["metric"].get("severity", ""),
                "instance": s["metric"].get("instance", ""),
                "server": s["metric"].get("server", ""),
            }
            for s in answers.get("alerts") or []
        ),
        key=lambda a: (a["alert"], a["instance"], a["server"]),
    )
    return {
        "host": host,
        "instances": instances,
        "alerts": alerts,
        "errors": msg.get("errors") or {},
    }


def utilization(inventory: Path, seconds: float, as_json: bool) -> None:
    """Sample every serving engine's /metrics over `seconds` and judge the fleet's size."""
    if seconds < 2:
        fail(f"--window {seconds:g}: measure over 2 seconds or more")
    try:
        fleet = fleet_mod.load(inventory)
    except Exception as err:  # noqa: BLE001 (one line for a person, not a traceback)
        fail(f"cannot read the inventory: {err}")
    nodes = {n.instance: n for n in fleet.serving}

    def read(instance: str) -> str:
        code, text = v.get(f"{nodes[instance].base}/metrics", fleet.engine_key)
        if code != 200:
            raise RuntimeError(f"{nodes[instance].host}'s /metrics answered {code or text}")
        return text

    if not as_json:
        console.print(f"measuring {len(nodes)} instance(s) for {seconds:g} s ...")
    try:
        usages, peak, measured = u.measure(read, list(nodes), seconds)
    except RuntimeError as err:
        fail(f"{err}: is the engine up? (`inferfleet status`)")
    out = u.report(usages, peak, measured, fleet.max_num_seqs)
    if as_json:
        print(json.dumps(out, indent=2))
        return
    table = Table(title=f"utilization over {out['seconds']:g} s")
    for col in (
        "instance",
        "requests",
        "in flight (avg)",
        "peak running",
        "peak waiting",
        "peak KV",
    ):
        table.add_column(col)
    for x in usages:
        table.add_row(
            x.instance,
            f"{x.requests:.0f}",
            f"{x.in_flight:.2f}",
            f"{x.peak_running:.0f}",
            f"{x.peak_waiting:.0f}",
            f"{x.peak_kv:.0%}",
        )
    console.print(table)
    console.print(f"fleet peak in flight {peak:.0f} (max_num_seqs {fleet.max_num_seqs} per engine)")
    console.print(out["advice"])


def edge_view(balancers: dict[str, dict]) -> list[dict]:
    """Each floating address: its peers and which of them hold it (one, when all is well)."""
    edges: dict[str, dict] = {}
    for lb, msg in sorted(balancers.items()):
        vip = str(msg.get("virtual_ip") or "")
        if vip:
            edge = edges.setdefault(vip, {"virtual_ip": vip, "peers": [], "held_by": []})
            edge["peers"].append(lb)
            if msg.get("holds_virtual_ip"):
                edge["held_by"].append(lb)
    return list(edges.values())


def edge_line(edge: dict) -> str:
    held = edge["held_by"]
    holder = (
        f"held by {held[0]}" if len(held) == 1
        else "held by NO load balancer" if not held
        else f"held by {len(held)} load balancers at once: {', '.join(held)}"
    )
    return f"floating address {edge['virtual_ip']} ({', '.join(edge['peers'])}): {holder}"


def alert_line(alert: dict) -> str:
    """`InferfleetEngineDown (critical) node2`: the alert, its severity, where."""
    where = " ".join(x for x in (alert["instance"], alert["server"]) if x)
    return f"{alert['alert']} ({alert['severity']}) {where}".rstrip()


def held_line(host: str, service: str) -> str:
    """What to do about an engine that systemd's crash-loop guard holds."""
    return (
        f"{host}: systemd gave up restarting {service} (it failed too often within its start "
        f"limit interval). Find the cause with `journalctl -u {service}` on the node, then "
        f"`inferfleet deploy` starts it again (or `systemctl reset-failed {service}` there)"
    )


def _figure(value: float | None, form: str) -> str:
    return "-" if value is None else form.format(value)


def instance_rows(rows: list[dict], prometheus: bool) -> list[tuple[str, ...]]:
    """One line per instance for an 80-column terminal: its members ready, the model
    version ("mixed" where members differ; on a fleet of several models, the model's name
    before it), vLLM, requests running/queued and served (of rank 0), each load balancer's
    state of it, and Prometheus' rate when there is one."""
    several = len({r.get("model", "") for r in rows}) > 1
    by_instance: dict[str, list[dict]] = {}
    for r in rows:
        by_instance.setdefault(r["instance"], []).append(r)
    out = []
    for instance, members in by_instance.items():
        rank0 = next((m for m in members if m["rank"] == 0), members[0])
        versions = {m["model_version"] for m in members}
        engines = {m["engine_version"] for m in members}
        ready = sum(m["healthy"] for m in members)
        line = [
            instance,
            f"[{'green' if ready == len(members) else 'red'}]{ready}/{len(members)}[/]",
            (f"{rank0.get('model', '')} " if several else "")
            + (versions.pop() if len(versions) == 1 else "mixed"),
            engines.pop() if len(engines) == 1 else "mixed",
            f"{rank0['running']:.0f}/{rank0['waiting']:.0f}",
            f"{rank0['served']:.0f}",
            " ".join(state.rsplit(": ", 1)[-1] for state in rank0["lb"].split(", ")),
        ]
        if prometheus:
            line.append(_figure(rank0.get("requests_per_s"), "{:.2f}"))
        out.append(tuple(line))
    return out


def status_table(rows: list[dict], prometheus: bool, wide: bool) -> Table:
    """The instance view (default) or every node with every field (`wide`)."""
    if not wide:
        lines = instance_rows(rows, prometheus)
        engines = {line[3] for line in lines}
        one_engine = engines.pop() if len(engines) == 1 else None
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False,
                      caption=f"vLLM {one_engine} on every node" if one_engine else None)
        table.add_column("INSTANCE", no_wrap=True)
        for col in ("READY", "MODEL") + (() if one_engine else ("vLLM",)) + (
            "RUN/Q", "SERVED", "LB"
        ) + (("REQ/S",) if prometheus else ()):
            table.add_column(col)
        for line in lines:
            table.add_row(*(line[:3] + line[4:] if one_engine else line))
        return table
    table = Table(title="inferfleet status")
    for col in (
        "instance",
        "rank",
        "host",
        "engine",
        "ready",
        "model",
        "digest",
        "vLLM",
        "running",
        "waiting",
        "served",
        "load balancer",
    ) + (("req/s 5m", "TTFT p95", "KV") if prometheus else ()):
        table.add_column(col)
    for r in rows:
        table.add_row(
            r["instance"],
            str(r["rank"]),
            r["host"],
            r["unit"],
            "[green]yes[/]" if r["healthy"] else "[red]no[/]",
            r.get("model", ""),
            r["model_version"],
            r["manifest_digest"][:19],
            r["engine_version"],
            f"{r['running']:.0f}",
            f"{r['waiting']:.0f}",
            f"{r['served']:.0f}",
            r["lb"],
            *(
                (
                    _figure(r["requests_per_s"], "{:.2f}"),
                    _figure(r["ttft_p95_s"], "{:.3f} s"),
                    _figure(r["kv_cache_use"], "{:.0%}"),
                )
                if prometheus
                else ()
            ),
        )
    return table


def status(
    inventory: Path | None = typer.Option(None, "-i", "--inventory", help="Inventory path."),
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON."),
    wide: bool = typer.Option(
        False, "--wide", help="Every node with every field (host, unit, digest, TTFT, KV)."
    ),
    use: bool = typer.Option(
        False, "--utilization", help="Measure how busy each instance is and judge the fleet's size."
    ),
    window: float = typer.Option(60.0, "--window", help="Seconds --utilization measures."),
) -> None:
    """Per instance: members ready, model, vLLM, load and each LB's view (--wide: per node)."""
    if use:
        utilization(resolve_inventory(inventory), window, as_json)
        return
    quiet = Console(quiet=True)
    result = run_playbook("status", "status.yml", resolve_inventory(inventory), console=quiet)
    # playbooks/status.yml hands each report over with set_stats, keyed by host
    nodes = result.data.get("inferfleet_status_nodes", {})
    balancers = result.data.get("inferfleet_status_balancers", {})
    prometheus = [
        prometheus_view(h, m)
        for h, m in result.data.get("inferfleet_status_prometheus", {}).items()
    ]
    prom = prometheus[0] if prometheus else None
    rows = []
    # Grouped by model, then by instance in rank order.
    for host, msg in sorted(
        nodes.items(),
        key=lambda kv: (
            str(kv[1].get("model", "")),
            kv[1]["instance"]["instance"],
            kv[1]["instance"]["rank"],
        ),
    ):
        m = metric_sums(msg.get("metrics") or [])
        rows.append(
            {
                "instance": msg["instance"]["instance"],
                "rank": msg["instance"]["rank"],
                "host": host,
                "unit": msg["unit"],
                "start_limit_hit": bool(msg.get("start_limit_hit")),
                "service": msg.get("service", ""),
                "healthy": bool(msg["healthy"]),
                "model": str(msg.get("model", "")),
                "model_version": msg["model_version"],
                "manifest_digest": msg["manifest_digest"],
                "engine_version": msg["engine_version"],
                "running": m.get("vllm:num_requests_running", 0.0),
                "waiting": m.get("vllm:num_requests_waiting", 0.0),
                "served": m.get("vllm:request_success_total", 0.0),
                # Only rank 0 of an instance is a backend.
                "lb": lb_view(balancers, msg["instance"]["instance"])
                if msg["instance"]["rank"] == 0
                else "",
            }
        )
        if prom is not None:
            figures = (
                prom["instances"].get(msg["instance"]["instance"], {})
                if msg["instance"]["rank"] == 0
                else {}
            )
            rows[-1].update({name: figures.get(name) for name in PROMETHEUS_FIGURES})
    edges = edge_view(balancers)
    routers = {lb: msg["routers"] for lb, msg in balancers.items() if msg.get("routers")}
    if as_json:
        print(
            json.dumps(
                {"nodes": rows, "edge": edges, "routers": routers, "prometheus": prom,
                 "failures": result.failures},
                indent=2,
            )
        )
    else:
        console.print(status_table(rows, prom is not None, wide))
        for edge in edges:
            color = "" if len(edge["held_by"]) == 1 else "[red]"
            console.print(f"{color}{edge_line(edge)}{'[/]' if color else ''}", soft_wrap=True)
        for line in router_lines(balancers):
            console.print(line, soft_wrap=True)
        if prom:
            for name, error in prom["errors"].items():
                console.print(f"[yellow]Prometheus on {prom['host']}: {name}: {error}[/]")
            firing = [alert_line(a) for a in prom["alerts"]]
            console.print(
                f"alerts firing (Prometheus on {prom['host']}): "
                + ("; ".join(firing) if firing else "none")
            )
        for r in rows:
            if r["start_limit_hit"]:
                console.print(f"[red]{held_line(r['host'], r['service'])}[/]", soft_wrap=True)
        for failure in result.failures:
            console.print(f"[red]{failure}[/]")
    raise typer.Exit(result.rc)
