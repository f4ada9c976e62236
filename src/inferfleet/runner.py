"""Run one playbook through ansible-runner: live progress, a per-host summary, a JSON
record of the run, and an exit code that means something.

Exit codes: 0 success, 2 a host failed, 3 a host was unreachable, 4 the preflight refused
the inventory (a preflight stage left open, see `refused`), 5 a canary regressed (and was
rolled back), 130 cancelled (Ctrl-C).
"""

from __future__ import annotations

import contextlib
import difflib
import importlib.util
import json
import os
import re
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console

from inferfleet import paths

RUNS_DIR = paths.RUNS_DIR
# The CLI's own Ansible settings: the same with a checkout's ansible.cfg or without one.
ANSIBLE_SETTINGS = {
    "ANSIBLE_COLLECTIONS_PATH": os.pathsep.join(
        [str(paths.COLLECTIONS_PATH), "~/.ansible/collections", "/usr/share/ansible/collections"]
    ),
    "ANSIBLE_FORKS": "20",
    "ANSIBLE_INTERPRETER_PYTHON": "auto_silent",
    "ANSIBLE_CALLBACK_RESULT_FORMAT": "yaml",
    "ANSIBLE_GATHERING": "smart",
    "ANSIBLE_PIPELINING": "True",
    "ANSIBLE_FORCE_COLOR": "0",
}
# INFERFLEET_MITOGEN=1 runs the playbooks with Mitogen's linear strategy (the `mitogen`
# extra): one Python per host for the whole run instead of one per task, which cuts a
# no-change run of a large fleet by about half (docs/scaling.md). Ansible's own otherwise.
MITOGEN = "INFERFLEET_MITOGEN"


def strategy_settings() -> dict[str, str]:
    """The Ansible settings that select the run's strategy plugin (none: Ansible's own)."""
    value = os.environ.get(MITOGEN, "")
    if value in ("", "0"):
        return {}
    if value != "1":
        raise SystemExit(
            f"inferfleet: {MITOGEN}={value!r}: set it to 1 (Mitogen) or 0 (Ansible's "
            "own strategy), or unset it"
        )
    spec = importlib.util.find_spec("ansible_mitogen")
    if spec is None:
        raise SystemExit(
            f"inferfleet: {MITOGEN}=1 but Mitogen is not installed here: "
            "pip install 'inferfleet[mitogen]', or unset it"
        )
    plugins = Path(spec.origin).parent / "plugins" / "strategy"
    return {"ANSIBLE_STRATEGY_PLUGINS": str(plugins), "ANSIBLE_STRATEGY": "mitogen_linear"}


ENV_ALLOW = {
    "HOME",
    "PATH",
    "LANG",
    "LC_ALL",
    "TERM",
    "USER",
    "SSH_AUTH_SOCK",
    "TMPDIR",
    "VIRTUAL_ENV",
    "DOCKER_HOST",
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
}
ENV_PREFIXES = ("ANSIBLE_", "AWS_", "INFERFLEET_")
SECRET_KEY = re.compile(r"(key|secret|password|token|credential)", re.IGNORECASE)

OK, HOST_FAILED, UNREACHABLE, PREFLIGHT_REFUSED, CANARY_REGRESSED, CANCELLED = 0, 2, 3, 4, 5, 130
LOCKED = 6  # another operation holds the fleet's lock (playbooks/lock.yml)


@dataclass
class FleetLock:
    """The fleet's lock as this CLI process holds it for one command: every playbook it
    runs meanwhile takes the lock under this token (so they hold it already)."""

    token: str
    holder: dict
    force: bool = False  # --force-unlock: the first playbook breaks whoever holds it
    taken: bool = False  # a playbook took it (so there is one to release)


HELD: FleetLock | None = None  # set by commands.common.holding_fleet_lock


def holder(command: str) -> dict:
    """Who this CLI process is, as the fleet's lock shows it to whoever it refuses; its
    controller, boot id and pid let a later run here tell a lock whose process is gone."""
    import getpass

    from ansible_collections.inferfleet.fleet.plugins.module_utils import fleet_lock

    return {"user": getpass.getuser(), "command": f"inferfleet {command}"} | (
        fleet_lock.this_controller(os.getpid())
    )


