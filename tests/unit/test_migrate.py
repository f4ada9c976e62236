"""`inferfleet migrate`'s plan: the steps between two layouts of the same machines, what
serves during each, and the inventories the fleet runs between steps. Real inventories
read by Ansible itself; nothing runs on hosts (tests/integration/test_molecule.py's
pipeline scenario migrates a real fleet)."""

from __future__ import annotations

import stat

import pytest
import yaml
from typer.testing import CliRunner

from inferfleet import fleet as fleet_mod
from inferfleet import migrate as m
from inferfleet.cli import app

FLEET = {
    "inferfleet_model_name": "tiny",
    "inferfleet_model_version": "v1",
    "inference_engine_api_key": "sk-engine",
}
PIPE = {"inferfleet_instance": "pp", "inference_engine_pipeline_parallel_size": 2}


def inventory(tmp_path, name: str, engines: dict[str, dict], extra_lb: dict | None = None):
    """An inventory directory: `engines` (host -> its own variables), one load balancer."""
    path = tmp_path / name
    path.mkdir()
    doc = {
        "all": {
            "vars": FLEET,
            "children": {
                "inference": {"hosts": engines},
                "loadbalancers": {"hosts": {"lb": extra_lb or {}}},
            },
        }
    }
    (path / "hosts.yml").write_text(yaml.safe_dump(doc))
    return path


def pipeline_and_single(tmp_path, name="pipeline"):
    return inventory(
        tmp_path,
        name,
        {
            "node1": {**PIPE, "inferfleet_rank": 0},
            "node2": {**PIPE, "inferfleet_rank": 1},
            "single": {"inference_engine_extra_args": ["--enforce-eager"]},
        },
    )


def replicas(tmp_path, name="replicas"):
    return inventory(
        tmp_path,
        name,
        {"node1": {}, "node2": {}, "single": {"inference_engine_extra_args": ["--enforce-eager"]}},
    )


def planned(old_path, new_path):
    old, new = m.read(old_path), m.read(new_path)
    return m.plan(old, new, fleet_mod.load(old_path), fleet_mod.load(new_path))


def test_a_pipeline_becomes_two_replicas_in_one_step_and_the_single_node_stays(tmp_path):
    steps = planned(pipeline_and_single(tmp_path), replicas(tmp_path))
    assert [(s.hosts, s.old, s.new, s.models) for s in steps] == [
        (["node1", "node2"], ["pp"], ["node1", "node2"], ["tiny", "tiny"])
    ]


def test_and_back_two_replicas_form_the_pipeline(tmp_path):
    steps = planned(replicas(tmp_path), pipeline_and_single(tmp_path))
    assert [(s.hosts, s.old, s.new) for s in steps] == [
        (["node1", "node2"], ["node1", "node2"], ["pp"])
    ]


def test_each_pipeline_is_a_step_and_capacity_counts_what_earlier_steps_brought(tmp_path):
    two = inventory(
        tmp_path,
        "two",
        {
            "n1": {"inferfleet_instance": "a", "inferfleet_rank": 0},
            "n2": {"inferfleet_instance": "a", "inferfleet_rank": 1},
            "n3": {"inferfleet_instance": "b", "inferfleet_rank": 0},
            "n4": {"inferfleet_instance": "b", "inferfleet_rank": 1},
        },
    )
    four = inventory(tmp_path, "four", {h: {} for h in ("n1", "n2", "n3", "n4")})
    before = fleet_mod.load(two)
    steps = m.plan(m.read(two), m.read(four), before, fleet_mod.load(four))
    assert [(s.hosts, s.old, s.new) for s in steps] == [
        (["n1", "n2"], ["a"], ["n1", "n2"]),
        (["n3", "n4"], ["b"], ["n3", "n4"]),
    ]
    # step 1: b serves alone (1 of 2); step 2: the two replicas of step 1 serve while b is
    # out (2 of the 3 that served before it)
    assert m.capacity(before, steps, 0) == {"tiny": (1, 2)}
    assert m.capacity(before, steps, 1) == {"tiny": (2, 3)}


