"""Several models on one fleet: the fleet planner (pure) and `inferfleet plan --models`."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible_collections.inferfleet.fleet.plugins.module_utils.instances import (
    instances,
    served_model,
)
from ansible_collections.inferfleet.fleet.plugins.module_utils.planner import (
    Hardware,
    ModelRequest,
    PlannerError,
    Targets,
    check_inventory,
    group_name,
    load_model,
    plan_fleet,
    plan_model,
)
from typer.testing import CliRunner

from inferfleet.cli import app

CONFIGS = Path(__file__).resolve().parent.parent / "fixtures" / "configs"
GPUS = Hardware(gpus_per_node=2, gpu_memory_gib=48)  # nodes of 2 x 48 GiB


def source(name: str):
    return load_model(str(CONFIGS / f"{name}.json"))


def chat(concurrency: int = 96, **kwargs) -> ModelRequest:
    return ModelRequest("chat", source("llama-3.1-8b"), "v1", Targets(context=8192),
                        concurrency, **kwargs)


def coder(concurrency: int = 20) -> ModelRequest:
    return ModelRequest("qwen2.5-coder", source("qwen3-30b-a3b-fp8"), None,
                        Targets(context=32768), concurrency)


def big(concurrency: int = 12) -> ModelRequest:
    return ModelRequest("big", source("llama-3.1-70b"), "2024-07-23", Targets(context=8192),
                        concurrency)


def per_instance(request: ModelRequest) -> int:
    """Whole full-context sequences one instance holds, from the single-model planner."""
    plan = plan_model(request.source, GPUS, request.targets)
    return math.floor(plan.layout.capacity.max_concurrency)


def hardware(nodes: int) -> Hardware:
    return Hardware(GPUS.gpus_per_node, GPUS.gpu_memory_gib, nodes)


# --- the fleet planner ----------------------------------------------------------------


def test_two_models_get_their_instances_and_nodes_in_order_the_rest_is_spare():
    requests = [chat(96), coder(20)]
    fleet = plan_fleet(hardware(5), requests)
    assert fleet.fits and fleet.problems == []
    first, second = fleet.models
    assert per_instance(requests[0]) == first.per_instance == 63
    assert per_instance(requests[1]) == second.per_instance == 16
    assert (first.plan.decision, first.plan.layout.tp, first.plan.layout.pp) == (
        "replicated", 2, 1)
    assert (first.instances, first.nodes, first.holds) == (2, [["node1"], ["node2"]], 126)
    assert (second.group, second.instances, second.nodes) == (
        "qwen2_5_coder", 2, [["node3"], ["node4"]])
    assert fleet.spare == ["node5"]
    assert fleet.nodes_needed == 4
    # Each model's plan describes its share of the fleet, not the whole fleet.
    assert first.plan.instances == 2 and first.plan.hardware.nodes == 2
    assert first.to_dict()["plan"]["kv_capacity"]["fleet_concurrency"] == 126


def test_node_names_come_from_the_caller_in_their_order():
    fleet = plan_fleet(hardware(1), [chat(1), coder(1)], hosts=["gpu-b", "gpu-a", "gpu-c"])
    assert fleet.hardware.nodes == 3
    assert [m.nodes for m in fleet.models] == [[["gpu-b"]], [["gpu-a"]]]
    assert fleet.spare == ["gpu-c"]


@pytest.mark.parametrize("times, extra, expected", [
    (0, 1, 1),  # a target of 1
    (1, 0, 1),  # exactly what one instance holds
    (1, 1, 2),  # one more sequence: a second instance
    (3, 0, 3),
])
def test_instance_count_is_the_target_over_whole_sequences_per_instance(times, extra,
                                                                        expected):
    per = per_instance(chat())
    fleet = plan_fleet(hardware(8), [chat(per * times + extra)])
    assert fleet.models[0].instances == expected
    assert fleet.models[0].holds >= per * times + extra


def test_a_model_needing_a_pipeline_gets_ranked_members_in_the_inventory():
    fleet = plan_fleet(hardware(7), [chat(1), big(12)])
    assert fleet.fits
    pipeline = fleet.models[1]
    assert (pipeline.plan.decision, pipeline.plan.nodes_per_instance) == ("pipeline", 2)
    assert pipeline.per_instance == 10
    assert pipeline.instances == 2
    assert pipeline.nodes == [["node2", "node3"], ["node4", "node5"]]
    assert fleet.spare == ["node6", "node7"]
    inventory = fleet.inventory()
    groups = inventory["all"]["children"]["inference"]["children"]
    assert list(groups) == ["chat", "big"]
    # Hosts only: the variables go to group_vars/<group>.yml (group_vars()).
    assert groups["chat"] == {"hosts": {"node1": {}}}
    assert groups["big"] == {"hosts": {
        "node2": {"inferfleet_instance": "big_1", "inferfleet_rank": 0},
        "node3": {"inferfleet_instance": "big_1", "inferfleet_rank": 1},
        "node4": {"inferfleet_instance": "big_2", "inferfleet_rank": 0},
        "node5": {"inferfleet_instance": "big_2", "inferfleet_rank": 1},
    }}
    group_vars = fleet.group_vars()
    assert list(group_vars) == ["chat", "big"]
    variables = group_vars["big"]
    assert variables["inferfleet_model_name"] == "big"
    assert variables["inferfleet_model_version"] == "2024-07-23"
    assert variables["inference_engine_pipeline_parallel_size"] == 2
    assert variables["inference_engine_max_model_len"] == 8192
    assert {k: v for k, v in variables.items() if not k.startswith("inferfleet_model")} == (
        pipeline.plan.group_vars())
    # The inventory's own instance logic reads the plan as planned.
    hosts = [h for group in groups.values() for h in group["hosts"]]
    hostvars = {h: {**group_vars[name], **group["hosts"][h]}
                for name, group in groups.items() for h in group["hosts"]}
    assert instances(hosts, hostvars) == {"node1": ["node1"], "big_1": ["node2", "node3"],
                                          "big_2": ["node4", "node5"]}
    assert served_model(hostvars["node4"]) == "big"
    assert "inferfleet_model_version" not in plan_fleet(hardware(1), [coder(1)]).group_vars()[
        "qwen2_5_coder"]


def test_too_few_nodes_does_not_fit_and_says_by_how_many():
    fleet = plan_fleet(hardware(6), [chat(96), coder(20), big(12)])
    assert not fleet.fits
    assert [m.nodes_needed for m in fleet.models] == [2, 2, 4]
    assert all(m.nodes == [] for m in fleet.models) and fleet.spare == []
    (problem,) = fleet.problems
    assert "need 8 node(s)" in problem and "big 4 (2 x 2)" in problem
    assert "the fleet has 6: add 2 node(s)" in problem
    with pytest.raises(PlannerError, match="does not fit"):
        fleet.inventory()
    with pytest.raises(PlannerError, match="does not fit"):
        fleet.group_vars()
    data = fleet.to_dict()
    assert json.loads(json.dumps(data))["fits"] is False
    assert data["nodes_needed"] == 8 and data["hardware"]["nodes"] == 6


def test_a_model_that_fits_no_topology_is_named_with_its_shortfall():
    fleet = plan_fleet(Hardware(1, 24, 2), [chat(1), big(1)])
    assert not fleet.fits
    assert fleet.models[0].fits and not fleet.models[1].fits
    assert fleet.models[1].instances == 0
    assert fleet.problems[0].startswith("big does not fit 2 node(s) x 1 GPU(s) x 24 GiB: "
                                        "short by")
    assert fleet.to_dict()["models"][1]["group_vars"] is None


@pytest.mark.parametrize("names, words", [
    (["qwen2.5-coder", "qwen2_5-coder"], ["'qwen2.5-coder' and 'qwen2_5-coder'",
                                          "'qwen2_5_coder'", "set `group`"]),
    (["chat", "chat"], ["both named 'chat'", "rename one"]),
    (["inference"], ["'inference'", "already uses", "another `group`"]),
])
def test_colliding_names_are_refused_with_what_to_change(names, words):
    requests = [ModelRequest(name, source("llama-3.1-8b"), targets=Targets(context=8192))
                for name in names]
    with pytest.raises(PlannerError) as err:
        plan_fleet(hardware(4), requests)
    for word in words:
        assert word in str(err.value)


def test_group_names_are_valid_ansible_names_and_can_be_set():
    assert group_name("qwen2.5-coder") == "qwen2_5_coder"
    assert group_name("7b-chat") == "model_7b_chat"
    assert group_name("Llama/3.1") == "Llama_3_1"
    assert group_name("qwen2.5-coder", "coder") == "coder"
    with pytest.raises(PlannerError, match="not a valid Ansible group name"):
        group_name("chat", "my-group")
    # "chat.b" would be the group chat_b like "chat_b": a `group` of its own settles it.
    other = ModelRequest("chat.b", source("llama-3.1-8b"), targets=Targets(context=8192),
                         group="chat2")
    fleet = plan_fleet(hardware(3), [chat(1, group="chat_b"), other])
    assert [m.group for m in fleet.models] == ["chat_b", "chat2"]


def test_bad_requests_are_planner_errors_naming_the_model():
    with pytest.raises(PlannerError, match="model chat: concurrency must be at least 1"):
        plan_fleet(hardware(1), [chat(0)])
    too_long = ModelRequest("chat", source("llama-3.1-8b"), targets=Targets(context=10**7))
    with pytest.raises(PlannerError, match="model chat: --context"):
        plan_fleet(hardware(1), [too_long])
    with pytest.raises(PlannerError, match="listed twice"):
        plan_fleet(hardware(1), [chat(1)], hosts=["a", "a"])


def test_check_inventory_says_what_the_existing_instances_hold():
    fleet = plan_fleet(hardware(8), [chat(96), big(12)])
    assignment = {
        "chat": [["gpu1"]],
        "big": [["gpu2", "gpu3"], ["gpu4"]],
        "old": [["gpu5"]],
    }
    by_name = {check.name: check for check in check_inventory(fleet, assignment)}
    assert list(by_name) == ["chat", "big", "old"]
    assert not by_name["chat"].fits
    assert by_name["chat"].message == ("holds 63 of 96 sequences: add 1 instance(s) of "
                                       "1 node(s)")
    assert by_name["big"].wrong_size == [["gpu4"]]
    assert by_name["big"].holds == 10
    assert "1 instance(s) not of 2 node(s): gpu4 (1)" in by_name["big"].message
    assert "the models file does not list it" in by_name["old"].message
    ok = check_inventory(fleet, {"chat": [["a"], ["b"], ["c"]], "big": [["d", "e"], ["f", "g"]]})
    assert [c.fits for c in ok] == [True, True]
    assert ok[0].message == "holds 189 of 96 sequences: 1 instance(s) more than needed"
    assert ok[1].to_dict()["holds"] == 20


# --- the CLI --------------------------------------------------------------------------


def run_cli(*args: str):
    return CliRunner().invoke(app, ["plan", *args])


def flat(text: str) -> str:
    """Output with rich's line wrapping undone."""
    return " ".join(text.split())


