"""`inferfleet scale`: the inventory edits (comments, anchors and host variables kept),
the filters that pick the instances named, and the refusals of playbooks/scale.yml,
which come from its first play (localhost) before any host is touched: real
ansible-runner runs against local-connection hosts."""

import json
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from inferfleet import inventory_edit as edit
from inferfleet.cli import app

cli = CliRunner()
ROOT = Path(__file__).resolve().parents[2]

LAB = """---
# The lab (a comment that must stay).
all:
  vars:
    ansible_connection: community.docker.docker
  children:
    inference:
      hosts:
        # one core each
        node1: {inference_engine_cpu_omp_threads_bind: "0"}
        node2: {inference_engine_cpu_omp_threads_bind: "1"}
    loadbalancers:
      hosts:
        lb:
"""

# What molecule writes: groups at the top, host entries shared through anchors.
MOLECULE = """# Molecule managed

---
all:
  hosts:
    node1: &id001
      ansible_connection: community.docker.docker
    node2: &id002
      ansible_connection: community.docker.docker
inference:
  hosts:
    node1: *id001
    node2: *id002
"""


def commands(runs_dir: Path):
    """The records of the commands' own runs (not of the fleet lock's release)."""
    return (p for p in runs_dir.glob("*/record.json") if not p.parent.name.endswith("-unlock"))


def groups(text: str) -> dict:
    doc = yaml.safe_load(text)
    found = {}

    def walk(node):
        for name, value in (node or {}).items():
            if isinstance(value, dict):
                found[name] = value.get("hosts") or {}
                walk(value.get("children"))

    walk(doc)
    return found


@pytest.mark.parametrize("text", [LAB, MOLECULE], ids=["lab", "molecule"])
def test_leave_then_join_gives_back_the_same_file(text):
    left = edit.leave(text, ["node2"])
    assert list(groups(left)["inference"]) == ["node1"]
    assert groups(left)["standby"] == {"node2": groups(text)["inference"]["node2"]}
    assert edit.join(left, ["node2"]) == text


def test_leave_keeps_comments_and_the_document_start():
    left = edit.leave(LAB, ["node1"])
    assert left.startswith("---\n# The lab (a comment that must stay).\n")
    assert 'node1: {inference_engine_cpu_omp_threads_bind: "0"}' in left


def test_join_adds_new_hosts_as_one_instance_and_leaves_serving_ones_alone():
    joined = edit.join(LAB, ["node1", "node3", "node4"], instance="big")
    hosts = groups(joined)["inference"]
    assert hosts["node1"] == {"inference_engine_cpu_omp_threads_bind": "0"}
    assert hosts["node3"] == hosts["node4"] == {"inferfleet_instance": "big"}


def test_join_can_say_which_model_the_new_hosts_serve():
    joined = edit.join(LAB, ["node3"], host_vars={"inferfleet_model_name": "coder",
                                                  "inferfleet_model_version": "v7"})
    assert groups(joined)["inference"]["node3"] == {"inferfleet_model_name": "coder",
                                                    "inferfleet_model_version": "v7"}


@pytest.mark.parametrize(
    ("text", "hosts", "words"),
    [
        (LAB, ["lb"], "lb is not listed under `inference: hosts:`"),
        ("all:\n  hosts:\n    a:\n", ["a"], "no `inference` group"),
        (edit.leave(LAB, ["node2"]), ["node2"], "node2 is in `standby` already"),
    ],
)
def test_what_cannot_be_edited_is_refused(text, hosts, words):
    with pytest.raises(edit.InventoryEditError, match=words):
        edit.leave(text, hosts)


def test_the_file_that_lists_the_group_is_found_in_a_directory(tmp_path):
    (tmp_path / "a.yml").write_text("all:\n  hosts:\n    x:\n")
    (tmp_path / "b.yml").write_text(LAB)
    assert edit.group_file(tmp_path) == tmp_path / "b.yml"
    assert edit.group_file(tmp_path, ["node9"]) == tmp_path / "b.yml"  # a new host
    (tmp_path / "b.yml").write_text("[inference]\nnode1\n")
    with pytest.raises(edit.InventoryEditError, match="edits YAML inventories only"):
        edit.group_file(tmp_path)


def test_the_file_that_lists_the_hosts_is_the_one_edited(tmp_path):
    """A directory inventory of several sources (the simulated lab's nodes.yml beside
    hosts.yml): a host is moved in the file that lists it, serving or on standby; one
    listed in two files, or hosts of two files at once, are refused naming them."""
    (tmp_path / "hosts.yml").write_text(LAB)
    nodes = "all:\n  children:\n    inference:\n      hosts:\n        node2:\n        node6:\n"
    (tmp_path / "nodes.yml").write_text(nodes)
    assert edit.group_file(tmp_path, ["node6"]) == tmp_path / "nodes.yml"
    (tmp_path / "nodes.yml").write_text(edit.leave(nodes, ["node6"]))
    assert edit.group_file(tmp_path, ["node6"]) == tmp_path / "nodes.yml"  # back from standby
    with pytest.raises(edit.InventoryEditError, match="node2 is listed in hosts.yml and nodes.yml"):
        edit.group_file(tmp_path, ["node2"])
    with pytest.raises(edit.InventoryEditError, match="node1, node6 are listed in hosts.yml and"):
        edit.group_file(tmp_path, ["node1", "node6"])


