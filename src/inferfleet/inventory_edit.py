"""Membership edits of a YAML inventory for `inferfleet scale`, keeping its comments,
order and anchors: a removed host moves from the `inference` group to `standby` with
its host variables, so adding it back later restores it as it was.

Only hosts listed directly under the groups' `hosts:` are moved; anything else gets an
InventoryEditError that says what to edit by hand.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from pathlib import Path

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap

SERVING, STANDBY = "inference", "standby"


class InventoryEditError(ValueError):
    """The inventory cannot be edited safely; the message says what to do by hand."""


def _yaml() -> YAML:
    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.width = 4096
    return yaml


def _groups(node):
    """(name, group mapping, mapping that holds it) for every group in the document."""
    if not isinstance(node, dict):
        return
    for name, value in node.items():
        if isinstance(value, dict) and ({"hosts", "children", "vars"} & set(value)):
            yield name, value, node
            yield from _groups(value.get("children"))


def _find(doc, name: str):
    for group, value, holder in _groups(doc):
        if group == name:
            return value, holder
    return None, None


def group_file(inventory: Path, hosts: Iterable[str] = ()) -> Path:
    """The YAML file of `inventory` (a file or a directory) to edit for `hosts`: the one
    that lists them under the serving or standby group, else the first that lists hosts
    under the serving group."""
    candidates = (
        [inventory]
        if inventory.is_file()
        else sorted(p for p in inventory.iterdir() if p.suffix in (".yml", ".yaml"))
    )
    listed: dict[Path, set[str]] = {}  # file -> the hosts of its serving and standby groups
    for path in candidates:
        try:
            _, doc = _load(path.read_text())
        except Exception:  # noqa: BLE001 (not a YAML inventory: look at the next file)
            continue
        found, _ = _find(doc, SERVING)
        if found is not None and found.get("hosts") is not None:
            standby, _ = _find(doc, STANDBY)
            listed[path] = {*found["hosts"], *((standby or {}).get("hosts") or {})}
    if not listed:
        raise InventoryEditError(
            f"no YAML file of {inventory} lists hosts under a `{SERVING}` group: inferfleet "
            "scale edits YAML inventories only; move the hosts by hand and run "
            "playbooks/scale.yml"
        )
    where = {h: [p.name for p, names in listed.items() if h in names] for h in hosts}
    for host, files in where.items():
        if len(files) > 1:
            raise InventoryEditError(
                f"{host} is listed in {' and '.join(files)} of {inventory}: inferfleet scale "
                "moves a host listed in one file; list it in one, or move it by hand"
            )
    files = sorted({f[0] for f in where.values() if f})
    if len(files) > 1:
        raise InventoryEditError(
            f"{', '.join(where)} are listed in {' and '.join(files)}: scale the hosts of "
            "one file at a time"
        )
    return inventory / files[0] if files else next(iter(listed))


def _hosts(group) -> CommentedMap:
    if group.get("hosts") is None:
        group["hosts"] = CommentedMap()
    return group["hosts"]


def _load(text: str):
    """(the lines up to and with a leading `---`, kept verbatim; the document)."""
    lines = text.splitlines(keepends=True)
    head = next((i + 1 for i, line in enumerate(lines) if line.rstrip() == "---"), 0)
    before = lines[: max(head - 1, 0)]
    if any(line.strip() and not line.lstrip().startswith("#") for line in before):
        head = 0  # a `---` after content starts a second document: not ours to split
    return "".join(lines[:head]), _yaml().load("".join(lines[head:]))


def _dump(head: str, doc) -> str:
    out = io.StringIO()
    _yaml().dump(doc, out)
    return head + out.getvalue()


def _open(text: str):
    """(head, document, serving group, the mapping that holds it, standby group or None)."""
    head, doc = _load(text)
    serving, holder = _find(doc, SERVING)
    if serving is None:
        raise InventoryEditError(f"the inventory has no `{SERVING}` group")
    standby, _ = _find(doc, STANDBY)
    return head, doc, serving, holder, standby


def join(
    text: str, hosts: Iterable[str], instance: str | None = None, host_vars: dict | None = None
) -> str:
    """Put `hosts` in the serving group: back from standby with their variables, or new
    (with `inferfleet_instance` when given, and `host_vars` set on each). Hosts already
    serving are left as they are."""
    head, doc, serving, holder, standby = _open(text)
    for host in hosts:
        if host in _hosts(serving):
            continue
        if standby is not None and host in _hosts(standby):
            value = _hosts(standby).pop(host)
        else:
            value = CommentedMap()
        if instance is not None or host_vars:
            if value is None:
                value = CommentedMap()
            if instance is not None:
                value["inferfleet_instance"] = instance
            value.update(host_vars or {})
        _hosts(serving)[host] = value
    if standby is not None and not _hosts(standby):
        holder.pop(STANDBY, None)
    return _dump(head, doc)


def leave(text: str, hosts: Iterable[str]) -> str:
    """Move `hosts` from the serving group to standby (created beside it if needed)."""
    head, doc, serving, holder, standby = _open(text)
    if standby is None:
        holder[STANDBY] = standby = CommentedMap()
    for host in hosts:
        if host in _hosts(standby):
            raise InventoryEditError(f"{host} is in `{STANDBY}` already: it serves nothing")
        if host not in _hosts(serving):
            raise InventoryEditError(
                f"{host} is not listed under `{SERVING}: hosts:` in this file: remove it by hand"
            )
        _hosts(standby)[host] = _hosts(serving).pop(host)
    return _dump(head, doc)
