"""`inferfleet verify`: is the deployment done? Health of every backend, identical greedy
answers from every instance and through the load balancer, a bounded load that reports
throughput, latency, errors and how evenly it spread, and with --failover one engine
stopped and started under load."""

from __future__ import annotations

import json
import ssl
import threading
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from inferfleet import fleet as fleet_mod
from inferfleet import verify as v
from inferfleet.commands.common import console, fail, resolve_inventory
from inferfleet.runner import run_playbook


def _counters(fleet: fleet_mod.Fleet, node: fleet_mod.Node) -> tuple[float, float]:
    """`node`'s engine's (completed requests, busy seconds) from its metrics (NaN if it
    did not answer)."""
    status, text = v.get(f"{node.base}/metrics", fleet.engine_key)
    nan = float("nan")
    return (v.served_requests(text), v.busy_seconds(text)) if status == 200 else (nan, nan)


def _served(fleet: fleet_mod.Fleet) -> dict[str, tuple[float, float]]:
    """Each serving engine's (completed requests, busy seconds) from its metrics."""
    return {node.host: _counters(fleet, node) for node in fleet.serving}


def _same_answers(fleet: fleet_mod.Fleet, model: str, of: str) -> list[tuple[str, bool, str]]:
    """The greedy answer of every instance of `model`, and of `model` through every load
    balancer: all the same."""
    key = fleet.key_for(model)
    answers = {n.host: v.complete(n.base, model, fleet.engine_key) for n in fleet.serving_of(model)}
    answers |= {lb: v.complete(lb, model, key) for lb in fleet.balancers}
    texts = {k: c.text for k, c in answers.items() if c.ok}
    failed = [f"{k}: {c.status} {c.error}" for k, c in answers.items() if not c.ok]
    same = not failed and len(set(texts.values())) == 1
    detail = "; ".join(failed) or (
        f"{len(texts)} answers: {next(iter(texts.values()))!r}" if same else json.dumps(texts)
    )
    return [(f"identical greedy answers{of}", same, detail)]


def _load(
    fleet: fleet_mod.Fleet, model: str, of: str, concurrency: int, count: int, max_tokens: int
) -> tuple[list[tuple[str, bool, str]], v.LoadReport]:
    """A bounded load of `model` through the first load balancer: no errors, and spread
    over that model's instances only (an instance of another model gets none of it)."""
    key = fleet.key_for(model)
    mine = [n.host for n in fleet.serving_of(model)]
    # cache_aware sends a prompt no engine holds to the least busy engine, the first
    # listed among equals: with fewer requests in flight than engines, the last ones
    # idle. So that every engine's part is seen, as many in flight as engines at least.
    if fleet.routing == "cache_aware":
        concurrency = max(concurrency, len(mine))
    # One uncounted round first: an engine's first batches of a new size are slow
    # (kernels chosen and cached), which says nothing about the spread.
    warmup = v.run_load(
        fleet.balancers[0], model, key, concurrency, concurrency, max_tokens=max_tokens
    )
    before = _served(fleet)
    report = v.run_load(fleet.balancers[0], model, key, concurrency, count, max_tokens=max_tokens)
    after = _served(fleet)
    counts = {h: after[h][0] - before[h][0] for h in after}
    busy = {h: after[h][1] - before[h][1] for h in after}
    # leastconn keeps every engine equally busy (requests in flight), so a slower
    # engine rightly gets fewer requests: judge it by busy time; round robin by count.
    # prefix routing sends each prompt (every request here has its own) to the engine
    # that owns its hash: the shares are the hash ring's, so every engine must get some;
    # cache_aware sends a prompt no engine holds to the least busy engine.
    by_count = fleet.routing != "leastconn"
    spread = {h: (counts if by_count else busy)[h] for h in mine}
    even = (all(counts[h] > 0 for h in mine) if fleet.routing in ("prefix", "cache_aware")
            else v.spread_is_even(spread))
    strays = {h: counts[h] for h in counts if h not in mine and counts[h] > 0}
    checks = [
        (
            f"load without errors{of}",
            report.failed == 0 and warmup.failed == 0,
            f"{report.sent} sent, {report.failed} failed {'; '.join(report.errors)}".strip()
            + (
                f" (warm-up: {warmup.failed} failed {'; '.join(warmup.errors)})"
                if warmup.failed
                else ""
            ),
        ),
        (
            f"load spread over every backend{of}",
            even,
            f"{f'requests ({fleet.routing})' if by_count else 'busy seconds (leastconn)'}: "
            + ", ".join(f"{h} {int(counts[h])} requests, {busy[h]:.1f} s busy" for h in mine),
        ),
    ]
    if len(fleet.models) > 1:
        checks.append(
            (
                f"no request to another model's instances{of}",
                not strays,
                ", ".join(f"{h} served {int(n)}" for h, n in strays.items()) or "none",
            )
        )
    return checks, report