def models_file(tmp_path: Path, models: list[dict] | str, name: str = "models.yml") -> Path:
    path = tmp_path / name
    path.write_text(models if isinstance(models, str) else yaml.safe_dump({"models": models}))
    return path


def two_models(tmp_path: Path) -> Path:
    (tmp_path / "configs").mkdir(exist_ok=True)
    for name in ("llama-3.1-8b", "qwen3-30b-a3b-fp8"):
        (tmp_path / "configs" / f"{name}.json").write_text((CONFIGS / f"{name}.json").read_text())
    return models_file(tmp_path, [
        # a source relative to the models file's folder
        {"name": "chat", "source": "configs/llama-3.1-8b.json", "version": "v1",
         "concurrency": 96, "context": 8192},
        {"name": "qwen2.5-coder", "source": str(tmp_path / "configs/qwen3-30b-a3b-fp8.json"),
         "concurrency": 20, "context": 32768, "gpu_memory_utilization": 0.9},
    ])


HW = ("--gpus-per-node", "2", "--gpu-memory-gib", "48")


def test_cli_plans_the_models_file_and_prints_the_table(tmp_path):
    result = run_cli("--models", str(two_models(tmp_path)), *HW, "--nodes", "5")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "2 model(s) on 5 node(s) x 2 GPU(s) x 48 GiB" in out
    assert "chat" in out and "qwen2.5-coder" in out
    assert "2 x 1 node" in out and "63 @ 8,192" in out and "96 (126)" in out
    assert "node1, node2" in out and "node3, node4" in out
    assert "spare: node5" in out and "fits: 4 of 5 node(s) assigned" in out


