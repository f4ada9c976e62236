"""What the commands share: inventory resolution, extra-vars parsing, the summary table."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import inspect
import os
import secrets
import time
from pathlib import Path

import typer
import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from inferfleet import runner
from inferfleet.paths import LAB_INVENTORY
from inferfleet.runner import RunResult, summary_rows

console = Console()


def fail(message: str, code: int = 1) -> None:
    """One line that says what to do; no traceback. The message is plain text (its
    brackets, as in `inferfleet[lab]`, are not markup)."""
    console.print(f"[red]error:[/] {escape(message)}", soft_wrap=True)
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
        fail(f"the lab is not up (no generated keys in {path}): run `inferfleet lab up`")
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
        6: "[red]another operation holds the fleet's lock[/]",
        130: "[yellow]cancelled[/]",
    }
    # one line, never folded: the record's path is read back by scripts
    console.print(
        f"{verdict.get(result.rc, result.status)}; record: {result.record}", soft_wrap=True
    )


@contextlib.contextmanager
def controller_lock(inventory: Path, command: str):
    """One command that changes the fleet of `inventory` at a time (deploy, rollout,
    rollback, scale): a second one is refused, naming the first. The lock is the
    kernel's (flock), so it goes with the process that held it, however it ended."""
    runner.RUNS_DIR.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = hashlib.sha256(str(inventory.resolve()).encode()).hexdigest()[:16]
    fd = os.open(runner.RUNS_DIR / f".lock-{key}", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 512, 0).decode(errors="replace").strip() or "another run"
            fail(
                f"{holder} is changing the fleet of {inventory}: wait until it ends "
                "(one deploy, rollout, rollback or scale at a time)"
            )
        os.ftruncate(fd, 0)
        started = time.strftime("%Y-%m-%d %H:%M:%S")
        os.pwrite(fd, f"`inferfleet {command}` (pid {os.getpid()}, since {started})".encode(), 0)
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def holding_fleet_lock(inventory: Path, command: str, force: bool = False):
    """Hold the fleet's own lock (playbooks/lock.yml, on the fleet: across controllers)
    for a whole command: its first playbook takes it, the others hold it already, and it
    is released at the end, however the command ended."""
    held = runner.HELD = runner.FleetLock(secrets.token_urlsafe(18), runner.holder(command), force)
    try:
        yield
    finally:
        if held.taken:
            _release(inventory, command)
        runner.HELD = None


def _release(inventory: Path, command: str) -> None:
    release = runner.run_playbook(
        f"{command} unlock",
        "lock.yml",
        inventory,
        extra_vars={"fleet_lock_state": "absent", "fleet_lock_release": True},
        console=console,
    )
    if release.rc != 0:
        console.print(
            f"[red]could not release the fleet's lock ({'; '.join(release.failures)}): "
            f"run `ansible-playbook -i {inventory} playbooks/lock.yml "
            "-e fleet_lock_state=absent -e inferfleet_force_unlock=true` once no operation "
            "runs[/]",
            soft_wrap=True,
        )


FORCE_UNLOCK = typer.Option(
    False,
    "--force-unlock",
    help="Break the fleet's lock held by another operation (only once it is known to be over).",
)


def changes_the_fleet(command: str):
    """Run the decorated command under controller_lock (this controller) and the fleet's own
    lock for its -i inventory; it gains a --force-unlock option."""

    def wrap(fn):
        @functools.wraps(fn)
        def locked(*args, force_unlock: bool = False, **kwargs):
            path = resolve_inventory(kwargs.get("inventory"))
            if force_unlock:
                console.print(
                    "[yellow]--force-unlock: the fleet's lock is broken whoever holds it; if "
                    "that operation still runs, two now change the fleet at once[/]"
                )
            with controller_lock(path, command), holding_fleet_lock(path, command, force_unlock):
                return fn(*args, **kwargs)

        sig = inspect.signature(fn)
        force = inspect.Parameter(
            "force_unlock", inspect.Parameter.KEYWORD_ONLY, default=FORCE_UNLOCK, annotation=bool
        )
        locked.__signature__ = sig.replace(parameters=[*sig.parameters.values(), force])
        return locked

    return wrap