def test_the_filters_name_whole_instances():
    from ansible_collections.inferfleet.fleet.plugins.filter.inventory import FilterModule

    f = FilterModule().filters()
    hosts = ["a1", "a2", "b", "c"]
    hostvars = {
        "a1": {"inferfleet_instance": "a"},
        "a2": {"inferfleet_instance": "a"},
        "b": {},
        "c": {},
    }
    assert f["serving_nodes_of"](["a2", "c"], hosts, hostvars) == ["a1", "c"]
    assert f["serving_nodes_of"]([], hosts, hostvars) == []


# --- the CLI and the playbook's refusals ---------------------------------------------


def fleet(tmp_path: Path, hosts: dict) -> Path:
    inv = tmp_path / "inv"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text(
        "---\n# my fleet\n"
        + yaml.safe_dump(
            {
                "all": {
                    "vars": {
                        "ansible_connection": "local",
                        "inferfleet_lock_path": str(tmp_path / "lock"),
                        "ansible_python_interpreter": sys.executable,
                    },
                    "children": {"inference": {"hosts": hosts}},
                }
            }
        )
    )
    (inv / "group_vars" / "all.yml").write_text(
        yaml.safe_dump({"inferfleet_model_name": "m", "inferfleet_model_version": "v1"})
    )
    return inv


@pytest.mark.parametrize(
    ("hosts", "args", "words"),
    [
        (
            {"n1": None},
            ["--remove", "n1"],
            "would leave no instance to serve",
        ),
        (
            {"p0": {"inferfleet_instance": "big"}, "p1": {"inferfleet_instance": "big"}, "n": None},
            ["--remove", "p1"],
            "p0 is in instance big with p0, p1: name all of its members or none",
        ),
    ],
    ids=["last instance", "half a pipeline"],
)
def test_refusals_exit_4_and_leave_the_inventory_alone(tmp_path, runs_dir, hosts, args, words):
    inv = fleet(tmp_path, hosts)
    before = (inv / "hosts.yml").read_text()
    result = cli.invoke(app, ["scale", "-i", str(inv), *args])
    assert result.exit_code == 4, result.output
    events = "".join(p.read_text() for p in runs_dir.rglob("job_events/*.json"))
    assert words in " ".join(events.split())
    assert (inv / "hosts.yml").read_text() == before
    record = json.loads(next(commands(runs_dir)).read_text())
    assert record["command"] == "scale remove" and record["scale"]["remove"] == [args[1]]


def test_a_refused_add_takes_the_host_back_out_of_the_inventory(tmp_path, runs_dir):
    inv = fleet(
        tmp_path, {"p0": {"inferfleet_instance": "big"}, "p1": {"inferfleet_instance": "big"}}
    )
    before = (inv / "hosts.yml").read_text()
    # n3 joins instance big with only one of its members named: refused.
    result = cli.invoke(app, ["scale", "-i", str(inv), "--add", "n3", "--instance", "big"])
    assert result.exit_code == 4, result.output
    assert "not added" in result.output
    assert (inv / "hosts.yml").read_text() == before


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ([], "give --add HOST... or --remove HOST..."),
        (["--add", "a", "--remove", "b"], "give --add HOST... or --remove HOST..."),
        (["--remove", "a", "--instance", "x"], "--instance names the instance"),
        (["--add", "a", "--purge-model"], "--purge-model goes with --remove"),
        (["--remove", "n1", "--model", "m"], "--model names the model that --add hosts serve"),
        (["--add", "n2", "--model", "zz"], "--model zz: no instance serves it"),
    ],
)
def test_bad_options_are_refused_before_any_run(tmp_path, runs_dir, args, words):
    inv = fleet(tmp_path, {"n1": None})
    result = cli.invoke(app, ["scale", "-i", str(inv), *args])
    assert result.exit_code == 1
    assert words in result.output
    assert not list(commands(runs_dir))  # no run (the fleet lock may exist)


def test_an_ini_inventory_is_refused_with_what_to_do(tmp_path, runs_dir):
    inv = tmp_path / "hosts.ini"
    inv.write_text("[inference]\nn1\n")
    result = cli.invoke(app, ["scale", "-i", str(inv), "--remove", "n1"])
    assert result.exit_code == 1
    assert "move the hosts by hand and run playbooks/scale.yml" in " ".join(result.output.split())


def test_a_second_command_on_the_same_fleet_is_refused_naming_the_first(tmp_path, runs_dir):
    from inferfleet.commands.common import controller_lock

    inv = fleet(tmp_path, {"n1": None, "n2": None})
    with controller_lock(inv, "rollout --version v2"):
        result = cli.invoke(app, ["scale", "-i", str(inv), "--remove", "n2"])
        assert result.exit_code == 1
        words = " ".join(result.output.split())
        assert "`inferfleet rollout --version v2` (pid" in words
        assert "is changing the fleet of" in words
        assert not list(commands(runs_dir))
    # Once it ends, the next one runs (and is refused by the playbook's own preflight).
    result = cli.invoke(app, ["scale", "-i", str(inv), "--remove", "n1", "--remove", "n2"])
    assert result.exit_code == 4, result.output
