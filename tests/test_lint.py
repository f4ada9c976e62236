"""Lint is part of the tests: ruff on the Python, ansible-lint's production profile on
everything Ansible (the collection included). One rule is skipped, galaxy[no-repository]
(.ansible-lint says why); every other finding is fixed, not hidden."""

import subprocess


def _run(cmd, cwd):
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    assert done.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{done.stdout}\n{done.stderr}"


def test_ruff(repo_root, venv_bin):
    _run([venv_bin / "ruff", "check", "src", "tests", "plugins", "benchmarks"], repo_root)


def test_ansible_lint_production_profile(repo_root, venv_bin):
    _run([venv_bin / "ansible-lint", "--profile", "production", "--strict"], repo_root)