def _figures(report: v.LoadReport) -> dict:
    return {
        "sent": report.sent,
        "concurrency": report.concurrency,
        "failed": report.failed,
        "seconds": report.seconds,
        "throughput_rps": report.throughput,
        "p50_s": report.p50,
        "p95_s": report.p95,
        "p99_s": report.p99,
    }


def _health_moments(node: fleet_mod.Node, stop: threading.Event, out: list) -> None:
    """Every change of `node`'s /health status, as (wall clock, status), 4 times a second."""
    last = None
    while not stop.is_set():
        status, _ = v.get(f"{node.base}/health", timeout=1)
        if status != last:
            out.append((time.time(), status))
            last = status
        stop.wait(0.25)


def _failover(
    fleet: fleet_mod.Fleet, inventory: Path, node: fleet_mod.Node, timeout: int, quiet: bool
) -> tuple[list[tuple[str, bool, str]], dict]:
    """Stop `node`'s engine under load through every load balancer, start it again, and
    say what the clients saw and when the load balancers took it out and put it back."""
    moments: list[tuple[float, int]] = []
    stop = threading.Event()
    watcher = threading.Thread(target=_health_moments, args=(node, stop, moments), daemon=True)
    watcher.start()
    key = fleet.key_for(node.model)
    with v.LoadLoop(fleet.balancers, node.model, key, workers=2, pause=0.5) as load:
        run = run_playbook(
            "verify failover",
            "failover.yml",
            inventory,
            extra_vars={"failover_host": node.host, "failover_timeout": timeout},
            console=Console(quiet=True) if quiet else console,
        )
        # Past the returning engine's slow start: it must serve its share again. The
        # load is light (two requests at a time), so on a large fleet its turn may come
        # later: up to a second more per instance of its model.
        back = _counters(fleet, node)[0]
        time.sleep(fleet.slowstart + 5)
        deadline = time.monotonic() + len(fleet.serving_of(node.model))
        while not (served_again := _counters(fleet, node)[0] - back) and (
            time.monotonic() < deadline
        ):
            time.sleep(1)
    stop.set()
    watcher.join()
    report = run.data.get("inferfleet_failover", {}).get(node.host)  # failover.yml's set_stats
    failed = load.failed()
    # When each failed request started, in seconds after the stop (the load keeps
    # monotonic moments, the report wall-clock ones).
    wall = time.time() - time.monotonic()
    failed_at = (
        sorted(round(t + wall - report["stopped_at"], 1) for t, c in load.calls if not c.ok)
        if report is not None
        else []
    )
    when = f" (started {', '.join(map(str, failed_at))} s after the stop)" if failed_at else ""
    checks = [
        (
            "failover: no failed request",
            not failed and len(load.calls) > 0,
            f"{len(load.calls)} sent, {len(failed)} failed "
            + "; ".join(sorted({f"{c.status} {c.error}".strip() for c in failed}))
            + when,
        )
    ]
    if report is None:
        checks.append(("failover: taken out and put back", False, "; ".join(run.failures)))
        return checks, {"sent": len(load.calls), "failed": len(failed)}
    gone = next((t for t, s in moments if t > report["stopped_at"] and s != 200), None)
    ready = next((t for t, s in moments if t > report["started_at"] and s == 200), None)
    figures = {
        "host": node.host,
        "sent": len(load.calls),
        "failed": len(failed),
        "failed_started_after_stop_s": failed_at,
        # seconds after the stop was asked for / after the start was asked for
        "unanswered_after_s": None if gone is None else round(gone - report["stopped_at"], 1),
        "taken_out_after_s": round(report["down_at"] - report["stopped_at"], 1),
        "answers_again_after_s": None if ready is None else round(ready - report["started_at"], 1),
        "put_back_after_s": round(report["up_at"] - report["started_at"], 1),
        "served_after_back": served_again,
    }
    lbs = ", ".join(report["haproxies"]) or "no HAProxy (Nginx notices by failed requests)"
    checks += [
        (
            "failover: taken out",
            True,
            f"{lbs}: out {figures['taken_out_after_s']} s after the stop "
            f"(the engine stopped answering after {figures['unanswered_after_s']} s)",
        ),
        (
            "failover: put back",
            served_again > 0,
            f"{lbs}: back {figures['put_back_after_s']} s after the start (the engine "
            f"answered after {figures['answers_again_after_s']} s); "
            f"{served_again:.0f} requests served since",
        ),
    ]
    return checks, figures


