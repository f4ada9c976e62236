"""The fleet's lock (module_utils.fleet_lock): one holder at a time, a holder's own token
holds it already, and only force or the token of a holder proved gone breaks it."""

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml
from ansible_collections.inferfleet.fleet.plugins.module_utils import fleet_lock as fl

ROOT = Path(__file__).resolve().parents[2]


def test_one_of_many_takers_at_once_gets_it(tmp_path):
    path = str(tmp_path / "lock")
    won, refused = [], []
    barrier = threading.Barrier(8)

    def take(i):
        barrier.wait()
        try:
            fl.take(path, f"t{i}", {"command": f"run {i}"})
            won.append(i)
        except fl.LockHeld as held:
            refused.append(held.holder)

    threads = [threading.Thread(target=take, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and len(refused) == 7
    assert fl.holder_of(path) == {"command": f"run {won[0]}", "token": f"t{won[0]}"}


def test_the_holder_holds_it_again_others_are_told_who_holds_it(tmp_path):
    path = str(tmp_path / "lock")
    assert fl.take(path, "a", {"user": "ops", "command": "inferfleet rollout"}) == (True, None)
    assert fl.take(path, "a", {}) == (False, None)
    with pytest.raises(fl.LockHeld) as held:
        fl.take(path, "b", {"command": "inferfleet deploy"})
    assert held.value.holder == {"user": "ops", "command": "inferfleet rollout", "token": "a"}
    with pytest.raises(fl.LockHeld):
        fl.release(path, "b")
    assert fl.release(path, "a") is True
    assert fl.release(path, "a") is False  # already free


def test_only_force_or_the_gone_holders_token_breaks_it(tmp_path):
    path = str(tmp_path / "lock")
    fl.take(path, "live", {"command": "rollout"})
    with pytest.raises(fl.LockHeld):  # a break naming another token breaks nothing
        fl.take(path, "b", {}, break_token="gone")
    assert fl.holder_of(path)["token"] == "live"
    changed, broken = fl.take(path, "b", {"command": "deploy"}, force=True)
    assert changed and broken == {"command": "rollout", "token": "live"}
    changed, broken = fl.take(path, "c", {"command": "scale"}, break_token="b")
    assert changed and broken["token"] == "b" and fl.holder_of(path)["token"] == "c"


def _lock_playbook(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    inv = tmp_path / "hosts.yml"
    inv.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "vars": {
                        "ansible_connection": "local",
                        "ansible_python_interpreter": sys.executable,
                        "inferfleet_lock_path": str(tmp_path / "lock"),
                    },
                    "children": {"inference": {"hosts": {"n1": None}}},
                }
            }
        )
    )
    return subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "-i",
            str(inv),
            str(ROOT / "playbooks" / "lock.yml"),
            *extra,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_plain_run_names_itself_and_its_lock_is_broken_once_its_process_is_gone(tmp_path):
    """ansible-playbook without the CLI: the lock shows its user, controller and process;
    a run that ended without releasing (here: lock.yml alone takes it) leaves a lock that
    the next run of this controller breaks, saying so; another controller's is kept."""
    first = _lock_playbook(tmp_path, "-e", "fleet_lock_what=site.yml")
    assert first.returncode == 0, first.stdout[-2000:]
    left = fl.holder_of(str(tmp_path / "lock"))
    assert left["command"] == "ansible-playbook site.yml" and left["user"]
    assert fl.gone(left)  # that ansible-playbook process has ended
    second = _lock_playbook(tmp_path, "-e", "fleet_lock_what=rollback.yml")
    assert second.returncode == 0, second.stdout[-2000:]
    assert "broke the fleet's lock left by `ansible-playbook site.yml`" in " ".join(
        second.stdout.split()
    )
    assert fl.holder_of(str(tmp_path / "lock"))["command"] == "ansible-playbook rollback.yml"
    elsewhere = dict(fl.holder_of(str(tmp_path / "lock")), controller="bastion9", token="theirs")
    (tmp_path / "lock" / "holder.json").write_text(json.dumps(elsewhere))
    third = _lock_playbook(tmp_path)
    assert third.returncode != 0
    assert "the fleet is locked by" in third.stdout and "@bastion9" in third.stdout
    released = _lock_playbook(
        tmp_path, "-e", "fleet_lock_state=absent", "-e", "inferfleet_force_unlock=true"
    )
    assert released.returncode == 0 and not (tmp_path / "lock").exists()