def test_cli_json_is_the_fleet_plan(tmp_path):
    result = run_cli("--models", str(two_models(tmp_path)), *HW, "--nodes", "4", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["fits"] is True and data["spare"] == []
    assert [m["nodes"] for m in data["models"]] == [[["node1"], ["node2"]], [["node3"], ["node4"]]]
    assert data["models"][0]["sequences_per_instance"] == 63


def test_cli_states_each_pipeline_models_network_need_with_the_rates_given(tmp_path):
    (tmp_path / "big.json").write_text((CONFIGS / "llama-3.1-70b.json").read_text())
    (tmp_path / "small.json").write_text((CONFIGS / "llama-3.1-8b.json").read_text())
    models = models_file(tmp_path, [
        {"name": "small", "source": "small.json", "context": 8192},
        {"name": "big", "source": "big.json", "context": 8192, "concurrency": 4},
    ])
    args = ["--models", str(models), *HW, "--nodes", "3", "--decode-rate", "1000",
            "--prefill-rate", "9000"]
    data = json.loads(run_cli(*args, "--json").stdout)
    small, big = (m["plan"] for m in data["models"])
    assert small["decision"] == "replicated" and small["pipeline_network"] is None
    assert big["decision"] == "pipeline"
    assert big["pipeline_network"]["sustained_gbit_s"] == round(32_768 * 10_000 * 8 / 1e9, 3)
    out = flat(run_cli(*args).stdout)
    assert "group network (big): per link: at least" in out
    assert "group network (small)" not in out


def test_cli_writes_the_inventory_folder(tmp_path):
    out = tmp_path / "inv"
    result = run_cli("--models", str(two_models(tmp_path)), *HW, "--nodes", "5",
                     "--write-vars", str(out))
    assert result.exit_code == 0, result.output
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == [
        "group_vars", "group_vars/chat.yml", "group_vars/qwen2_5_coder.yml", "models.yml"]
    wrote = f"wrote {out / 'models.yml'}, {out / 'group_vars/chat.yml'}, " \
            f"{out / 'group_vars/qwen2_5_coder.yml'}"
    assert "".join(wrote.split()) in "".join(result.stdout.split())  # rich wraps paths
    text = (out / "models.yml").read_text()
    assert text.startswith("# Written by `inferfleet plan --models` for 5 node(s)")
    assert "Re-run the planner rather than editing." in text
    assert "override" not in text  # no precedence caveat left to explain
    groups = yaml.safe_load(text)["all"]["children"]["inference"]["children"]
    assert groups == {"chat": {"hosts": {"node1": {}, "node2": {}}},
                      "qwen2_5_coder": {"hosts": {"node3": {}, "node4": {}}}}
    coder = (out / "group_vars" / "qwen2_5_coder.yml").read_text()
    assert coder.startswith("# Written by `inferfleet plan --models` for the group "
                            "qwen2_5_coder of models.yml:\n# qwen2.5-coder from ")
    assert "Re-run the planner rather than editing." in coder
    variables = yaml.safe_load(coder)
    assert variables["inferfleet_model_name"] == "qwen2.5-coder"
    assert "inferfleet_model_version" not in variables
    assert variables["inference_engine_max_model_len"] == 32768
    chat = yaml.safe_load((out / "group_vars" / "chat.yml").read_text())
    assert list(chat)[:3] == ["inferfleet_model_name", "inferfleet_model_version",
                              "inferfleet_topology"]
    assert chat["inferfleet_model_version"] == "v1"


def test_cli_replaces_its_own_files_and_refuses_anyone_elses(tmp_path):
    models = str(two_models(tmp_path))
    out = tmp_path / "inv"
    assert run_cli("--models", models, *HW, "--nodes", "5", "--write-vars",
                   str(out)).exit_code == 0
    # A file of the user's beside them is left alone, and so is an earlier plan's file for
    # a group the plan no longer has (the planner deletes nothing).
    (out / "group_vars" / "all.yml").write_text("inferfleet_model_name: default\n")
    (out / "group_vars" / "old.yml").write_text(
        "# Written by `inferfleet plan --models` for the group old of models.yml:\nx: 1\n")
    (out / "group_vars" / "chat.yml").write_text(
        "# Written by `inferfleet plan` for a single model\ninferfleet_model_name: x\n")
    again = run_cli("--models", models, *HW, "--nodes", "5", "--write-vars", str(out))
    assert again.exit_code == 0, again.output
    assert (out / "group_vars" / "old.yml").exists()
    assert (out / "group_vars" / "all.yml").read_text() == "inferfleet_model_name: default\n"
    assert yaml.safe_load((out / "group_vars" / "chat.yml").read_text())[
        "inferfleet_model_name"] == "chat"
    before = {p: p.read_text() for p in out.rglob("*.yml")}
    for name in ("models.yml", "group_vars/qwen2_5_coder.yml"):
        theirs = out / name
        mine = theirs.read_text()
        theirs.write_text("# my own\n" + mine)
        refused = run_cli("--models", models, *HW, "--nodes", "4", "--write-vars", str(out))
        assert refused.exit_code == 2, refused.output
        message = refused.stderr.replace("\n", " ")
        assert message.startswith(f"error: --write-vars {out}: {theirs} exists and was not "
                                  "written by `inferfleet plan`, so nothing was written")
        assert refused.stdout == ""  # refused before the plan is printed
        assert {p: p.read_text() for p in out.rglob("*.yml")} == {
            **before, theirs: "# my own\n" + mine}
        theirs.write_text(mine)


@pytest.mark.parametrize("target, words", [
    ("file.yml", ["is a file", "takes an inventory folder"]),
    ("new.yml", ["takes an inventory folder", "not a file: give"]),
])
def test_cli_write_vars_is_a_folder_with_models(tmp_path, target, words):
    (tmp_path / "file.yml").write_text("x: 1\n")
    result = run_cli("--models", str(two_models(tmp_path)), *HW, "--nodes", "5",
                     "--write-vars", str(tmp_path / target))
    assert result.exit_code == 2, result.output
    for word in words:
        assert word in result.stderr.replace("\n", " ")
    assert not (tmp_path / "new.yml").exists()
    assert (tmp_path / "file.yml").read_text() == "x: 1\n"


def test_cli_does_not_fit_exits_1_and_writes_nothing(tmp_path):
    out = tmp_path / "inv"
    result = run_cli("--models", str(two_models(tmp_path)), *HW, "--nodes", "3",
                     "--write-vars", str(out))
    assert result.exit_code == 1
    assert not out.exists()
    assert "the fleet has 3: add 1 node(s)" in flat(result.stdout)
    assert "nothing was written" in result.stderr


@pytest.mark.parametrize("content, words", [
    (None, ["no such file"]),
    ("models: [name: chat\n", ["not valid YAML", "line"]),
    ("- name: chat\n", ["write one key, `models:`"]),
    ([{"source": "x.json"}], ["model 1", "`name` is missing"]),
    ([{"name": "chat"}], ["model 1 (chat)", "`source` is missing"]),
    ([{"name": "chat", "source": "x", "replicas": 2}], ["unknown key(s) replicas", "use name"]),
    ([{"name": "chat", "source": "x", "concurrency": 0}], ["`concurrency`", "at least 1"]),
    ([{"name": "chat", "source": "x", "gpu_memory_utilization": 2}], ["(0, 1]"]),
    ([{"name": "chat", "source": "x"}, {"name": "chat", "source": "y"}],
     ["both named 'chat'"]),
    ([{"name": "chat", "source": "missing-folder"}], ["model chat:", "no such folder"]),
])
def test_cli_bad_models_file_is_one_line_exit_2(tmp_path, content, words):
    path = tmp_path / "models.yml"
    if content is not None:
        models_file(tmp_path, content)
    result = run_cli("--models", str(path), *HW)
    assert result.exit_code == 2, result.output
    message = result.stderr.replace("\n", " ")
    assert message.startswith("error: ")
    for word in words:
        assert word in message
    assert "Traceback" not in result.output


def test_cli_model_and_models_exclude_each_other(tmp_path):
    models = str(two_models(tmp_path))
    both = run_cli(str(CONFIGS / "llama-3.1-8b.json"), "--models", models, *HW)
    assert both.exit_code == 2 and "not both" in both.stderr
    neither = run_cli(*HW)
    assert neither.exit_code == 2 and "give a MODEL" in neither.stderr
    per_instance_flag = run_cli("--models", models, *HW, "--concurrency", "4")
    assert per_instance_flag.exit_code == 2 and "set `concurrency` on each" in (
        per_instance_flag.stderr.replace("\n", " "))
    inventory_alone = run_cli(str(CONFIGS / "llama-3.1-8b.json"), *HW, "-i", str(tmp_path))
    assert inventory_alone.exit_code == 2 and "--models only" in inventory_alone.stderr


def inventory(tmp_path: Path) -> Path:
    folder = tmp_path / "inventory"
    folder.mkdir()
    (folder / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {
        "inference": {"hosts": {
            "gpu1": {"ansible_host": "10.0.0.1", "inferfleet_model_name": "chat"},
            "gpu2": {"inferfleet_model_name": "qwen2.5-coder"},
            "gpu3": {"inferfleet_model_name": "qwen2.5-coder"},
            "gpu4": {"inferfleet_model_name": "qwen2.5-coder"},
            "gpu5": {},
        }},
        "loadbalancers": {"hosts": {"lb1": {}}},
    }}}))
    return folder


