"""Lint is part of the tests: ruff on the Python, ansible-lint's production profile on
everything Ansible (the collection included). One rule is skipped, galaxy[no-repository]
(.ansible-lint says why); every other finding is fixed, not hidden."""

import subprocess


def _run(cmd, cwd):
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    assert done.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{done.stdout}\n{done.stderr}"


def test_ruff(repo_root, venv_bin):
    _run([venv_bin / "ruff", "check", "."], repo_root)


def test_ansible_lint_production_profile(repo_root, venv_bin):
    _run([venv_bin / "ansible-lint", "--profile", "production", "--strict"], repo_root)


# ansible-test's sanity tests that run offline here: the others build virtualenvs whose pip
# comes from a bootstrap script on ansible-test's own file server, which this machine
# cannot reach (ansible-lint's production profile above covers the YAML and the roles).
OFFLINE_SANITY = [
    "action-plugin-docs", "compile", "empty-init", "ignores", "line-endings", "no-assert",
    "no-get-exception", "no-illegal-filenames", "no-smart-quotes", "replace-urlopen",
    "shebang", "symlinks", "use-argspec-type-path", "use-compat-six",
]


def test_ansible_test_sanity_offline_subset(repo_root, venv_bin, tmp_path):
    """ansible-test needs the collection at ansible_collections/inferfleet/fleet: the
    tracked files are copied there (tests/sanity/ignore-2.19.txt lists the exceptions)."""
    tree = tmp_path / "ansible_collections" / "inferfleet" / "fleet"
    tree.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", "HEAD"], cwd=repo_root, capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
    # the working tree's versions of tracked files, so an uncommitted change is tested too
    tracked = subprocess.run(["git", "ls-files"], cwd=repo_root, capture_output=True, text=True,
                             check=True).stdout.split()
    for rel in tracked:
        src = repo_root / rel
        if src.is_file() and not src.is_symlink():
            (tree / rel).parent.mkdir(parents=True, exist_ok=True)
            (tree / rel).write_bytes(src.read_bytes())
    tests = [arg for name in OFFLINE_SANITY for arg in ("--test", name)]
    _run([venv_bin / "ansible-test", "sanity", "--local", "--python", "3.11", *tests], tree)
