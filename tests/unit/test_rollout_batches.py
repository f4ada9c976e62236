"""A rolling play's batches hold whole instances: the play takes the hosts in the order of
rollout_batches (each instance's members together, in rank order) with batch_sizes as its
`serial`, as playbooks/rolling_update.yml and rollback.yml do. Checked with a real
ansible-playbook run, batch by batch."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]

# Inventory order a, c, b, d, e: instance big is a (rank 1) and b (rank 0), c alone,
# pair is d and e (ranks in inventory order).
HOSTS = {
    "a": {"inferfleet_instance": "big", "inferfleet_rank": 1},
    "c": {},
    "b": {"inferfleet_instance": "big", "inferfleet_rank": 0},
    "d": {"inferfleet_instance": "pair"},
    "e": {"inferfleet_instance": "pair"},
}
PLAY = [
    {
        "name": "Batches",
        "hosts": "inference",
        "gather_facts": False,
        "tasks": [
            {
                "name": "Make them",
                "ansible.builtin.include_role": {
                    "name": "inferfleet.fleet.rollout",
                    "tasks_from": "batches",
                },
            }
        ],
    },
    {
        "name": "Roll",
        "hosts": "inferfleet_rollout",
        "serial": "{{ groups | inferfleet.fleet.batch_sizes }}",
        "gather_facts": False,
        "tasks": [
            {
                "name": "Note the batch",
                "ansible.builtin.shell": "echo {{ ansible_play_batch | join(',') }} >> {{ out }}",
                "run_once": True,
            }
        ],
    },
]


def _batches(tmp_path, *extra):
    inv, play, out = tmp_path / "hosts.yml", tmp_path / "play.yml", tmp_path / "batches"
    out.unlink(missing_ok=True)
    inv.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "vars": {
                        "ansible_connection": "local",
                        "ansible_python_interpreter": sys.executable,
                        "out": str(out),
                    },
                    "children": {"inference": {"hosts": HOSTS}},
                }
            }
        )
    )
    play.write_text(yaml.safe_dump(PLAY))
    run = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inv), str(play), *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return run, out.read_text().split() if out.exists() else []


@pytest.mark.parametrize(
    "serial, want",
    [
        ("1", ["b,a", "c", "d,e"]),
        ("2", ["b,a,c", "d,e"]),
        ("67%", ["b,a,c", "d,e"]),  # two of three instances
        ("10%", ["b,a", "c", "d,e"]),  # never less than one
        ("5", ["b,a,c,d,e"]),
    ],
)
def test_each_batch_holds_whole_instances_rank_0_first(tmp_path, serial, want):
    run, batches = _batches(tmp_path, "-e", f"rollout_serial={serial}")
    assert run.returncode == 0, run.stdout + run.stderr
    assert batches == want


def test_a_limit_rolls_the_instances_it_names_whole(tmp_path):
    run, batches = _batches(tmp_path, "--limit", "d,e,a,b", "-e", "rollout_serial=1")
    assert run.returncode == 0, run.stdout + run.stderr
    assert batches == ["b,a", "d,e"]


def test_a_limit_that_splits_an_instance_is_refused(tmp_path):
    run, batches = _batches(tmp_path, "--limit", "c,d")
    assert run.returncode != 0 and batches == []
    said = " ".join(run.stdout.split())
    assert "instance pair is d, e, and this run leaves out e" in said
    assert "limit the run to all of its members or none" in said


@pytest.mark.parametrize("serial", ["0", "many", "-1"])
def test_a_bad_serial_is_refused_with_what_to_give(tmp_path, serial):
    run, batches = _batches(tmp_path, "-e", f"rollout_serial={serial}")
    assert run.returncode != 0 and batches == []
    assert "give a number of instances per batch" in " ".join(run.stdout.split())