def test_cli_with_an_inventory_takes_its_nodes_and_checks_its_assignment(tmp_path):
    models = str(two_models(tmp_path))
    inv = inventory(tmp_path)
    result = run_cli("--models", models, *HW, "-i", str(inv), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["hosts"] == ["gpu1", "gpu2", "gpu3", "gpu4", "gpu5"]
    assert data["spare"] == ["gpu5"]
    check = {c["name"]: c for c in data["inventory_check"]["models"]}
    assert check["chat"]["message"] == "holds 63 of 96 sequences: add 1 instance(s) of 1 node(s)"
    assert check["qwen2.5-coder"]["fits"] is True
    assert "1 instance(s) more than needed" in check["qwen2.5-coder"]["message"]
    assert "(none)" in check  # gpu5 serves no model
    # The host variables in hosts.yml would outrank group_vars/chat.yml.
    overridden = " ".join(data["inventory_check"]["overridden"])
    assert "chat: inferfleet_model_name should be 'chat' but the inventory keeps " \
           "gpu2='qwen2.5-coder'" in overridden
    table = run_cli("--models", models, *HW, "-i", str(inv))
    assert table.exit_code == 0, table.output
    assert "against the plan" in flat(table.stdout) and "holds 63 of 96" in table.stdout
    contradiction = run_cli("--models", models, *HW, "-i", str(inv), "--nodes", "3")
    assert contradiction.exit_code == 2
    assert "--nodes 3 contradicts the inventory" in contradiction.stderr
    missing = run_cli("--models", models, *HW, "-i", str(tmp_path / "nowhere"))
    assert missing.exit_code == 2 and "not found" in missing.stderr


ANSIBLE_INVENTORY = Path(sys.executable).parent / "ansible-inventory"


def ansible_hostvars(tmp_path: Path, *sources: Path) -> dict[str, dict]:
    """Each host's variables as Ansible itself merges these inventory sources."""
    done = subprocess.run(
        [str(ANSIBLE_INVENTORY), *(arg for source in sources for arg in ("-i", str(source))),
         "--list"], cwd=tmp_path, capture_output=True, text=True, timeout=120, check=True)
    return json.loads(done.stdout)["_meta"]["hostvars"]


def fleet_inventory(folder: Path) -> Path:
    """The usual layout: hosts in `inference`, the fleet's default model in group_vars/all
    and an engine setting in group_vars/inference."""
    (folder / "group_vars" / "all").mkdir(parents=True)
    (folder / "group_vars" / "inference").mkdir()
    (folder / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {"inference": {
        "hosts": {f"gpu{n}": {} for n in range(1, 6)}}}}}))
    (folder / "group_vars" / "all" / "inferfleet.yml").write_text(
        "inferfleet_model_name: default\ninferfleet_model_version: '1'\n")
    (folder / "group_vars" / "inference" / "engine.yml").write_text(
        "inferfleet_model_name: fleetwide\ninference_engine_max_model_len: 4096\n")
    return folder


