"""The inference_engine role's files for a batch of cases, rendered by Ansible itself.

One `ansible-playbook` run serves every case: one inventory host per case on a local
connection, its host variables being the case's inventory values. For each host the play
runs the role's own `preflight` task file (`include_role ... public: true`, so the role's
defaults, vars and dependencies are in scope afterwards, exactly as Ansible resolves
them), then renders what tasks/configure.yml writes: the unit and the Ray unit from the
role's templates (Ansible's template lookup, the template module's engine), and the
environment files from those tasks' own `content`. They are rendered on the controller
(set_fact), not by the copy/template modules, so no module runs per case, and every file
is rendered whatever configure.yml's `when:` says (tests read the role's conditions, such
as `_inference_engine_serves`, from its variables). Nothing is written to /etc: the
results come back in one JSON file. A step that fails is recorded with the task and
Ansible's message, so a test can check that the role refuses an input, and where.

    rendered = render_cases({"gpu": {"inference_engine_accelerator": "nvidia"}}, tmp_path)
    unit_exec_start(rendered["gpu"].unit)[0]   # .../bin/vllm

The GPU checks (scripts/gpu-check) run it as a script: `python tests/unit/engine_render.py
PREFIX VAR=YAML...` writes PREFIX.service (the unit), PREFIX.args.json (the words after
`serve` on its ExecStart) and PREFIX.env (the environment file's values, KEY=VALUE a line).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "roles" / "inference_engine"

# What tasks/configure.yml writes, by the name of the task that writes it.
TASKS = {
    "env": "Configure | The engine's environment",
    "secret_env": "Configure | The engine's secrets (API key, Ray token), mode 0600",
    "unit": "Configure | The engine's systemd unit",
    "ray_unit": "Configure | The Ray node's unit",
}
PREFLIGHT = "preflight"
# Inventory values that are secrets: Ansible's output must never show them.
SECRETS = ("inference_engine_api_key", "inference_engine_ray_token")


class RenderError(ValueError):
    """A step of the role that failed for this case: the task's name and Ansible's message."""


@dataclass
class Rendered:
    """One case's files, the role variables asked for, and the steps that failed."""

    files: dict[str, str] = field(default_factory=dict)
    vars: dict[str, Any] = field(default_factory=dict)
    errors: dict[str, dict[str, str]] = field(default_factory=dict)

    def file(self, name: str) -> str:
        if name in self.errors:
            raise RenderError(f"{self.errors[name]['task']}: {self.errors[name]['msg']}")
        return self.files[name]

    @property
    def unit(self) -> str:
        return self.file("unit")

    @property
    def ray_unit(self) -> str:
        return self.file("ray_unit")

    @property
    def env(self) -> str:
        return self.file("env")

    @property
    def secret_env(self) -> str:
        return self.file("secret_env")

    @property
    def refusal(self) -> dict[str, str] | None:
        """The first step that failed, in the role's order (preflight, then configure)."""
        for name in (PREFLIGHT, *TASKS, "vars"):
            if name in self.errors:
                return self.errors[name]
        return None


def _record(values: Mapping[str, str], no_log: bool) -> dict:
    """A task that records `values` (templates Ansible renders) as the case's files."""
    names = ", ".join(f"'{name}': __render_{name}" for name in values)
    first, *others = values
    task_name = "Render everything at once" if others else TASKS.get(first, "The variables")
    return {"name": task_name, "ansible.builtin.set_fact": {
                "__render": "{{ __render | combine({'files': {" + names + "}}, recursive=True) }}"},
            "vars": {f"__render_{name}": value for name, value in values.items()},
            "no_log": no_log}


def _record_error(name: str) -> dict:
    error = f"'{name}': {{'task': ansible_failed_task.name, 'msg': ansible_failed_result.msg}}"
    return {"name": f"Record why {name} failed", "ansible.builtin.set_fact": {
        "__render": "{{ __render | combine({'errors': {" + error + "}}, recursive=True) }}"}}


def _render(variables: list[str]) -> dict:
    """Every file configure.yml (and configure-group.yml) writes, from their own tasks, and
    the variables asked for: all in one task, and when that fails, one by one to record
    which fails and why."""
    tasks = {t["name"]: t for file in ("configure.yml", "configure-group.yml")
             for t in yaml.safe_load((ROLE / "tasks" / file).read_text())}
    values, secret = {}, set()
    for name, task_name in TASKS.items():
        task = tasks[task_name]
        if "ansible.builtin.template" in task:
            src = ROLE / "templates" / task["ansible.builtin.template"]["src"]
            values[name] = "{{ lookup('ansible.builtin.template', " + json.dumps(str(src)) + ") }}"
        else:
            values[name] = task["ansible.builtin.copy"]["content"]
        if task.get("no_log"):
            secret.add(name)
    # the agent's service (a looped template task inside a block, so named here)
    agent = ROLE / "templates" / "inferfleet-engine-agent.service.j2"
    values["agent_unit"] = ("{{ lookup('ansible.builtin.template', " + json.dumps(str(agent))
                            + ") }}")
    names = json.dumps(variables)
    values["vars"] = ("{{ dict(" + names + " | zip(query('ansible.builtin.vars', *" + names
                      + "))) }}")
    one_by_one = [{"name": f"Render {name}", "block": [_record({name: value}, name in secret)],
                   "rescue": [_record_error(name)]} for name, value in values.items()]
    return {"name": "Render the files", "block": [_record(values, bool(secret))],
            "rescue": one_by_one}


