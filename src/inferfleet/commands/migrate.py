"""`inferfleet migrate --to NEW`: from the topology the fleet's inventory describes to the
one NEW describes, on the same machines, one step at a time (inferfleet/migrate.py plans
the steps). Each step takes a set of hosts out as their old instances (scale.yml remove:
drained, out of every load balancer, stopped), brings them back as the new instances
(scale.yml add: a new pipeline's network measured first, synced, started, added with slow
start), gives the new instances a small share of the requests, compares them with the
instances of the old layout over the same window (as a canary) and their KV cache with the
capacity plan, and widens them to their full weight, or steps back to the old layout when
they regress."""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer
from rich.table import Table

from inferfleet import canary as c
from inferfleet import fleet as fleet_mod
from inferfleet import migrate as m
from inferfleet import verify as v
from inferfleet.commands.common import (
    changes_the_fleet,
    console,
    fail,
    parse_extra_vars,
    print_summary,
    resolve_inventory,
)
from inferfleet.commands.rollout import (
    GOLDEN,
    GOLDEN_MAY_CHANGE,
    MAX_ERROR_RATE_INCREASE,
    MAX_LATENCY_RATIO,
    MIN_REQUESTS,
    verdict_settings,
    watch,
)
from inferfleet.paths import RUNS_DIR
from inferfleet.runner import CANARY_REGRESSED, RunResult, add_to_record, run_playbook


def _load(path: Path) -> tuple[m.Inventory, fleet_mod.Fleet]:
    try:
        return m.read(path), fleet_mod.load(path)
    except ValueError as err:
        fail(str(err))
    except Exception as err:  # noqa: BLE001 (one line for a person, not a traceback)
        fail(f"cannot read the inventory {path}: {err}")


def _capacity_text(left: dict[str, tuple[int, int]]) -> str:
    return "; ".join(f"{model}: {n} of {of} instances" for model, (n, of) in left.items())


def _plan_table(steps: list[m.Step], before: fleet_mod.Fleet, minimum: float) -> list[str]:
    """Print the steps; return what refuses them (a step leaving less than `minimum` %)."""
    table = Table(title="migration steps")
    for col in ("step", "hosts", "now", "after", "serving while it runs"):
        table.add_column(col, overflow="fold")
    short = []
    for i, step in enumerate(steps):
        left = m.capacity(before, steps, i)
        table.add_row(
            str(i + 1),
            ", ".join(step.hosts),
            ", ".join(step.old),
            ", ".join(step.new),
            _capacity_text(left),
        )
        for model, (n, of) in left.items():
            if n == 0 or 100 * n / of < minimum:
                short.append(
                    f"step {i + 1} ({', '.join(step.hosts)}) would leave {model} {n} of {of} "
                    f"serving instances, below --min-capacity {minimum:g} %"
                )
    console.print(table)
    return short


def _scale(what: str, inventory: Path, hosts: list[str], extra_vars: dict) -> RunResult:
    key = "scale_add" if what == "add" else "scale_remove"
    more = {"scale_replace": True} if what == "add" else {}
    result = run_playbook(
        f"migrate {what}",
        "scale.yml",
        inventory,
        extra_vars={**extra_vars, key: hosts, **more},
        console=console,
    )
    print_summary(result)
    return result


def _weights(inventory: Path, weights: dict) -> bool:
    return (
        run_playbook(
            "migrate weight",
            "weights.yml",
            inventory,
            extra_vars={"rollout_weights": weights},
            console=console,
        ).rc
        == 0
    )


def _answers(
    fleet: fleet_mod.Fleet, hosts: list[str], model: str, golden: list[c.Golden]
) -> list[str]:
    """The golden prompts' greedy answers from a serving instance of `model`, the first
    on `hosts` if one is there."""
    serving = fleet.serving_of(model)
    node = next((n for n in serving if n.host in hosts), serving[0])
    return [v.complete(node.base, model, fleet.engine_key, g.prompt).text for g in golden]


