# Copyright: inferfleet contributors
# Apache License 2.0 (see pyproject.toml)
"""The fleet's lock: one operation at a time on a fleet, whichever controller runs it.

The lock is a directory made with mkdir (atomic: of two takers exactly one succeeds) on
one host of the fleet, holding holder.json: the holder's token and who it is (user,
controller, command, start time, and for the CLI its pid and the controller's boot id).
A taker with the same token holds it already; another is refused with the holder. It is
broken only on purpose: `force`, or `break_token` naming the holder a caller has proved
gone (the CLI, for a run of its own controller whose process is dead), so a live holder
is never broken by accident.
"""

from __future__ import annotations

import json
import os
import shutil
import socket


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return ""


def this_controller(pid: int) -> dict:
    """Where a holder runs: this machine since its last boot, and the holder's process."""
    return {"controller": socket.gethostname(), "boot_id": _boot_id(), "pid": pid}


def gone(holder) -> bool:
    """Is `holder` a run of this controller, since its last boot, whose process has
    ended? Only such a lock is broken without being told to: a live holder, or one of
    another controller (whose processes cannot be seen from here), never is."""
    if not isinstance(holder, dict) or not holder.get("pid") or not holder.get("boot_id"):
        return False
    here = this_controller(0)
    if (holder.get("controller"), holder["boot_id"]) != (here["controller"], here["boot_id"]):
        return False
    try:
        os.kill(int(holder["pid"]), 0)
    except ProcessLookupError:
        return True
    except (OSError, ValueError):
        return False
    return False


class LockHeld(Exception):
    """Another holder has the lock; .holder says who (None: one is taking it this instant)."""

    def __init__(self, holder):
        super().__init__("the fleet's lock is held")
        self.holder = holder


def holder_of(path: str):
    """The holder (a dict) of the lock at `path`, None if it is free or being taken."""
    try:
        with open(os.path.join(path, "holder.json"), encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None
    except ValueError:
        return {"token": "", "unreadable": True}


def take(path: str, token: str, holder: dict, force: bool = False, break_token: str = ""):
    """Take the lock for `token`; return (changed, the holder it broke or None)."""
    broken = None
    current = holder_of(path) if os.path.isdir(path) else None
    if current is not None and current.get("token") == token:
        return False, None
    gone_one = bool(break_token) and current is not None and current.get("token") == break_token
    if os.path.isdir(path) and (force or gone_one):
        broken = current or {}
        shutil.rmtree(path)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        raise LockHeld(holder_of(path)) from None
    tmp = os.path.join(path, ".holder.json")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(dict(holder, token=token), f)
    os.replace(tmp, os.path.join(path, "holder.json"))
    return True, broken


def release(path: str, token: str, force: bool = False):
    """Let go of the lock held for `token`; return changed. Another holder's lock raises
    LockHeld unless `force`."""
    if not os.path.isdir(path):
        return False
    current = holder_of(path)
    if not force and (current is None or current.get("token") != token):
        raise LockHeld(current)
    shutil.rmtree(path)
    return True