def _playbook(variables: Iterable[str], out: Path) -> list[dict]:
    preflight = {
        "name": "Render preflight",
        "block": [{"name": "The role's preflight, its defaults and vars public to the play",
                   "ansible.builtin.include_role": {
                       "name": "inferfleet.fleet.inference_engine", "tasks_from": "preflight",
                       "public": True}}],
        "rescue": [_record_error(PREFLIGHT)],
    }
    write = {
        "name": "Write every case's results",
        "run_once": True,
        "no_log": True,  # the secret environment files are among them
        "ansible.builtin.copy": {
            "dest": str(out),
            "mode": "0600",
            "content": "{{ dict(ansible_play_hosts_all | zip(ansible_play_hosts_all"
                       " | map('extract', hostvars) | map(attribute='__render'))) | to_json }}"},
    }
    return [{
        "name": "Render the inference_engine role's files, one host per case",
        "hosts": "all",
        "gather_facts": False,
        "vars": {"__render": {"files": {}, "errors": {}},
                 "ansible_python_interpreter": "{{ ansible_playbook_python }}"},
        "tasks": [preflight, _render(list(variables)), write],
    }]


def _ansible_playbook() -> str:
    """The ansible-playbook beside this Python (a virtualenv's), else the one on PATH."""
    beside = Path(sys.executable).parent / "ansible-playbook"
    return str(beside) if beside.exists() else shutil.which("ansible-playbook") or str(beside)


def render_cases(cases: Mapping[str, Mapping[str, Any]], tmp: Path,
                 variables: Iterable[str] = ()) -> dict[str, Rendered]:
    """Each case's files, rendered by Ansible in one run; `variables`: role variables to
    return as Ansible resolves them (Rendered.vars)."""
    tmp.mkdir(parents=True, exist_ok=True)
    hosts = {f"case{i}": {"ansible_connection": "local", **over}
             for i, over in enumerate(cases.values())}
    inventory = {"all": {"hosts": hosts}}
    (tmp / "inventory.yml").write_text(yaml.safe_dump(inventory, sort_keys=False))
    (tmp / "render.yml").write_text(yaml.safe_dump(
        _playbook(variables, tmp / "rendered.json"), sort_keys=False, width=1000))
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    run = subprocess.run(
        [_ansible_playbook(), "-i", str(tmp / "inventory.yml"), str(tmp / "render.yml")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    output = run.stdout + run.stderr
    if run.returncode != 0:
        raise RuntimeError(f"ansible-playbook failed:\n{output[-8000:]}")
    for over in cases.values():
        for key in SECRETS:  # (a secret of a few letters, like "tok", is in ordinary words)
            if len(str(over.get(key) or "")) >= 8 and str(over[key]) in output:
                raise RuntimeError(f"{key}'s value is in Ansible's output")
    hosts = json.loads((tmp / "rendered.json").read_text())
    results = {}
    for i, name in enumerate(cases):
        found = hosts[f"case{i}"]
        results[name] = Rendered(files=found["files"], vars=found["files"].pop("vars", {}),
                                 errors=found["errors"])
    return results


def unit_exec_start(unit: str) -> list[str]:
    """The words of a unit's ExecStart= line (systemd's quoting is a subset of the shell's)."""
    for line in unit.splitlines():
        if line.startswith("ExecStart="):
            words = shlex.split(line[len("ExecStart="):])
            return [w.replace("%%", "%").replace("$$", "$") for w in words]
    raise ValueError("the unit has no ExecStart= line")


def env_file_values(text: str) -> dict[str, str]:
    """The variables of an environment file as the role writes it (systemd's double-quoted
    values with backslash escapes, or docker's raw values)."""
    values = {}
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        values[key] = value
    return values


def _main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print(__doc__.split("\n\n")[-1], file=sys.stderr)
        return 2
    prefix, overrides = Path(argv[0]).resolve(), {}
    for item in argv[1:]:
        key, _, value = item.partition("=")
        overrides[key] = yaml.safe_load(value) if value else ""
    rendered = render_cases({"case": overrides}, prefix.parent / f".{prefix.name}.render")["case"]
    try:
        unit = rendered.unit
        words = unit_exec_start(unit)
        env = env_file_values(rendered.env)
    except RenderError as err:
        print(f"the role refuses these values: {err}", file=sys.stderr)
        return 1
    prefix.with_name(prefix.name + ".service").write_text(unit)
    prefix.with_name(prefix.name + ".args.json").write_text(
        json.dumps(words[words.index("serve") + 1:]) + "\n")
    prefix.with_name(prefix.name + ".env").write_text(
        "".join(f"{key}={value}\n" for key, value in env.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
