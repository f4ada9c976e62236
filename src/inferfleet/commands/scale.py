"""`inferfleet scale`: add instances to a fleet that serves, or take them out
(playbooks/scale.yml), and keep the inventory in step: added hosts join the `inference`
group (back from `standby`, or new), removed ones move to `standby` with their
variables once they are out of every load balancer and stopped."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from inferfleet import fleet as fleet_mod
from inferfleet import inventory_edit
from inferfleet.commands.common import (
    changes_the_fleet,
    console,
    fail,
    parse_extra_vars,
    print_summary,
    resolve_inventory,
)
from inferfleet.runner import CANCELLED, LOCKED, PREFLIGHT_REFUSED, add_to_record, run_playbook


def _hosts(values: list[str]) -> list[str]:
    """Hosts from repeated or comma-separated options, in order, each once."""
    out: list[str] = []
    for value in values:
        out += [h.strip() for h in value.split(",") if h.strip() and h.strip() not in out]
    return out


def _model_vars(inventory: Path, model: str) -> dict:
    """The host variables that make a new host serve `model` as its instances do: its
    name and the version the inventory gives them."""
    try:
        fleet = fleet_mod.load(inventory)
    except Exception as err:  # noqa: BLE001 (one line for a person, not a traceback)
        fail(f"cannot read the inventory: {err}")
    serving = fleet.serving_of(model)
    if not serving:
        fail(
            f"--model {model}: no instance serves it (this fleet serves "
            f"{', '.join(fleet.models)}); a new model starts with its hosts in the inventory "
            "(inferfleet_model_name on them) and `inferfleet deploy`"
        )
    return {"inferfleet_model_name": model, "inferfleet_model_version": serving[0].version}


@changes_the_fleet("scale")
def scale(
    add: list[str] = typer.Option([], "--add", help="Hosts to add (repeat, or comma-separate)."),
    remove: list[str] = typer.Option([], "--remove", help="Hosts to take out."),
    instance: str | None = typer.Option(
        None, "--instance", help="With --add: the instance the new hosts form (a pipeline group)."
    ),
    model: str | None = typer.Option(
        None, "--model", help="With --add: the served model the new hosts serve."
    ),
    force: bool = typer.Option(False, "--force", help="Allow taking out the last instance."),
    purge_model: bool = typer.Option(
        False, "--purge-model", help="With --remove: delete the model cache on the hosts too."
    ),
    inventory: Path | None = typer.Option(None, "-i", "--inventory", help="Inventory path."),
    extra: list[str] = typer.Option([], "-e", "--extra-vars", help="key=value or @file.yml"),
) -> None:
    """Add or remove instances; the others keep serving, untouched."""
    joining, leaving = _hosts(add), _hosts(remove)
    if bool(joining) == bool(leaving):
        fail("give --add HOST... or --remove HOST... (one of them)")
    if instance is not None and not joining:
        fail("--instance names the instance that --add hosts form; it has no use with --remove")
    if purge_model and not leaving:
        fail("--purge-model goes with --remove")
    if model is not None and not joining:
        fail("--model names the model that --add hosts serve; it has no use with --remove")
    path = resolve_inventory(inventory)
    extra_vars = parse_extra_vars(extra)
    serves = _model_vars(path, model) if model is not None else {}
    try:
        hosts_file = inventory_edit.group_file(path, joining or leaving)
        before = hosts_file.read_text()
        after = (
            inventory_edit.join(before, joining, instance, serves)
            if joining
            else inventory_edit.leave(before, leaving)
        )
    except inventory_edit.InventoryEditError as err:
        fail(str(err))

    started = time.monotonic()
    if joining:
        # The play needs the new hosts in the group. If it is refused (or never runs)
        # nothing was touched and the file goes back; a run that failed later may have
        # started engines or added servers, so the hosts stay listed, to be finished
        # or taken out.
        hosts_file.write_text(after)
        result = None
        try:
            result = run_playbook(
                "scale add",
                "scale.yml",
                path,
                extra_vars={**extra_vars, "scale_add": joining},
                console=console,
            )
        finally:
            if result is None or result.rc in (PREFLIGHT_REFUSED, CANCELLED, LOCKED):  # nothing ran
                hosts_file.write_text(before)
                console.print(f"{hosts_file} is as it was: {', '.join(joining)} not added")
            elif result.rc != 0:
                console.print(
                    f"{', '.join(joining)} stay in the `{inventory_edit.SERVING}` group of "
                    f"{hosts_file}, partly set up: fix what failed and run the same command "
                    f"again, or take them out with `inferfleet scale --remove {','.join(joining)}`"
                )
    else:
        result = run_playbook(
            "scale remove",
            "scale.yml",
            path,
            extra_vars={
                **extra_vars,
                "scale_remove": leaving,
                "scale_force": force,
                "scale_purge_model": purge_model,
            },
            console=console,
        )
        if result.rc == 0:
            hosts_file.write_text(after)
    seconds = round(time.monotonic() - started, 1)
    add_to_record(
        result.record,
        "scale",
        {"add": joining, "remove": leaving, "seconds": seconds, "inventory": str(hosts_file)},
    )
    print_summary(result)
    if result.rc == 0:
        verb = "serve" if joining else f"moved to the `{inventory_edit.STANDBY}` group"
        console.print(
            f"{', '.join(joining or leaving)} {verb} in {seconds:.0f} s ({hosts_file} updated); "
            "`inferfleet status` shows the fleet now"
        )
    raise typer.Exit(result.rc)