@pytest.mark.parametrize("layout", ["into the inventory", "a folder after it"])
def test_ansible_gives_each_planned_host_its_model_over_the_fleet_default(tmp_path, layout):
    """Ansible itself (ansible-inventory) reads the inventory and the written files: each
    planned host gets its model and engine settings over group_vars/all and
    group_vars/inference; the spare node keeps the fleet's. The -i check has nothing to
    report."""
    models = str(two_models(tmp_path))
    inv = fleet_inventory(tmp_path / "prod")
    out = inv if layout == "into the inventory" else tmp_path / "planned"
    result = run_cli("--models", models, *HW, "-i", str(inv), "--write-vars", str(out),
                     "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["inventory_check"]["overridden"] == []
    hostvars = ansible_hostvars(tmp_path, *([inv] if out == inv else [inv, out]))
    served = {host: (hv["inferfleet_model_name"], hv["inferfleet_model_version"],
                     hv.get("inference_engine_max_model_len"))
              for host, hv in hostvars.items()}
    assert served == {
        "gpu1": ("chat", "v1", 8192), "gpu2": ("chat", "v1", 8192),
        # No version in the models file: the fleet's default version stays.
        "gpu3": ("qwen2.5-coder", "1", 32768), "gpu4": ("qwen2.5-coder", "1", 32768),
        "gpu5": ("fleetwide", "1", 4096),  # spare
    }
    hosts = ["gpu1", "gpu2", "gpu3", "gpu4", "gpu5"]
    assert instances(hosts, hostvars) == {host: [host] for host in hosts}
    if out != inv:
        # The planned folder must come after the inventory: as the first source its
        # group_vars lose to the inventory's group_vars/inference.
        first = ansible_hostvars(tmp_path, out, inv)
        assert first["gpu1"]["inferfleet_model_name"] == "fleetwide"


def test_the_check_reports_host_variables_that_outrank_the_plan(tmp_path):
    """Host variables in the inventory beat group_vars/<group>.yml: the -i check names
    them, and the instances the inventory's inferfleet_instance would make of the plan's
    replicas."""
    models = str(two_models(tmp_path))
    inv = fleet_inventory(tmp_path / "prod")
    (inv / "host_vars").mkdir()
    (inv / "host_vars" / "gpu4.yml").write_text("inference_engine_max_model_len: 4096\n")
    hosts = yaml.safe_load((inv / "hosts.yml").read_text())
    hosts["all"]["children"]["inference"]["hosts"].update({
        "gpu1": {"inferfleet_instance": "pair", "inferfleet_rank": 0},
        "gpu2": {"inferfleet_instance": "pair", "inferfleet_rank": 1}})
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    result = run_cli("--models", models, *HW, "-i", str(inv), "--write-vars", str(inv),
                     "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["inventory_check"]["overridden"] == [
        "qwen2_5_coder: inference_engine_max_model_len should be 32768 but the inventory "
        "keeps gpu4=4096",
        "chat: planned as gpu1; gpu2 but the inventory's inferfleet_instance / "
        "inferfleet_rank make the instance gpu1 + gpu2",
    ]
    assert ansible_hostvars(tmp_path, inv)["gpu4"]["inference_engine_max_model_len"] == 4096
    table = run_cli("--models", models, *HW, "-i", str(tmp_path / "prod"))
    assert "change these in the inventory" in flat(table.stdout)
