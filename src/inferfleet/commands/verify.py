"""`inferfleet verify`: is the deployment done? Health of every backend, identical greedy
answers from every instance and through the load balancer, and a bounded load that
reports throughput, latency, errors and how evenly it spread."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from inferfleet import fleet as fleet_mod
from inferfleet import verify as v
from inferfleet.commands.common import console, fail, resolve_inventory


def _served(fleet: fleet_mod.Fleet) -> dict[str, tuple[float, float]]:
    """Each serving engine's (completed requests, busy seconds) from its metrics."""
    out = {}
    for node in fleet.serving:
        status, text = v.get(f"{node.base}/metrics", fleet.engine_key)
        nan = float("nan")
        out[node.host] = (
            (v.served_requests(text), v.busy_seconds(text)) if status == 200 else (nan, nan)
        )
    return out


def verify(
    inventory: Path | None = typer.Option(None, "-i", "--inventory", help="Inventory path."),
    concurrency: int = typer.Option(4, help="Requests in flight during the load check."),
    count: int = typer.Option(40, help="Requests sent during the load check (0: skip it)."),
    max_tokens: int = typer.Option(16, help="Tokens per request in the load check."),
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON."),
) -> None:
    """Check health, identical answers, and load spread; exit 1 if any check fails."""
    try:
        fleet = fleet_mod.load(resolve_inventory(inventory))
    except Exception as err:  # noqa: BLE001 (one line for a person, not a traceback)
        fail(f"cannot read the inventory: {err}")
    if not fleet.balancers:
        fail("the inventory has no `loadbalancers` host: verify needs one")
    checks: list[tuple[str, bool, str]] = []

    for node in fleet.serving:
        health, _ = v.get(f"{node.base}/health")
        models_status, models = v.get(f"{node.base}/v1/models", fleet.engine_key)
        listed = fleet.model in models
        checks.append(
            (
                f"healthy {node.host}",
                health == 200 and listed,
                f"/health {health}, /v1/models {models_status}"
                f"{'' if listed else f', {fleet.model} not listed'}",
            )
        )

    answers = {n.host: v.complete(n.base, fleet.model, fleet.engine_key) for n in fleet.serving}
    answers |= {lb: v.complete(lb, fleet.model, fleet.api_key) for lb in fleet.balancers}
    texts = {k: c.text for k, c in answers.items() if c.ok}
    failed = [f"{k}: {c.status} {c.error}" for k, c in answers.items() if not c.ok]
    same = not failed and len(set(texts.values())) == 1
    checks.append(
        (
            "identical greedy answers",
            same,
            "; ".join(failed)
            or (
                f"{len(texts)} answers: {next(iter(texts.values()))!r}"
                if same
                else json.dumps(texts)
            ),
        )
    )

    report = None
    if count > 0:
        # One uncounted round first: an engine's first batches of a new size are slow
        # (kernels chosen and cached), which says nothing about the spread.
        warmup = v.run_load(
            fleet.balancers[0],
            fleet.model,
            fleet.api_key,
            concurrency,
            concurrency,
            max_tokens=max_tokens,
        )
        before = _served(fleet)
        report = v.run_load(
            fleet.balancers[0],
            fleet.model,
            fleet.api_key,
            concurrency,
            count,
            max_tokens=max_tokens,
        )
        after = _served(fleet)
        counts = {h: after[h][0] - before[h][0] for h in after}
        busy = {h: after[h][1] - before[h][1] for h in after}
        # leastconn keeps every engine equally busy (requests in flight), so a slower
        # engine rightly gets fewer requests: judge it by busy time; round robin by count.
        spread = counts if fleet.balance == "roundrobin" else busy
        checks.append(
            (
                "load without errors",
                report.failed == 0 and warmup.failed == 0,
                f"{report.sent} sent, {report.failed} failed {'; '.join(report.errors)}".strip()
                + (
                    f" (warm-up: {warmup.failed} failed {'; '.join(warmup.errors)})"
                    if warmup.failed
                    else ""
                ),
            )
        )
        checks.append(
            (
                "load spread over every backend",
                v.spread_is_even(spread),
                f"{'requests' if spread is counts else 'busy seconds (leastconn)'}: "
                + ", ".join(f"{h} {int(counts[h])} requests, {busy[h]:.1f} s busy" for h in counts),
            )
        )

    ok = all(passed for _, passed, _ in checks)
    if as_json:
        print(
            json.dumps(
                {
                    "ok": ok,
                    "checks": [{"check": c, "passed": p, "detail": d} for c, p, d in checks],
                    "load": None
                    if report is None
                    else {
                        "sent": report.sent,
                        "failed": report.failed,
                        "seconds": report.seconds,
                        "throughput_rps": report.throughput,
                        "p50_s": report.p50,
                        "p95_s": report.p95,
                        "p99_s": report.p99,
                    },
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
        if report is not None:
            console.print(
                f"load: {report.sent} requests, concurrency {concurrency}: "
                f"{report.throughput:.2f} req/s, p50 {report.p50:.3f} s, "
                f"p95 {report.p95:.3f} s, p99 {report.p99:.3f} s"
            )
    raise typer.Exit(0 if ok else 1)
