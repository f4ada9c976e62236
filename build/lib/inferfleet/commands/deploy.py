"""`inferfleet deploy`: site.yml against an inventory (the lab's by default)."""

from __future__ import annotations

from pathlib import Path

import typer

from inferfleet.commands.common import (
    changes_the_fleet,
    console,
    parse_extra_vars,
    print_summary,
    resolve_inventory,
)
from inferfleet.runner import run_playbook


@changes_the_fleet("deploy")
def deploy(
    inventory: Path | None = typer.Option(None, "-i", "--inventory", help="Inventory path."),
    limit: str | None = typer.Option(None, "--limit", help="Hosts or groups to touch."),
    tags: str | None = typer.Option(None, "--tags", help="Only tasks with these tags."),
    check: bool = typer.Option(False, "--check", help="Report what would change; change nothing."),
    diff: bool = typer.Option(False, "--diff", help="Show the differences of changed files."),
    extra: list[str] = typer.Option([], "-e", "--extra-vars", help="key=value or @file.yml"),
) -> None:
    """Deploy the fleet: preflight, host preparation, model sync, engines, load balancer."""
    result = run_playbook(
        "deploy",
        "site.yml",
        resolve_inventory(inventory),
        extra_vars=parse_extra_vars(extra),
        limit=limit,
        tags=tags,
        check=check,
        diff=diff,
        console=console,
    )
    print_summary(result)
    raise typer.Exit(result.rc)
