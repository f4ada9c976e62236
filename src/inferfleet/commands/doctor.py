"""`inferfleet doctor`: read the fleet (playbooks/doctor.yml, and each instance's greedy
answer) and say what is wrong, with the evidence, the likely cause and the fix."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from inferfleet import doctor as d
from inferfleet import fleet as fleet_mod
from inferfleet import verify as v
from inferfleet.commands.common import console, fail, resolve_inventory
from inferfleet.runner import add_to_record, run_playbook


def greedy_replies(inventory: Path) -> dict[str, str | None]:
    """Each instance's greedy answer from its serving node (None where it gave none)."""
    fleet = fleet_mod.load(inventory)
    nodes = fleet.serving

    def ask(node: fleet_mod.Node) -> str | None:
        call = v.complete(node.base, node.model, fleet.engine_key)
        return call.text if call.ok else None

    with ThreadPoolExecutor(max_workers=8) as pool:
        return dict(zip([n.host for n in nodes], pool.map(ask, nodes), strict=True))


def show(finding: d.Finding) -> None:
    console.print(f"[red]{finding.case}[/]: {escape(finding.symptom)}", soft_wrap=True)
    for line in finding.evidence:
        console.print(f"  evidence: {escape(line)}", soft_wrap=True)
    console.print(f"  likely cause: {escape(finding.cause)}", soft_wrap=True)
    console.print(f"  fix: {escape(finding.fix)}", soft_wrap=True)


def doctor(
    inventory: Path | None = typer.Option(None, "-i", "--inventory", help="Inventory path."),
    as_json: bool = typer.Option(False, "--json", help="Print the findings as JSON."),
) -> None:
    """Diagnose the fleet: engines that cannot start for memory, instances that answer
    differently, backends held down, requests queueing, slow pipeline links. Exit 0:
    nothing found, 1: findings, 2: the fleet could not be read."""
    path = resolve_inventory(inventory)
    result = run_playbook("doctor", "doctor.yml", path, console=Console(quiet=True))
    if not result.data.get("inferfleet_status_nodes"):
        fail(f"doctor.yml read no engine node (run record {result.record}): "
             + ("; ".join(result.failures) or "is the `inference` group empty?"), code=2)
    try:
        replies = greedy_replies(path)
    except Exception as err:  # noqa: BLE001 (one line for a person, not a traceback)
        fail(f"cannot read the inventory: {err}", code=2)
    findings = d.diagnose(result.data, replies, result.failures)
    add_to_record(result.record, "findings", [f.to_dict() for f in findings])
    read = len(result.data["inferfleet_status_nodes"])
    if as_json:
        out = {"findings": [f.to_dict() for f in findings], "record": str(result.record)}
        print(json.dumps(out, indent=2))
    else:
        for finding in findings:
            show(finding)
        links = len(result.data.get("inferfleet_doctor_links") or {})
        console.print(
            f"{len(findings)} finding(s)" if findings else
            f"nothing found: {read} engine node(s) read, every instance of a model answers "
            "the same, no backend held down, no request waiting"
            + (f", {links} pipeline member(s)' links measured" if links else ""),
            soft_wrap=True,
        )
        console.print(f"record: {result.record}", soft_wrap=True)
    raise typer.Exit(1 if findings else 0)