def _table(title: str, rows: list[c.Row]) -> Table:
    table = Table(title=title)
    for col in ("check", "new", "old", "limit", "result"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(
            r.check, r.canary, r.old, r.limit, "[green]pass[/]" if r.passed else "[red]FAIL[/]"
        )
    return table


def _compare(
    inventory: Path,
    step: m.Step,
    reference: dict[str, list[str]],
    golden: list[c.Golden],
    limits: c.Thresholds,
    shares: list[float],
    seconds: float,
    requests: int,
    load: int,
    kv: dict[str, dict],
) -> list[tuple[str, float, list[c.Row]]]:
    """Each model's new instances of the step at each of `shares` of the requests in turn,
    compared with the rest of the fleet over the same window, and their KV cache with the
    plan (`kv`: the add run's capacity figures by host); then full weight. The first
    comparison that fails ends it (the caller steps back: the new instances stay at their
    small weight until drained)."""
    fleet = fleet_mod.load(inventory)
    new = [n for n in fleet.serving if n.instance in step.new]
    out = []
    for model in dict.fromkeys(step.models):
        mine = [n for n in new if n.model == model]
        names = ", ".join(n.instance for n in mine)
        others = len(fleet.serving_of(model)) - len(mine)
        answers: list[str] | None = None
        for share in shares:
            weight = max(1, c.weight_for_share(share, others, fleet.weight) // len(mine))
            try:
                # asked before the new instances take a share: a just-started engine's
                # first, slow answers (its warm-up) fall outside the latency window
                if answers is None:
                    answers = _answers(fleet, [n.host for n in mine], model, golden)
                if not _weights(inventory, {n.instance: weight for n in mine}):
                    raise RuntimeError(f"HAProxy refused weight {weight}")
                console.print(
                    f"{model}: the new instances {names} at weight {weight} each (about "
                    f"{share:.0%} of HAProxy's requests in all once servers are busy: "
                    f"leastconn spreads evenly among idle ones); watching for {seconds:g} s"
                    + (f" or {requests} requests" if requests else "")
                )
                new_side, old_side = watch(
                    fleet, model, [n.host for n in mine], seconds, requests, load
                )
                rows = c.judge(
                    new_side,
                    old_side,
                    list(zip(golden, answers, reference[model], strict=True)),
                    limits,
                ) + c.kv_rows([(n.instance, n.host) for n in mine], kv)
            except Exception as err:  # noqa: BLE001 (no verdict is a regression: step back)
                rows = [c.Row("comparison", "", "", "a verdict", False)]
                console.print(f"[red]no verdict on the new instances of {model}: {err}[/]")
            console.print(
                _table(
                    f"step: {model} on {', '.join(step.new)} at {share:.0%} against the "
                    "other instances",
                    rows,
                )
            )
            out.append((model, share, rows))
            if not all(r.passed for r in rows):
                return out
        if not _weights(inventory, {n.instance: "100%" for n in mine}):
            console.print(
                f"[red]could not set {names}'s weight back: reload HAProxy (`inferfleet "
                "deploy` with the new inventory)[/]"
            )
    return out


@changes_the_fleet("migrate")
def migrate(
    to: Path = typer.Option(..., "--to", help="The inventory of the layout to migrate to."),
    inventory: Path | None = typer.Option(
        None, "-i", "--inventory", help="The inventory of the layout the fleet serves now."
    ),
    min_capacity: float = typer.Option(
        50.0, help="Percent of each model's serving instances that must keep serving in a step."
    ),
    share: list[float] = typer.Option(
        [10.0],
        help="Percent of HAProxy's requests the new instances get while compared; again "
        "to widen in steps (--share 10 --share 50): each share is watched and judged in "
        "turn, then full weight.",
    ),
    seconds: float = typer.Option(60.0, help="How long each step's comparison watches."),
    requests: int = typer.Option(
        0, help="End a comparison once the new instances answered this many (0: no limit)."
    ),
    load: int = typer.Option(
        0, help="Requests in flight the CLI adds through the load balancer while it watches."
    ),
    plan_only: bool = typer.Option(
        False, "--plan", help="Print the steps and what serves during each; change nothing."
    ),
    golden: Path | None = GOLDEN,
    golden_may_change: bool = GOLDEN_MAY_CHANGE,
    max_error_rate_increase: float = MAX_ERROR_RATE_INCREASE,
    max_latency_ratio: float = MAX_LATENCY_RATIO,
    min_requests: int = MIN_REQUESTS,
    extra: list[str] = typer.Option([], "-e", "--extra-vars", help="key=value or @file.yml"),
) -> None:
    """Change the fleet's topology (pipeline instances to replicas, or back) one step at
    a time while it serves; a step whose new instances regress goes back to the old ones."""
    path = resolve_inventory(inventory)
    if not to.exists():
        fail(f"--to {to} does not exist: give the inventory of the layout to migrate to")
    if not 0 <= min_capacity < 100:
        fail(f"--min-capacity {min_capacity:g}: give a percentage, 0 or more and below 100")
    for value in share:
        if not 0 < value < 100:
            fail(f"--share {value:g}: give a percentage above 0 and below 100")
    if share != sorted(set(share)):
        fail(
            f"--share {' --share '.join(f'{v:g}' for v in share)}: give the shares in "
            "increasing order, each once (the new instances widen from one to the next)"
        )
    if seconds <= 0 or requests < 0 or load < 0:
        fail("--seconds must be above 0; --requests and --load 0 or more")
    limits, golden_prompts = verdict_settings(
        golden, golden_may_change, max_error_rate_increase, max_latency_ratio, min_requests
    )
    extra_vars = parse_extra_vars(extra)
    old, before = _load(path)
    new, after = _load(to)
    try:
        steps = m.plan(old, new, before, after)
    except ValueError as err:
        fail(str(err))
    if not steps:
        console.print(f"nothing to migrate: the engine hosts are the same in {path} and {to}")
        raise typer.Exit(0)
    unserved = sorted({mo for s in steps for mo in s.models} - set(before.models))
    if unserved:
        fail(
            f"the new layout serves {', '.join(unserved)}, which nothing serves now: a migration "
            "compares new instances with old ones of the same model; deploy a new model with "
            "`inferfleet scale --add` or `inferfleet deploy`"
        )
    if not before.balancers:
        fail("a migration needs a `loadbalancers` host to shift requests between the layouts")
    short = _plan_table(steps, before, min_capacity)
    if short:
        fail("; ".join(short) + ": lower --min-capacity, or add instances first", 4)
    # Each step's inventories: before it, the hosts of earlier steps as the new layout
    # (a step that fails ends the migration, so later files are only used once it passed)
    workdir = RUNS_DIR / time.strftime("migrate-%Y%m%d-%H%M%S")
    files = []
    for i, step in enumerate(steps):
        moved = {h for s in steps[:i] for h in s.hosts}
        files.append(
            (
                m.write(m.mixed(old, new, moved), workdir / f"step{i + 1}-before.yml"),
                m.write(
                    m.mixed(old, new, moved | set(step.hosts)), workdir / f"step{i + 1}-after.yml"
                ),
            )
        )
    if plan_only:
        console.print(
            "Each step by hand with ansible-playbook (no comparison and no step back; "
            "the files hold the fleet's keys):"
        )
        for i, (step, (was, then)) in enumerate(zip(steps, files, strict=True)):
            hosts = json.dumps(step.hosts)
            console.print(
                f"  {i + 1}. ansible-playbook -i {was} inferfleet.fleet.scale -e "
                f"'{{\"scale_remove\": {hosts}}}'\n"
                f"     ansible-playbook -i {then} inferfleet.fleet.scale -e "
                f"'{{\"scale_add\": {hosts}, \"scale_replace\": true}}'",
                markup=False,
                highlight=False,
                soft_wrap=True,  # whole lines, to copy
            )
        raise typer.Exit(0)

    for i, (step, (was, then)) in enumerate(zip(steps, files, strict=True)):
        number = f"step {i + 1} of {len(steps)}"
        console.print(
            f"[bold]{number}: {', '.join(step.hosts)} from {', '.join(step.old)} to "
            f"{', '.join(step.new)}; serving meanwhile: "
            f"{_capacity_text(m.capacity(before, steps, i))}[/]"
        )
        now = fleet_mod.load(was)
        reference = {
            mo: _answers(now, step.hosts, mo, golden_prompts) for mo in dict.fromkeys(step.models)
        }
        removed = _scale("remove", was, step.hosts, extra_vars)
        if removed.rc != 0:
            fail(
                f"{number}: taking out {', '.join(step.old)} failed; the fleet runs {was}. "
                f"See {removed.record}",
                removed.rc,
            )
        added = _scale("add", then, step.hosts, extra_vars)
        verdicts = (
            _compare(
                then,
                step,
                reference,
                golden_prompts,
                limits,
                [v / 100 for v in share],
                seconds,
                requests,
                load,
                added.data.get("inferfleet_kv_cache") or {},
            )
            if added.rc == 0
            else [("", 0.0, [c.Row("the new instances start", "", "", "started", False)])]
        )
        add_to_record(
            added.record,
            "migration",
            {
                "step": i + 1,
                "hosts": step.hosts,
                "old": step.old,
                "new": step.new,
                "comparisons": [
                    c.as_record(rows, limits, model=mo, share=sh) for mo, sh, rows in verdicts
                ],
            },
        )
        if all(r.passed for _, _, rows in verdicts for r in rows):
            console.print(
                f"[green]{number} done: {', '.join(step.new)} serve at full weight; the "
                f"comparison is in {added.record}[/]"
            )
            continue
        failed = [r.check for _, _, rows in verdicts for r in rows if not r.passed]
        console.print(
            f"[red]{number}: the new instances regressed ({', '.join(failed)}): "
            "stepping back to the old layout[/]"
        )
        if added.rc == 0:  # the new instances serve: drained and taken out first
            back = _scale("remove", then, step.hosts, extra_vars)
            if back.rc != 0:
                fail(
                    f"{number} regressed and taking its new instances out failed: see "
                    f"{back.record}",
                    back.rc,
                )
        again = _scale("add", was, step.hosts, extra_vars)
        if again.rc != 0:
            fail(
                f"{number} regressed and bringing {', '.join(step.old)} back failed: see "
                f"{again.record}; the hosts {', '.join(step.hosts)} are out of the fleet",
                again.rc,
            )
        fail(
            f"{number} regressed ({', '.join(failed)}) and stepped back: the old instances "
            f"({', '.join(step.old)}) serve again and the fleet runs {was}; the comparison is "
            f"in {added.record}",
            CANARY_REGRESSED,
        )
    console.print(
        f"[green]migrated: the fleet runs the layout of {to}; give `-i {to}` from now on "
        f"(`inferfleet migrate -i {to} --to {path}` goes back the same way)[/]"
    )
