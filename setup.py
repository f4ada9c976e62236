"""The wheel carries the inferfleet.fleet collection as
``site-packages/ansible_collections/inferfleet/fleet`` (where Ansible finds collections on
sys.path, as it finds those of the ``ansible`` package), so `pip install inferfleet` gives
the CLI and the roles it runs. What belongs to the collection is galaxy.yml's: the files
`ansible-galaxy collection build` would pack. An editable install (make setup) leaves it
out: scripts/setup.sh points the virtualenv at the checkout instead."""

import fnmatch
import os
import shutil
from pathlib import Path

import yaml
from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
COLLECTION = Path("ansible_collections", "inferfleet", "fleet")


def collection_files() -> list[str]:
    """The checkout's files less galaxy.yml's build_ignore patterns (as relative paths)."""
    ignore = yaml.safe_load((ROOT / "galaxy.yml").read_text())["build_ignore"]

    def ignored(rel: str) -> bool:
        return any(fnmatch.fnmatch(rel, pattern) for pattern in ignore)

    found = []
    for top, dirs, files in os.walk(ROOT):
        rel_top = Path(top).relative_to(ROOT).as_posix()
        rel_top = "" if rel_top == "." else rel_top + "/"
        dirs[:] = [d for d in dirs if not ignored(rel_top + d)]
        found += [rel_top + f for f in files if not ignored(rel_top + f)]
    return sorted(found)


class BuildWithCollection(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        for rel in collection_files():
            dest = Path(self.build_lib) / COLLECTION / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, dest)


setup(cmdclass={"build_py": BuildWithCollection})
