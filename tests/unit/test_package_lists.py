"""package_lists' `installed` entry point: the host's installed OS packages, read with
dpkg-query on the Debian family, in check mode too, by an interpreter without the APT
bindings (the GPU machine of docs/gpu-validation.md has none: package_facts failed
there). Its `missing` entry point: only the wanted packages the host lacks go to the
package manager, and none when it has them all."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ANSIBLE_PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"

PLAYBOOK = """
- hosts: localhost
  gather_facts: false
  tasks:
    - ansible.builtin.include_role:
        name: inferfleet.fleet.package_lists
        tasks_from: installed.yml
    - ansible.builtin.copy:
        content: "{{ package_lists_installed | to_json }}"
        dest: "{{ out }}"
        mode: "0644"
      check_mode: false
"""


MISSING = """
- hosts: localhost
  gather_facts: false
  tasks:
    - ansible.builtin.include_role:
        name: inferfleet.fleet.package_lists
        tasks_from: missing
      vars:
        package_lists_wanted: "{{ wanted }}"
"""


def _check_run(tmp_path: Path, playbook: str, *extra: str) -> subprocess.CompletedProcess:
    (tmp_path / "play.yml").write_text(playbook)
    return subprocess.run(
        [ANSIBLE_PLAYBOOK, "--check", "-i", "localhost,", "-c", "local",
         "-e", f"ansible_python_interpreter={sys.executable}", *extra, tmp_path / "play.yml"],
        capture_output=True, text=True, cwd=tmp_path,
        env={**os.environ, "ANSIBLE_STDOUT_CALLBACK": "json"},
    )


def _results(done: subprocess.CompletedProcess) -> dict[str, dict]:
    """Task name (without the role's prefix) -> localhost's result, from the json callback."""
    return {t["task"]["name"].split(" : ", 1)[-1]: t["hosts"].get("localhost", {})
            for play in json.loads(done.stdout)["plays"] for t in play["tasks"]}


def _dpkg(*args: str) -> str:
    return subprocess.run(["dpkg-query", *args], capture_output=True, text=True).stdout


@pytest.mark.skipif(shutil.which("dpkg-query") is None, reason="needs a Debian-family host")
def test_installed_packages_from_dpkg_in_check_mode(tmp_path):
    out = tmp_path / "installed.json"
    done = _check_run(tmp_path, PLAYBOOK, "-e", f"out={out}")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    installed = json.loads(out.read_text())
    # What dpkg itself says, package by package: installed ones with their versions,
    # and nothing that is not installed (a removed package's configuration files included).
    states = dict(line.split("\t", 1) for line in _dpkg(
        "--show", "--showformat=${Package}\t${db:Status-Status}\n").splitlines())
    assert installed["dpkg"] == _dpkg("--show", "--showformat=${Version}", "dpkg")
    assert {name for name, state in states.items() if state == "installed"} <= set(installed)
    assert not {name for name, state in states.items()
                if state in ("not-installed", "config-files")} & set(installed)
    assert "nvidia-driver-550" not in installed


@pytest.mark.skipif(shutil.which("dpkg-query") is None, reason="needs a Debian-family host")
def test_missing_installs_nothing_when_every_package_is_there(tmp_path):
    done = _check_run(tmp_path, MISSING, "-e", json.dumps({"wanted": ["dpkg", "coreutils"]}))
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    results = _results(done)
    assert results["Install the packages the host lacks"].get("skipped") is True, results
    assert "Look for the package lists" not in results  # nothing fetched either


@pytest.mark.skipif(shutil.which("dpkg-query") is None, reason="needs a Debian-family host")
def test_missing_asks_the_package_manager_for_the_missing_ones_only(tmp_path):
    wanted = ["dpkg", "inferfleet-no-such-package"]
    done = _check_run(tmp_path, MISSING, "-e", json.dumps({"wanted": wanted}))
    results = _results(done)
    asked = results["Install them (Debian family)"]
    assert asked["invocation"]["module_args"]["name"] == ["inferfleet-no-such-package"], asked
    assert done.returncode != 0  # check mode, and the package is nowhere to be had