def test_a_host_whose_variables_change_moves_with_its_whole_instance(tmp_path):
    old = pipeline_and_single(tmp_path)
    new = inventory(
        tmp_path,
        "new",
        {
            "node1": {**PIPE, "inferfleet_rank": 0},
            "node2": {**PIPE, "inferfleet_rank": 1, "inference_engine_max_num_seqs": 4},
            "single": {"inference_engine_extra_args": ["--enforce-eager"]},
        },
    )
    steps = planned(old, new)
    assert [(s.hosts, s.old, s.new) for s in steps] == [(["node1", "node2"], ["pp"], ["pp"])]


def test_the_same_layout_has_no_step(tmp_path):
    assert planned(pipeline_and_single(tmp_path, "a"), pipeline_and_single(tmp_path, "b")) == []


def test_other_machines_are_refused_naming_them(tmp_path):
    old = pipeline_and_single(tmp_path)
    new = inventory(tmp_path, "new", {"node1": {}, "node2": {}, "other": {}})
    with pytest.raises(ValueError) as err:
        planned(old, new)
    assert "only the fleet now has single" in str(err.value)
    assert "only the new layout has other" in str(err.value)
    assert "inferfleet scale" in str(err.value)


def test_the_mixed_inventory_runs_moved_hosts_as_the_new_layout_the_rest_as_the_old(tmp_path):
    old, new = m.read(pipeline_and_single(tmp_path)), m.read(replicas(tmp_path))
    path = m.write(m.mixed(old, new, {"node1", "node2"}), tmp_path / "runs" / "step1-after.yml")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # it holds the fleet's keys
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    fleet = fleet_mod.load(path)
    assert sorted((n.host, n.instance, n.rank) for n in fleet.nodes) == [
        ("node1", "node1", 0),
        ("node2", "node2", 0),
        ("single", "single", 0),
    ]
    assert fleet.engine_key == "sk-engine" and fleet.model == "tiny"
    mixed = m.read(path)
    assert mixed.groups["lb"] == ["loadbalancers"] and mixed.engines == ["node1", "node2", "single"]
    # before the step: the old layout as it was
    before = fleet_mod.load(
        m.write(m.mixed(old, new, set()), tmp_path / "runs" / "step1-before.yml")
    )
    assert [(n.host, n.instance) for n in before.nodes if n.instance == "pp"] == [
        ("node1", "pp"),
        ("node2", "pp"),
    ]


def test_vaulted_variables_are_refused_with_what_to_do(tmp_path):
    listing = {
        "_meta": {
            "hostvars": {
                "n1": {"inference_engine_api_key": {"__ansible_vault": "$ANSIBLE_VAULT;1.1;AES256"}}
            }
        },
        "inference": {"hosts": ["n1"]},
    }
    with pytest.raises(ValueError, match="n1 have vault-encrypted variables"):
        m.parse(tmp_path, listing)


