"""`inferfleet rollout` / `inferfleet rollback`: playbooks/rolling_update.yml and
playbooks/rollback.yml, one batch of instances at a time, over the lab by default.
`rollout --canary` switches one instance first, gives it a share of the requests and
compares it with the old release before the rest follow (or it is rolled back)."""

from __future__ import annotations

import ssl
import time
from pathlib import Path

import typer
from rich.table import Table

from inferfleet import canary as c
from inferfleet import fleet as fleet_mod
from inferfleet import verify as v
from inferfleet.commands.common import (
    changes_the_fleet,
    console,
    fail,
    parse_extra_vars,
    print_summary,
    resolve_inventory,
)
from inferfleet.runner import CANARY_REGRESSED, add_to_record, run_playbook

# The options both commands take.
INVENTORY = typer.Option(None, "-i", "--inventory", help="Inventory path.")
SERIAL = typer.Option(1, help="Instances switched at a time.")
MAX_FAIL_PERCENTAGE = typer.Option(
    0, help="Failed instances (percent of a batch) tolerated before the run stops."
)
EXTRA = typer.Option([], "-e", "--extra-vars", help="key=value or @file.yml")

# How a new release (a canary, a migration's new instances) is judged against the old.
GOLDEN = typer.Option(
    None, help="YAML/JSON list of golden prompts or {prompt, expect} (default: three built in)."
)
GOLDEN_MAY_CHANGE = typer.Option(
    False,
    "--golden-may-change",
    help="A new model version or quantization: golden answers may differ from the old ones.",
)
MAX_ERROR_RATE_INCREASE = typer.Option(
    1.0, help="Percentage points of 5xx the new side may add over the old."
)
MAX_LATENCY_RATIO = typer.Option(
    1.5, help="The new side's p50 and p95 may be at most this many times the old ones."
)
MIN_REQUESTS = typer.Option(5, help="Requests the new side must serve for a verdict.")


def verdict_settings(
    golden: Path | None,
    golden_may_change: bool,
    max_error_rate_increase: float,
    max_latency_ratio: float,
    min_requests: int,
) -> tuple[c.Thresholds, list[c.Golden]]:
    """The thresholds and golden prompts of a comparison, from the options above."""
    if max_latency_ratio < 1 or max_error_rate_increase < 0 or min_requests < 0:
        fail(
            "--max-latency-ratio must be 1 or more, --max-error-rate-increase and "
            "--min-requests 0 or more"
        )
    try:
        prompts = c.load_golden(golden)
    except ValueError as err:
        fail(str(err))
    limits = c.Thresholds(
        max_error_rate_increase=max_error_rate_increase / 100,
        max_latency_ratio=max_latency_ratio,
        min_requests=min_requests,
        golden_may_change=golden_may_change,
    )
    return limits, prompts


def _batch_vars(serial: int, max_fail_percentage: int) -> dict:
    if serial < 1:
        fail(f"--serial {serial}: roll at least one instance per batch")
    if not 0 <= max_fail_percentage <= 100:
        fail(f"--max-fail-percentage {max_fail_percentage}: give a percentage, 0 to 100")
    return {"rollout_serial": serial, "rollout_max_fail_percentage": max_fail_percentage}


def _release_vars(extra_vars: dict) -> dict:
    """What the nodes record as their release: the variables given on the command line
    (the model version and engine settings), not the rollout's own options."""
    names = sorted(k for k in extra_vars if not k.startswith("rollout_"))
    return {"rollout_release_vars": names}


def _released(names: list[str]) -> None:
    if names:
        console.print(
            f"the fleet records {', '.join(names)} as its release: later deploys, scales and "
            "rollouts keep these values over the inventory's until a rollout changes them "
            "(write them into the inventory to keep the two alike)"
        )


