"""package_lists' `installed` entry point: the host's installed OS packages, read with
dpkg-query on the Debian family, in check mode too, by an interpreter without the APT
bindings (the GPU machine of docs/gpu-validation.md has none: package_facts failed
there)."""

from __future__ import annotations

import json
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


def _dpkg(*args: str) -> str:
    return subprocess.run(["dpkg-query", *args], capture_output=True, text=True).stdout


@pytest.mark.skipif(shutil.which("dpkg-query") is None, reason="needs a Debian-family host")
def test_installed_packages_from_dpkg_in_check_mode(tmp_path):
    (tmp_path / "read.yml").write_text(PLAYBOOK)
    out = tmp_path / "installed.json"
    done = subprocess.run(
        [ANSIBLE_PLAYBOOK, "--check", "-i", "localhost,", "-c", "local",
         "-e", f"ansible_python_interpreter={sys.executable}", "-e", f"out={out}",
         tmp_path / "read.yml"],
        capture_output=True, text=True, cwd=tmp_path,
    )
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