def test_plan_prints_the_steps_and_what_serves_and_changes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr("inferfleet.commands.migrate.RUNS_DIR", tmp_path / "runs")
    result = CliRunner().invoke(
        app,
        [
            "migrate",
            "-i",
            str(pipeline_and_single(tmp_path)),
            "--to",
            str(replicas(tmp_path)),
            "--plan",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "node1, node2" in result.output and "tiny: 1 of 2 instances" in result.output
    # and how to run each step by hand: scale.yml with the inventories before and after it
    (before,) = (tmp_path / "runs").glob("migrate-*/step1-before.yml")
    after = before.with_name("step1-after.yml")
    text = " ".join(result.output.split())
    assert (
        f"ansible-playbook -i {before} inferfleet.fleet.scale -e "
        '\'{"scale_remove": ["node1", "node2"]}\'' in text
    )
    assert (
        f"ansible-playbook -i {after} inferfleet.fleet.scale -e "
        '\'{"scale_add": ["node1", "node2"], "scale_replace": true}\'' in text
    )
    for path in (before, after):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [n.instance for n in fleet_mod.load(before).serving_of("tiny")] == ["pp", "single"]
    assert [n.instance for n in fleet_mod.load(after).serving_of("tiny")] == [
        "node1",
        "node2",
        "single",
    ]


@pytest.mark.parametrize(
    "args, code, words",
    [
        (
            ["--min-capacity", "60"],
            4,
            "step 1 (node1, node2) would leave tiny 1 of 2 serving instances, "
            "below --min-capacity 60 %",
        ),
        (["--share", "0"], 1, "--share 0: give a percentage above 0 and below 100"),
        (
            ["--share", "50", "--share", "10"],
            1,
            "--share 50 --share 10: give the shares in increasing order, each once",
        ),
        (["--seconds", "0"], 1, "--seconds must be above 0"),
        (["--max-latency-ratio", "0.5"], 1, "--max-latency-ratio must be 1 or more"),
    ],
)
def test_bad_requests_are_refused_before_anything_runs(tmp_path, args, code, words):
    result = CliRunner().invoke(
        app,
        [
            "migrate",
            "-i",
            str(pipeline_and_single(tmp_path)),
            "--to",
            str(replicas(tmp_path)),
            *args,
        ],
    )
    assert result.exit_code == code and words in " ".join(result.output.split()), result.output
    assert "Traceback" not in result.output


def test_a_missing_target_inventory_is_named(tmp_path):
    result = CliRunner().invoke(
        app, ["migrate", "-i", str(pipeline_and_single(tmp_path)), "--to", str(tmp_path / "nope")]
    )
    assert result.exit_code == 1 and "does not exist" in result.output


def test_the_new_instances_widen_share_by_share_and_stop_at_the_first_that_fails(
    tmp_path, monkeypatch
):
    """_compare with HAProxy's weights, the watch and the golden answers stood in for
    (the pipeline scenario runs them for real): each share's weight set and judged in
    turn, then full weight; a failing share ends the comparison there, the new instances
    left at that small weight for the step back to drain."""
    from inferfleet import canary as c
    from inferfleet.commands import migrate as cmd

    inv = replicas(tmp_path)
    step = m.Step(["node1", "node2"], ["pp"], ["node1", "node2"], ["tiny", "tiny"])
    weights, windows = [], []
    asked = []  # the golden answers, in the order of the weights set
    monkeypatch.setattr(cmd, "_weights", lambda path, w: weights.append(w) or True)
    good = c.Side(requests=10, errors=0, p50=0.1, p95=0.2)

    def watch(fleet, model, hosts, seconds, requests, load):
        windows.append(hosts)
        slow = c.Side(requests=10, errors=0, p50=9.0, p95=9.0)
        return (slow if len(windows) == fail_at else good), good

    monkeypatch.setattr(cmd, "watch", watch)
    monkeypatch.setattr(
        cmd, "_answers", lambda fleet, hosts, model, golden: asked.append(len(weights)) or ["a"]
    )
    golden = [c.Golden("q")]
    kv = {"node1": {"logged": 100, "planned": 100, "tolerance_pct": 3}}

    def run():
        weights.clear()
        windows.clear()
        asked.clear()
        return cmd._compare(
            inv, step, {"tiny": ["a"]}, golden, c.Thresholds(), [0.1, 0.5], 1, 0, 0, kv
        )

    fail_at = 0
    out = run()
    assert [(model, share) for model, share, _ in out] == [("tiny", 0.1), ("tiny", 0.5)]
    assert all(r.passed for _, _, rows in out for r in rows)
    assert "KV cache of node1" in [r.check for r in out[0][2]]
    # one other instance serving (single): weights for 10 % then 50 % split over two, then full
    assert weights == [{"node1": 5, "node2": 5}, {"node1": 50, "node2": 50},
                       {"node1": "100%", "node2": "100%"}]
    assert windows == [["node1", "node2"]] * 2
    # the golden prompts once, before the new instances take any share (a warm engine
    # in the latency windows)
    assert asked == [0]

    fail_at = 1
    out = run()
    assert len(out) == 1 and not all(r.passed for r in out[0][2])
    assert weights == [{"node1": 5, "node2": 5}]  # no wider share, no full weight