def _model_hosts(inventory: Path, model: str | None, command: str) -> tuple[str, str | None]:
    """The model a rollout or rollback acts on and the run's --limit: every member of that
    model's instances and the load balancers, whose smoke test ends the run (None: the
    whole fleet, which serves that one model). A fleet of several models needs --model:
    a version or setting belongs to one model."""
    try:
        fleet = fleet_mod.load(inventory)
    except Exception as err:  # noqa: BLE001 (one line for a person, not a traceback)
        fail(f"cannot read the inventory: {err}")
    served = fleet.models
    if model is None:
        if len(served) > 1:
            fail(
                f"this fleet serves {', '.join(served)}: name the one to {command} with --model "
                "(its instances alone change)"
            )
        return (served[0] if served else ""), None
    if model not in served:
        fail(f"--model {model}: no instance serves it; this fleet serves {', '.join(served)}")
    if len(served) == 1:
        return model, None
    hosts = [h for n in fleet.serving_of(model) for h in fleet.members(n.instance)]
    return model, ",".join([*hosts, "loadbalancers"])


def _metrics(fleet: fleet_mod.Fleet) -> dict[str, c.Snapshot]:
    out = {}
    for node in fleet.serving:
        status, text = v.get(f"{node.base}/metrics", fleet.engine_key)
        if status != 200:
            raise RuntimeError(f"{node.host}'s /metrics answered {status or text}")
        out[node.host] = c.Snapshot.of(text)
    return out


def watch(
    fleet: fleet_mod.Fleet,
    model: str,
    new: list[str],
    seconds: float,
    requests: int,
    load: int,
) -> tuple[c.Side, c.Side]:
    """Watch the serving hosts `new` (the canary, or a migration's new instances) and the
    other instances of their model over the same window of traffic: until `seconds` have
    passed or `new` have answered `requests` (0: no such limit), with `load` requests in
    flight through the first load balancer."""
    before = _metrics(fleet)
    started = time.monotonic()

    def served(now: dict[str, c.Snapshot]) -> float:
        return sum((now[h] - before[h]).requests for h in new)

    with v.LoadLoop(fleet.balancers[:1], model, fleet.key_for(model), workers=load, pause=0.2):
        while time.monotonic() - started < seconds:
            time.sleep(1)
            if requests and served(_metrics(fleet)) >= requests:
                break
    after = _metrics(fleet)
    delta = {h: after[h] - before[h] for h in after}
    peers = {n.host for n in fleet.serving_of(model)}
    return _sum([delta[h] for h in new]).side(), _sum(
        [delta[h] for h in delta if h not in new and h in peers]
    ).side()


def _sum(snapshots: list[c.Snapshot]) -> c.Snapshot:
    total = snapshots[0]
    for d in snapshots[1:]:
        total = total + d
    return total


def _too_few(rows: list[c.Row], limits: c.Thresholds, seconds: float, load: int) -> str:
    """What to change when the canary had too little traffic for a verdict (put before the
    record's path, which ends the message: scripts read the path up to the next space)."""
    served = next((r for r in rows if r.check == "requests served"), None)
    if served is None or served.passed:
        return ""
    more = (
        "too little live traffic; give --canary-load N (requests the CLI keeps in flight "
        "through the load balancer while it watches) or a longer --canary-seconds"
        if load == 0
        else "give a longer --canary-seconds, a larger --canary-share or --canary-load"
    )
    return (
        f". The canary served {served.canary} requests in {seconds:g} s, fewer than the "
        f"{limits.min_requests} a verdict needs: {more}"
    )


