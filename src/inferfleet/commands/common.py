"""What the commands share: inventory resolution, extra-vars parsing, the summary table."""

from __future__ import annotations

from pathlib import Path

import typer
import yaml
from rich.console import Console
from rich.table import Table

from inferfleet.runner import ROOT, RunResult, summary_rows

LAB_INVENTORY = ROOT / "inventories" / "lab"
console = Console()


def fail(message: str, code: int = 1) -> None:
    """One line that says what to do; no traceback."""
    console.print(f"[red]error:[/] {message}", soft_wrap=True)
    raise typer.Exit(code)


def resolve_inventory(inventory: Path | None) -> Path:
    path = inventory or LAB_INVENTORY
    if not path.exists():
        hint = "run `inferfleet lab up` first" if inventory is None else "check the -i path"
        fail(f"inventory {path} does not exist: {hint}")
    if (
        path.resolve() == LAB_INVENTORY.resolve()
        and not (path / "group_vars" / "all" / "secrets.yml").exists()
    ):
        fail("the lab is not up (no generated keys in inventories/lab): run `inferfleet lab up`")
    return path


def parse_extra_vars(pairs: list[str]) -> dict:
    """`-e key=value` (value parsed as YAML) or `-e @file.yml`, like ansible-playbook."""
    out: dict = {}
    for item in pairs:
        if item.startswith("@"):
            path = Path(item[1:])
            if not path.is_file():
                fail(f"extra-vars file {path} does not exist")
            loaded = yaml.safe_load(path.read_text()) or {}
            if not isinstance(loaded, dict):
                fail(f"extra-vars file {path} must hold a mapping")
            out.update(loaded)
        elif "=" in item:
            key, value = item.split("=", 1)
            out[key] = yaml.safe_load(value) if value else ""
        else:
            fail(f"-e {item!r}: write key=value or @file.yml")
    return out


def print_summary(result: RunResult) -> None:
    table = Table(title="hosts")
    for col in ("host", "ok", "changed", "failed", "unreachable", "skipped"):
        table.add_column(col, justify="left" if col == "host" else "right")
    for row in summary_rows(result.stats):
        table.add_row(*map(str, row))
    console.print(table)
    verdict = {
        0: "[green]success[/]",
        2: "[red]a host failed[/]",
        3: "[red]unreachable[/]",
        4: "[red]preflight refused the inventory[/]",
        130: "[yellow]cancelled[/]",
    }
    console.print(f"{verdict.get(result.rc, result.status)}; record: {result.record}")
