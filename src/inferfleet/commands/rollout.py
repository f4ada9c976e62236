"""`inferfleet rollout` / `inferfleet rollback`: playbooks/rolling_update.yml and
playbooks/rollback.yml, one batch of instances at a time, over the lab by default."""

from __future__ import annotations

from pathlib import Path

import typer

from inferfleet.commands.common import (
    console,
    fail,
    parse_extra_vars,
    print_summary,
    resolve_inventory,
)
from inferfleet.runner import run_playbook

# The options both commands take.
INVENTORY = typer.Option(None, "-i", "--inventory", help="Inventory path.")
SERIAL = typer.Option(1, help="Instances switched at a time.")
MAX_FAIL_PERCENTAGE = typer.Option(
    0, help="Failed instances (percent of a batch) tolerated before the run stops."
)
EXTRA = typer.Option([], "-e", "--extra-vars", help="key=value or @file.yml")


def _batch_vars(serial: int, max_fail_percentage: int) -> dict:
    if serial < 1:
        fail(f"--serial {serial}: roll at least one instance per batch")
    if not 0 <= max_fail_percentage <= 100:
        fail(f"--max-fail-percentage {max_fail_percentage}: give a percentage, 0 to 100")
    return {"rollout_serial": serial, "rollout_max_fail_percentage": max_fail_percentage}


def rollout(
    version: str | None = typer.Option(
        None, "--version", help="Model version to roll out (default: the inventory's)."
    ),
    inventory: Path | None = INVENTORY,
    serial: int = SERIAL,
    max_fail_percentage: int = MAX_FAIL_PERCENTAGE,
    extra: list[str] = EXTRA,
) -> None:
    """Roll a model version, engine version or engine settings out, instance by instance:
    pre-fetch everywhere, then drain, switch, wait until ready, re-enable. A failed
    instance goes back to what it ran and the run stops."""
    extra_vars = parse_extra_vars(extra) | _batch_vars(serial, max_fail_percentage)
    if version is not None:
        extra_vars["inferfleet_model_version"] = version
    result = run_playbook(
        "rollout",
        "rolling_update.yml",
        resolve_inventory(inventory),
        extra_vars=extra_vars,
        console=console,
    )
    print_summary(result)
    if result.rc == 0 and version is not None:
        console.print(
            f"every instance serves {version}: set inferfleet_model_version: {version} in the "
            "inventory, or the next deploy rolls it back"
        )
    raise typer.Exit(result.rc)


def rollback(
    inventory: Path | None = INVENTORY,
    serial: int = SERIAL,
    max_fail_percentage: int = MAX_FAIL_PERCENTAGE,
    extra: list[str] = EXTRA,
) -> None:
    """Go back to what each instance ran before the last rollout (model version and engine
    settings, still on the nodes: no download), instance by instance."""
    result = run_playbook(
        "rollback",
        "rollback.yml",
        resolve_inventory(inventory),
        extra_vars=parse_extra_vars(extra) | _batch_vars(serial, max_fail_percentage),
        console=console,
    )
    print_summary(result)
    if result.rc == 0:
        console.print(
            "rolled back: set inferfleet_model_version (and any engine setting you changed) "
            "back in the inventory, or the next deploy rolls forward again"
        )
    raise typer.Exit(result.rc)