def _canary(
    inventory: Path,
    model: str,
    extra_vars: dict,
    limits: c.Thresholds,
    golden: list[c.Golden],
    share: float,
    seconds: float,
    requests: int,
    load: int,
) -> None:
    try:
        fleet = fleet_mod.load(inventory)
    except Exception as err:  # noqa: BLE001 (one line for a person, not a traceback)
        fail(f"cannot read the inventory: {err}")
    try:
        v.trust(fleet.ca)
    except ssl.SSLError as err:
        fail(f"load_balancer_tls_ca_certificate is not a PEM certificate: {err}")
    serving = fleet.serving_of(model)
    if len(serving) < 2:
        of = f" of {model}" if len(fleet.models) > 1 else ""
        fail(
            f"--canary needs two instances or more{of}: one to try the release, one to "
            "compare with"
        )
    if not fleet.balancers:
        fail("--canary needs a `loadbalancers` host to give the canary its share of requests")
    node, reference = serving[0], serving[1]
    members = fleet.members(node.instance)  # a multi-node instance rolls as one
    others = [h for n in serving[1:] for h in fleet.members(n.instance)]
    console.print(f"[bold]canary: instance {node.instance} ({', '.join(members)}) first[/]")
    first = run_playbook(
        "rollout canary",
        "rolling_update.yml",
        inventory,
        extra_vars=extra_vars,
        limit=",".join(members),
        console=console,
    )
    if first.rc != 0:
        print_summary(first)
        raise typer.Exit(first.rc)
    weight = c.weight_for_share(share, len(serving) - 1, fleet.weight)
    try:
        # asked before the canary takes a share: a just-started engine's first, slow
        # answers (its warm-up) fall outside the latency window
        answers = [
            (
                g,
                v.complete(node.base, model, fleet.engine_key, g.prompt).text,
                v.complete(reference.base, model, fleet.engine_key, g.prompt).text,
            )
            for g in golden
        ]
        weights = run_playbook(
            "canary weight",
            "weights.yml",
            inventory,
            extra_vars={"rollout_weights": {node.instance: weight}},
            console=console,
        )
        if weights.rc != 0:
            raise RuntimeError(f"HAProxy refused weight {weight}: {'; '.join(weights.failures)}")
        effective = weight / (weight + fleet.weight * (len(serving) - 1))
        console.print(
            f"canary weight {weight} (about {effective:.0%} of HAProxy's requests); watching "
            f"for {seconds:g} s" + (f" or {requests} canary requests" if requests else "")
        )
        mine, theirs = watch(fleet, model, [node.host], seconds, requests, load)
        rows = c.judge(mine, theirs, answers, limits)
    except Exception as err:  # noqa: BLE001 (no verdict is a failed canary: roll it back)
        rows = [c.Row("comparison", "", "", "a verdict", False)]
        console.print(f"[red]no verdict on the canary: {err}[/]")
    finally:
        # Its configured weight again, whatever happened above.
        restored = run_playbook(
            "canary weight",
            "weights.yml",
            inventory,
            extra_vars={"rollout_weights": {node.instance: "100%"}},
            console=console,
        )
        if restored.rc != 0:
            console.print(
                f"[red]could not set {node.instance}'s weight back: run `ansible-playbook -i "
                f'{inventory} playbooks/weights.yml -e \'{{"rollout_weights": '
                f'{{"{node.instance}": "100%"}}}}\'` or reload HAProxy[/]'
            )
    table = Table(title=f"canary {node.instance} against the old release")
    for col in ("check", "canary", "old", "limit", "result"):
        table.add_column(col)
    for r in rows:
        table.add_row(
            r.check, r.canary, r.old, r.limit, "[green]pass[/]" if r.passed else "[red]FAIL[/]"
        )
    console.print(table)
    add_to_record(
        first.record,
        "canary",
        c.as_record(rows, limits, instance=node.instance, weight=weight, seconds=seconds),
    )
    if not all(r.passed for r in rows):
        back = run_playbook(
            "rollback canary", "rollback.yml", inventory, limit=",".join(members), console=console
        )
        print_summary(back)
        if back.rc != 0:
            fail(f"the canary regressed and rolling it back failed: see {back.record}", back.rc)
        fail(
            f"the canary regressed ({', '.join(r.check for r in rows if not r.passed)}): "
            f"instance {node.instance} was rolled back, no other instance was touched"
            f"{_too_few(rows, limits, seconds, load)}; the comparison is in {first.record}",
            CANARY_REGRESSED,
        )
    console.print("[green]the canary passed: rolling the other instances[/]")
    rest = run_playbook(
        "rollout",
        "rolling_update.yml",
        inventory,
        extra_vars=extra_vars,
        limit=",".join(others),
        console=console,
    )
    print_summary(rest)
    if rest.rc != 0:
        raise typer.Exit(rest.rc)


