"""The wheel carries the inferfleet.fleet collection as
``site-packages/ansible_collections/inferfleet/fleet`` (where Ansible finds collections on
sys.path, as it finds those of the ``ansible`` package), so `pip install inferfleet` gives
the CLI and the roles it runs. What belongs to the collection is galaxy.yml's: the files
`ansible-galaxy collection build` would pack. It also carries the lab's inventory,
inventories/lab, as package data ``inferfleet/lab/inventory`` (less what `inferfleet lab
up` writes into it), which an installed CLI's `lab up` copies to its state dir
(inferfleet.paths). An editable install (make setup) leaves both out: scripts/setup.sh
points the virtualenv at the checkout instead."""

import fnmatch
import os
import shutil
from pathlib import Path

import yaml
from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
COLLECTION = Path("ansible_collections", "inferfleet", "fleet")
LAB_INVENTORY = Path("inventories", "lab")
LAB_INVENTORY_DATA = Path("inferfleet", "lab", "inventory")
# What `inferfleet lab up` generates in the lab's inventory (inferfleet.lab.fleet.write_state;
# .gitignore keeps the same out of git)
LAB_GENERATED = [
    "host_vars", "state", "group_vars/all/secrets.yml", "models.yml", "nginx.yml", "nodes.yml"
]


def files_under(top: Path, ignore: list[str]) -> list[str]:
    """The files under `top` less the `ignore` patterns (as paths relative to `top`)."""

    def ignored(rel: str) -> bool:
        return any(fnmatch.fnmatch(rel, pattern) for pattern in ignore)

    found = []
    for here, dirs, files in os.walk(top):
        rel_here = Path(here).relative_to(top).as_posix()
        rel_here = "" if rel_here == "." else rel_here + "/"
        dirs[:] = [d for d in dirs if not ignored(rel_here + d)]
        found += [rel_here + f for f in files if not ignored(rel_here + f)]
    return sorted(found)


def collection_files() -> list[str]:
    """The checkout's files less galaxy.yml's build_ignore patterns (as relative paths)."""
    return files_under(ROOT, yaml.safe_load((ROOT / "galaxy.yml").read_text())["build_ignore"])


class BuildWithCollection(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        # a reused build folder must not keep files the tree no longer has
        for copied in (COLLECTION, LAB_INVENTORY_DATA):
            shutil.rmtree(Path(self.build_lib) / copied, ignore_errors=True)
        copies = [(ROOT / rel, COLLECTION / rel) for rel in collection_files()]
        copies += [
            (ROOT / LAB_INVENTORY / rel, LAB_INVENTORY_DATA / rel)
            for rel in files_under(ROOT / LAB_INVENTORY, LAB_GENERATED)
        ]
        for source, rel_dest in copies:
            dest = Path(self.build_lib) / rel_dest
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest)


setup(cmdclass={"build_py": BuildWithCollection})