def mask(value, key: str = ""):
    """A copy of `value` with every secret-looking entry replaced by '***'."""
    if isinstance(value, dict):
        return {k: mask(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [mask(v, key) for v in value]
    if key and SECRET_KEY.search(key) and value not in (None, "", [], {}):
        return "***"
    return value


@contextlib.contextmanager
def allowed_environment() -> Iterator[None]:
    """Pass only ANSIBLE_*, AWS_*, INFERFLEET_* and a short allow-list to the playbook."""
    saved = dict(os.environ)
    keep = {k: v for k, v in saved.items() if k in ENV_ALLOW or k.startswith(ENV_PREFIXES)}
    # ansible-playbook lives beside this Python (the virtualenv), activated or not
    bin_dir = str(Path(sys.executable).parent)
    keep["PATH"] = os.pathsep.join([bin_dir, keep.get("PATH", os.defpath)])
    os.environ.clear()
    os.environ.update(keep)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@dataclass
class Progress:
    """Follows ansible-runner's events and prints one line per task and per host result."""

    console: Console
    hosts: dict[str, dict[str, int]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    # What the playbook handed the CLI with set_stats (the run's artifact data)
    data: dict = field(default_factory=dict)

    def count(self, host: str, what: str) -> None:
        counters = self.hosts.setdefault(
            host, {"ok": 0, "changed": 0, "failed": 0, "unreachable": 0, "skipped": 0}
        )
        counters[what] += 1

    def __call__(self, event: dict) -> bool:
        kind, data = event.get("event", ""), event.get("event_data", {})
        host = data.get("host", "")
        if kind == "playbook_on_stats":
            self.data = data.get("artifact_data") or {}
        elif kind == "playbook_on_play_start":
            self.console.print(f"[bold]PLAY[/] {data.get('name', '')}")
        elif kind == "playbook_on_task_start":
            self.console.print(f"  [dim]TASK[/] {data.get('task', '')}")
        elif kind == "runner_on_ok":
            changed = data.get("res", {}).get("changed", False)
            self.count(host, "changed" if changed else "ok")
            if changed:
                self.console.print(f"    [yellow]changed[/] {host}")
                for line in diff_lines(data.get("res", {})):
                    self.console.print(f"      {line}", markup=False, highlight=False)
        elif kind == "runner_on_skipped":
            self.count(host, "skipped")
        elif kind in ("runner_on_failed", "runner_on_unreachable"):
            if kind == "runner_on_failed" and data.get("ignore_errors"):
                return True
            what = "failed" if kind == "runner_on_failed" else "unreachable"
            self.count(host, what)
            msg = str(data.get("res", {}).get("msg", "")).strip()
            self.failures.append(f"{host}: {data.get('task', '')}: {msg}")
            self.console.print(f"    [red]{what}[/] {host}: {msg}")
        return True


def diff_lines(res: dict) -> list[str]:
    """A task result's --diff as unified diff lines (no_log results carry none)."""
    diffs = []
    for part in [res] + list(res.get("results") or []):
        found = part.get("diff") if isinstance(part, dict) else None
        diffs += found if isinstance(found, list) else [found] if found else []
    lines = []
    for d in diffs:
        if d.get("prepared"):
            lines += str(d["prepared"]).splitlines()
        elif "before" in d or "after" in d:
            lines += difflib.unified_diff(
                str(d.get("before", "")).splitlines(),
                str(d.get("after", "")).splitlines(),
                str(d.get("before_header", "before")),
                str(d.get("after_header", "after")),
                lineterm="",
            )
    return lines


def refused(data: dict) -> list[str]:
    """`HOST: STAGE` for every preflight stage that a run left open. Each preflight (a
    role's preflight tasks, scale.yml's checks) marks itself open, then passed, for the
    play's hosts, with set_stats (inferfleet_preflight: {HOST: {STAGE: open|passed}},
    once per play): one left open means the run failed inside it, so the preflight
    refused."""
    stages = data.get("inferfleet_preflight") or {}
    return sorted(
        f"{host}: {stage}"
        for host, states in stages.items()
        for stage, state in (states or {}).items()
        if state == "open"
    )


def exit_code(status: str, stats: dict, progress: Progress, cancelled: bool) -> int:
    if cancelled:
        return CANCELLED
    if status != "successful" and refused(progress.data):
        return PREFLIGHT_REFUSED
    if stats.get("dark"):
        return UNREACHABLE
    if stats.get("failures") or status != "successful":
        return HOST_FAILED
    return OK


def summary_rows(stats: dict) -> list[tuple[str, int, int, int, int, int]]:
    hosts = sorted({h for part in stats.values() if isinstance(part, dict) for h in part})
    return [
        (
            h,
            stats.get("ok", {}).get(h, 0),
            stats.get("changed", {}).get(h, 0),
            stats.get("failures", {}).get(h, 0),
            stats.get("dark", {}).get(h, 0),
            stats.get("skipped", {}).get(h, 0),
        )
        for h in hosts
    ]


@dataclass
class RunResult:
    rc: int
    status: str
    stats: dict
    record: Path
    failures: list[str]
    data: dict  # the playbook's set_stats data: the contract between playbooks and CLI


def run_playbook(
    command: str,
    playbook: str,
    inventory: Path,
    *,
    extra_vars: dict | None = None,
    limit: str | None = None,
    tags: str | None = None,
    check: bool = False,
    diff: bool = False,
    console: Console | None = None,
) -> RunResult:
    """Run `playbooks/<playbook>` against `inventory` and keep a record of it. The
    playbook takes the fleet's lock (playbooks/lock.yml) as this process holds it (HELD),
    or for this run alone; another holder refuses the run (rc LOCKED)."""
    if HELD is not None:
        lock_vars = {"inferfleet_lock_token": HELD.token, "inferfleet_lock_holder": HELD.holder}
        if HELD.force:
            lock_vars["inferfleet_force_unlock"] = True
    else:
        lock_vars = {"inferfleet_lock_holder": holder(command)}
    kwargs = {"limit": limit, "tags": tags, "check": check, "diff": diff, "console": console}
    result = _run(command, playbook, inventory, extra_vars or {}, lock_vars, **kwargs)
    lock = result.data.get("inferfleet_lock") or {}
    if lock.get("stale"):
        (console or Console()).print(
            f"[yellow]broke the fleet's lock left by `{lock['stale'].get('command')}` "
            f"(pid {lock['stale'].get('pid')} on this controller has ended)[/]"
        )
    if HELD is not None and lock and not lock.get("refused"):
        HELD.taken = True
        HELD.force = False  # broken once at most; the later playbooks hold it already
    if lock.get("refused"):
        result.rc = LOCKED
        add_to_record(result.record, "rc", LOCKED)
    return result


def _run(
    command: str,
    playbook: str,
    inventory: Path,
    extra_vars: dict,
    lock_vars: dict,
    *,
    limit: str | None,
    tags: str | None,
    check: bool,
    diff: bool,
    console: Console | None,
) -> RunResult:
    import ansible_runner

    console = console or Console()
    settings = ANSIBLE_SETTINGS | strategy_settings()
    started = time.time()
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S") + f"-{command.replace(' ', '-')}"
    RUNS_DIR.mkdir(parents=True, mode=0o700, exist_ok=True)
    for n in range(1, 100):  # two runs of one command within a second get -2, -3, ...
        ident = stamp if n == 1 else f"{stamp}-{n}"
        data_dir = RUNS_DIR / ident
        try:
            data_dir.mkdir(mode=0o700)
            break
        except FileExistsError:
            continue
    else:
        raise SystemExit(f"inferfleet: no free run record name for {stamp} under {RUNS_DIR}")
    os.chmod(RUNS_DIR, 0o700)
    cmdline = " ".join(x for x in ("--check" if check else "", "--diff" if diff else "") if x)
    progress = Progress(console)
    cancelled = False

    def on_sigint(signum, frame) -> None:
        nonlocal cancelled
        cancelled = True
        console.print("[red]cancelling: waiting for the running tasks to stop[/]")

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        with allowed_environment():
            run = ansible_runner.run(
                private_data_dir=str(data_dir),
                project_dir=str(paths.COLLECTION),
                playbook=str(paths.COLLECTION / "playbooks" / playbook),
                inventory=str(inventory.resolve()),
                extravars=extra_vars | lock_vars,
                limit=limit,
                tags=tags,
                cmdline=cmdline or None,
                envvars=settings,
                event_handler=progress,
                cancel_callback=lambda: cancelled,
                quiet=True,
            )
    finally:
        signal.signal(signal.SIGINT, previous)
        # extra vars may hold secrets: they must not outlive the run on disk
        shutil.rmtree(data_dir / "env", ignore_errors=True)
    stats = run.stats or {}
    if run.status == "failed" and not stats:  # ansible-playbook itself did not run
        out = (data_dir / "artifacts" / run.config.ident / "stdout").read_text(errors="replace")
        progress.failures.append(out.strip()[-2000:] or "ansible-playbook failed to start")
        console.print(f"[red]{progress.failures[-1]}[/]")
    rc = exit_code(run.status, stats, progress, cancelled)
    record = data_dir / "record.json"
    record.write_text(
        json.dumps(
            {
                "command": command,
                "playbook": playbook,
                "inventory": str(inventory),
                "extra_vars": mask(extra_vars),
                "fleet_lock": mask(lock_vars),
                "limit": limit,
                "tags": tags,
                "check": check,
                "diff": diff,
                "mitogen": "ANSIBLE_STRATEGY" in settings,
                "status": run.status,
                "rc": rc,
                "stats": stats,
                "failures": progress.failures,
                "started": datetime.fromtimestamp(started, UTC).isoformat(),
                "duration_s": round(time.time() - started, 1),
            },
            indent=2,
        )
        + "\n"
    )
    os.chmod(record, 0o600)
    return RunResult(rc, run.status, stats, record, progress.failures, progress.data)


def add_to_record(record: Path, key: str, value) -> None:
    """Keep more of a run's outcome (a canary's comparison) in its record."""
    data = json.loads(record.read_text())
    data[key] = mask(value)
    record.write_text(json.dumps(data, indent=2) + "\n")