@changes_the_fleet("rollout")
def rollout(
    version: str | None = typer.Option(
        None, "--version", help="Model version to roll out (default: the inventory's)."
    ),
    model: str | None = typer.Option(
        None, "--model", help="The served model whose instances roll (needed with several)."
    ),
    inventory: Path | None = INVENTORY,
    serial: int = SERIAL,
    max_fail_percentage: int = MAX_FAIL_PERCENTAGE,
    extra: list[str] = EXTRA,
    canary: bool = typer.Option(
        False, "--canary", help="Switch one instance first and compare it with the old release."
    ),
    canary_share: float = typer.Option(
        10.0, help="Percent of HAProxy's requests the canary gets while it is compared."
    ),
    canary_seconds: float = typer.Option(60.0, help="How long the comparison watches."),
    canary_requests: int = typer.Option(
        0, help="End the comparison once the canary answered this many requests (0: no limit)."
    ),
    canary_load: int = typer.Option(
        0,
        help="Requests in flight the CLI adds through the load balancer while it watches "
        "(0: judge on live traffic alone).",
    ),
    golden: Path | None = GOLDEN,
    golden_may_change: bool = GOLDEN_MAY_CHANGE,
    max_error_rate_increase: float = MAX_ERROR_RATE_INCREASE,
    max_latency_ratio: float = MAX_LATENCY_RATIO,
    min_requests: int = MIN_REQUESTS,
    from_inventory: bool = typer.Option(
        False,
        "--from-inventory",
        help="Roll the inventory's values for what earlier rollouts recorded as the release.",
    ),
) -> None:
    """Roll a model version, engine version or engine settings out, instance by instance:
    pre-fetch everywhere, then drain, switch, wait until ready, re-enable. A failed
    instance goes back to what it ran and the run stops."""
    extra_vars = parse_extra_vars(extra) | _batch_vars(serial, max_fail_percentage)
    if "inference_engine_group_backend" in extra_vars:
        # The members of a native group and of a Ray group run different units; a rollout
        # saves and restores one engine unit, so a failed switch could not go back.
        fail(
            "a rollout does not change a multi-node instance's back end "
            "(inference_engine_group_backend): its members run different units, and a failed "
            "switch could not be undone. docs/pipeline.md says what is supported"
        )
    if version is not None:
        extra_vars["inferfleet_model_version"] = version
    extra_vars |= _release_vars(extra_vars) | {"rollout_release_reset": from_inventory}
    released = extra_vars["rollout_release_vars"]
    path = resolve_inventory(inventory)
    if canary:
        if not 0 < canary_share < 100:
            fail(f"--canary-share {canary_share:g}: give a percentage above 0 and below 100")
        if canary_seconds <= 0 or canary_requests < 0 or canary_load < 0:
            fail("--canary-seconds must be above 0; --canary-requests and --canary-load 0 or more")
        limits, prompts = verdict_settings(
            golden, golden_may_change, max_error_rate_increase, max_latency_ratio, min_requests
        )
    model, limit = _model_hosts(path, model, "rollout")
    if canary:
        _canary(
            path,
            model,
            extra_vars,
            limits,
            prompts,
            canary_share / 100,
            canary_seconds,
            canary_requests,
            canary_load,
        )
        _released(released)
        raise typer.Exit(0)
    result = run_playbook(
        "rollout",
        "rolling_update.yml",
        path,
        extra_vars=extra_vars,
        limit=limit,
        console=console,
    )
    print_summary(result)
    if result.rc == 0:
        _released(released)
    raise typer.Exit(result.rc)


@changes_the_fleet("rollback")
def rollback(
    model: str | None = typer.Option(
        None, "--model", help="The served model whose instances go back (needed with several)."
    ),
    inventory: Path | None = INVENTORY,
    serial: int = SERIAL,
    max_fail_percentage: int = MAX_FAIL_PERCENTAGE,
    extra: list[str] = EXTRA,
) -> None:
    """Go back to what each instance ran before the last rollout (model version and engine
    settings, still on the nodes: no download), instance by instance."""
    path = resolve_inventory(inventory)
    _, limit = _model_hosts(path, model, "rollback")
    result = run_playbook(
        "rollback",
        "rollback.yml",
        path,
        extra_vars=parse_extra_vars(extra) | _batch_vars(serial, max_fail_percentage),
        limit=limit,
        console=console,
    )
    print_summary(result)
    if result.rc == 0:
        console.print(
            "rolled back: each node runs the release it ran before, and later deploys keep it "
            "(as recorded then, or as deployed from the inventory)"
        )
    raise typer.Exit(result.rc)