def verify(
    inventory: Path | None = typer.Option(None, "-i", "--inventory", help="Inventory path."),
    concurrency: int = typer.Option(4, help="Requests in flight during the load check."),
    count: int = typer.Option(40, help="Requests sent during the load check (0: skip it)."),
    max_tokens: int = typer.Option(16, help="Tokens per request in the load check."),
    failover: bool = typer.Option(
        False,
        "--failover",
        help="Also stop one instance's engine under load and start it again.",
    ),
    failover_node: str | None = typer.Option(
        None, help="The node whose engine --failover stops (default: the last instance's)."
    ),
    failover_timeout: int = typer.Option(
        600, help="Seconds --failover waits for the engine to answer again."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON."),
) -> None:
    """Check health, identical answers, and load spread; exit 1 if any check fails."""
    path = resolve_inventory(inventory)
    try:
        fleet = fleet_mod.load(path)
    except Exception as err:  # noqa: BLE001 (one line for a person, not a traceback)
        fail(f"cannot read the inventory: {err}")
    try:
        v.trust(fleet.ca)
    except ssl.SSLError as err:
        fail(f"load_balancer_tls_ca_certificate is not a PEM certificate: {err}")
    if not fleet.balancers:
        fail("the inventory has no `loadbalancers` host: verify needs one")
    target = None
    if failover:
        hosts = [n.host for n in fleet.serving]
        if len(hosts) < 2:
            fail("--failover needs two instances or more: stopping the only one is an outage")
        if failover_node is not None and failover_node not in hosts:
            fail(f"--failover-node {failover_node}: name an instance's node ({', '.join(hosts)})")
        if failover_timeout < 1:
            fail(f"--failover-timeout {failover_timeout}: give seconds, 1 or more")
        target = next(n for n in fleet.serving if n.host == (failover_node or hosts[-1]))
        if len(fleet.serving_of(target.model)) < 2:
            fail(
                f"--failover would stop {target.host}, the only instance of {target.model}: "
                "that is an outage of the model; name another with --failover-node"
            )
    checks: list[tuple[str, bool, str]] = []

    for node in fleet.serving:
        health, _ = v.get(f"{node.base}/health")
        models_status, models = v.get(f"{node.base}/v1/models", fleet.engine_key)
        listed = node.model in models
        checks.append(
            (
                f"healthy {node.host}",
                health == 200 and listed,
                f"/health {health}, /v1/models {models_status}"
                f"{'' if listed else f', {node.model} not listed'}",
            )
        )

    # Each model on its own: its instances answer alike, the load balancers route its
    # requests to them, and its load spreads over them.
    several = len(fleet.models) > 1
    loads = {}
    for model in fleet.models:
        of = f": {model}" if several else ""
        checks += _same_answers(fleet, model, of)
        if count > 0:
            more, loads[model] = _load(fleet, model, of, concurrency, count, max_tokens)
            checks += more
    report = loads.get(fleet.models[0]) if loads else None

    failover_figures = None
    if target is not None:
        more, failover_figures = _failover(fleet, path, target, failover_timeout, as_json)
        checks += more

    ok = all(passed for _, passed, _ in checks)
    if as_json:
        print(
            json.dumps(
                {
                    "ok": ok,
                    "checks": [{"check": c, "passed": p, "detail": d} for c, p, d in checks],
                    # the first model's load, and every model's
                    "load": None if report is None else _figures(report),
                    "loads": {m: _figures(r) for m, r in loads.items()},
                    "failover": failover_figures,
                },
                indent=2,
            )
        )
    else:
        table = Table(title="inferfleet verify")
        for col in ("check", "result", "detail"):
            table.add_column(col)
        for check, passed, detail in checks:
            table.add_row(check, "[green]pass[/]" if passed else "[red]FAIL[/]", detail)
        console.print(table)
        for model, report in loads.items():
            console.print(
                f"load{f' ({model})' if len(loads) > 1 else ''}: {report.sent} requests, "
                f"concurrency {report.concurrency}: "
                f"{report.throughput:.2f} req/s, p50 {report.p50:.3f} s, "
                f"p95 {report.p95:.3f} s, p99 {report.p99:.3f} s"
            )
    raise typer.Exit(0 if ok else 1)
