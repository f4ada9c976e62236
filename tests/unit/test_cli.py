"""The CLI's parsing, errors and runner, driven through typer's test runner. The deploy
runs are real ansible-runner runs against local-connection hosts that the preflight
refuses, so nothing is touched and the exit code, record and masking are observable."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from rich.console import Console
from typer.testing import CliRunner

from inferfleet import runner
from inferfleet.cli import app

cli = CliRunner()


def commands(runs_dir: Path):
    """The records of the commands' own runs (not of the fleet lock's release)."""
    return (p for p in runs_dir.glob("*/record.json") if not p.parent.name.endswith("-unlock"))


def inventory(tmp_path: Path, group_vars: dict) -> Path:
    inv = tmp_path / "inv"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text(
        yaml.safe_dump(
            {
                "all": {
                    "vars": {
                        "ansible_connection": "local",
                        "inferfleet_lock_path": str(tmp_path / "lock"),
                        "ansible_python_interpreter": sys.executable,
                    },
                    "children": {"inference": {"hosts": {"n1": None}}},
                }
            }
        )
    )
    (inv / "group_vars" / "all.yml").write_text(yaml.safe_dump(group_vars))
    return inv


def test_missing_inventory_is_one_line_without_traceback(tmp_path):
    result = cli.invoke(app, ["deploy", "-i", str(tmp_path / "nope")])
    assert result.exit_code == 1
    assert "does not exist: check the -i path" in result.output
    assert "Traceback" not in result.output


def test_bad_extra_vars_say_how_to_write_them(tmp_path):
    inv = inventory(tmp_path, {})
    result = cli.invoke(app, ["deploy", "-i", str(inv), "-e", "novalue"])
    assert result.exit_code == 1
    assert "write key=value or @file.yml" in result.output


def test_preflight_refusal_exits_4_and_keeps_a_masked_record(tmp_path, runs_dir):
    inv = inventory(
        tmp_path,
        {
            "inferfleet_accelerator": "tpu",
            "inferfleet_model_name": "m",
            "inferfleet_model_version": "v1",
        },
    )
    secret = "sk-this-must-not-leak-42"
    result = cli.invoke(
        app,
        [
            "deploy",
            "-i",
            str(inv),
            "-e",
            f"inference_engine_api_key={secret}",
            "-e",
            "inference_engine_port=9000",
        ],
    )
    assert result.exit_code == 4, result.output
    assert "preflight refused" in result.output
    records = list(commands(runs_dir))
    assert len(records) == 1
    record = json.loads(records[0].read_text())
    assert record["rc"] == 4 and record["command"] == "deploy" and record["mitogen"] is False
    assert record["extra_vars"] == {
        "inference_engine_api_key": "***",
        "inference_engine_port": 9000,
    }
    assert records[0].stat().st_mode & 0o077 == 0
    leaked = [
        p for p in runs_dir.rglob("*") if p.is_file() and secret in p.read_text(errors="ignore")
    ]
    assert leaked == []


def test_mitogen_runs_the_playbook_and_a_bad_setting_is_refused_before_any_run(
    tmp_path, runs_dir, monkeypatch
):
    """INFERFLEET_MITOGEN=1: the same run (the preflight refuses it, exit 4) through
    Mitogen's strategy, and the record says so; a value other than 0/1, or no Mitogen
    installed, stops the command with what to do and no run at all."""
    inv = inventory(tmp_path, {"inferfleet_accelerator": "tpu", "inferfleet_model_name": "m"})
    monkeypatch.setenv("INFERFLEET_MITOGEN", "1")
    result = cli.invoke(app, ["deploy", "-i", str(inv)])
    assert result.exit_code == 4, result.output
    (record,) = [json.loads(p.read_text()) for p in commands(runs_dir)]
    assert (record["rc"], record["mitogen"]) == (4, True)
    runs = sorted(runs_dir.iterdir())

    monkeypatch.setenv("INFERFLEET_MITOGEN", "yes")
    result = cli.invoke(app, ["deploy", "-i", str(inv)])
    assert result.exit_code == 1
    assert "INFERFLEET_MITOGEN='yes': set it to 1 (Mitogen) or 0" in result.output
    monkeypatch.setenv("INFERFLEET_MITOGEN", "1")
    monkeypatch.setattr(runner.importlib.util, "find_spec", lambda name: None)
    result = cli.invoke(app, ["deploy", "-i", str(inv)])
    assert result.exit_code == 1
    assert "pip install 'inferfleet[mitogen]', or unset it" in result.output
    assert sorted(runs_dir.iterdir()) == runs


def test_mask_covers_nested_secrets():
    masked = runner.mask(
        {
            "load_balancer_api_keys": [{"id": "a", "key": "k"}],
            "nested": {"s3_secret_key": "s", "port": 1},
            "empty_token": "",
        }
    )
    assert masked == {
        "load_balancer_api_keys": [{"id": "a", "key": "***"}],
        "nested": {"s3_secret_key": "***", "port": 1},
        "empty_token": "",
    }


def test_exit_codes():
    progress = runner.Progress(console=None)
    assert runner.exit_code("successful", {}, progress, cancelled=False) == 0
    assert runner.exit_code("failed", {"failures": {"a": 1}}, progress, cancelled=False) == 2
    assert runner.exit_code("failed", {"dark": {"a": 1}}, progress, cancelled=False) == 3
    assert runner.exit_code("failed", {}, progress, cancelled=True) == 130
    progress.data = {"inferfleet_preflight": {"a": {"model_sync": "passed"}}}
    assert runner.exit_code("failed", {"failures": {"a": 1}}, progress, cancelled=False) == 2
    progress.data = {"inferfleet_preflight": {"a": {"model_sync": "passed", "rollout": "open"}}}
    assert runner.exit_code("failed", {"failures": {"a": 1}}, progress, cancelled=False) == 4
    assert runner.refused(progress.data) == ["a: rollout"]


def test_only_allowed_environment_reaches_the_playbook(monkeypatch):
    monkeypatch.setenv("ANSIBLE_FORKS", "3")
    monkeypatch.setenv("GITHUB_TOKEN", "should-not-pass")
    with runner.allowed_environment():
        import os

        assert os.environ.get("ANSIBLE_FORKS") == "3"
        assert "GITHUB_TOKEN" not in os.environ
    import os

    assert os.environ["GITHUB_TOKEN"] == "should-not-pass"


def test_diff_lines_render_file_diffs_and_prepared_text():
    res = {
        "changed": True,
        "diff": {
            "before": "a\nmax 8\n",
            "after": "a\nmax 4\n",
            "before_header": "/etc/x.conf",
            "after_header": "new",
        },
        "results": [{"diff": [{"prepared": "+ package foo"}]}, {"censored": "hidden"}],
    }
    lines = runner.diff_lines(res)
    assert lines[:2] == ["--- /etc/x.conf", "+++ new"]
    assert "-max 8" in lines and "+max 4" in lines
    assert lines[-1] == "+ package foo"
    assert runner.diff_lines({"censored": "the output has been hidden"}) == []


def test_status_shows_each_load_balancers_view_of_an_instance():
    from inferfleet.commands.status import lb_view

    balancers = {
        "lb2": {"kind": "nginx", "backends": {}},
        "lb1": {"kind": "haproxy", "backends": {"node1": "UP", "node2": "DOWN"}},
    }
    assert lb_view(balancers, "node2") == "lb1: DOWN, lb2: passive"
    assert lb_view(balancers, "node9") == "lb1: unknown, lb2: passive"


def test_status_reads_prometheus_answers_per_instance_and_the_firing_alerts():
    from inferfleet.commands.status import alert_line, prometheus_view

    # The shape of Prometheus' /api/v1/query answer (data.result of an instant vector).
    def sample(value, **labels):
        return {"metric": labels, "value": [1764522000.0, value]}

    msg = {
        "answers": {
            "requests_per_s": [
                sample("1.5", inferfleet_instance="node1"),
                sample("0", inferfleet_instance="node2"),
            ],
            # histogram_quantile over no requests is NaN: no figure, not 0 s.
            "ttft_p95_s": [
                sample("0.12", inferfleet_instance="node1"),
                sample("NaN", inferfleet_instance="node2"),
            ],
            "kv_cache_use": [sample("0.25", inferfleet_instance="node1")],
            "alerts": [
                sample(
                    "1",
                    alertname="InferfleetEngineDown",
                    alertstate="firing",
                    severity="critical",
                    instance="node2",
                    inferfleet_instance="node2",
                ),
                sample(
                    "1",
                    alertname="InferfleetBackendDown",
                    alertstate="firing",
                    severity="warning",
                    instance="lb",
                    server="node2",
                ),
            ],
        },
        "errors": {},
    }
    view = prometheus_view("mon", msg)
    assert view["instances"] == {
        "node1": {"requests_per_s": 1.5, "ttft_p95_s": 0.12, "kv_cache_use": 0.25},
        "node2": {"requests_per_s": 0.0},
    }
    assert [alert_line(a) for a in view["alerts"]] == [
        "InferfleetBackendDown (warning) lb node2",
        "InferfleetEngineDown (critical) node2",
    ]
    # Prometheus did not answer: no figures, and the error is kept for the operator.
    down = prometheus_view("mon", {"answers": {"alerts": None}, "errors": {"alerts": "refused"}})
    assert down == {"host": "mon", "instances": {}, "alerts": [], "errors": {"alerts": "refused"}}


@pytest.mark.parametrize(
    "args, words",
    [
        (["rollout", "--serial", "0"], "roll at least one instance per batch"),
        (["rollback", "--max-fail-percentage", "150"], "give a percentage, 0 to 100"),
        (
            ["rollout", "-e", "inference_engine_group_backend=ray"],
            "a rollout does not change a multi-node instance's back end",
        ),
    ],
)
def test_rollout_options_are_checked_before_any_run(tmp_path, runs_dir, args, words):
    result = cli.invoke(app, [*args, "-i", str(inventory(tmp_path, {}))])
    assert result.exit_code == 1 and words in result.output
    assert not list(commands(runs_dir))  # no run (the fleet lock may exist)


@pytest.mark.parametrize(
    "command, playbook",
    [
        (["rollout", "--version", "v2", "--serial", "2"], "rolling_update.yml"),
        (
            ["rollout", "-e", "inference_engine_max_num_seqs=6", "--from-inventory"],
            "rolling_update.yml",
        ),
        (["rollback"], "rollback.yml"),
    ],
)
def test_rollout_and_rollback_run_their_playbook_and_record_the_batch(
    tmp_path, runs_dir, command, playbook
):
    inv = inventory(
        tmp_path,
        {
            "inferfleet_accelerator": "tpu",
            "inferfleet_model_name": "m",
            "inferfleet_model_version": "v1",
        },
    )
    result = cli.invoke(app, [*command, "-i", str(inv)])
    assert result.exit_code == 4, result.output
    (record,) = [json.loads(p.read_text()) for p in commands(runs_dir)]
    assert record["command"] == command[0] and record["playbook"] == playbook
    assert record["extra_vars"]["rollout_serial"] == (2 if "--serial" in command else 1)
    assert record["extra_vars"]["rollout_max_fail_percentage"] == 0
    if "--version" in command:
        assert record["extra_vars"]["inferfleet_model_version"] == "v2"
    if command[0] == "rollout":
        # What the nodes record as their release: what was given, not the batch options.
        given = ["inferfleet_model_version"] if "--version" in command else []
        given += ["inference_engine_max_num_seqs"] if "-e" in command else []
        assert record["extra_vars"]["rollout_release_vars"] == given
        assert record["extra_vars"]["rollout_release_reset"] == ("--from-inventory" in command)


def test_a_canary_pipeline_instance_rolls_with_all_its_members(tmp_path, runs_dir):
    inv = two_node_inventory(tmp_path, ["a", "c", "b"])
    (inv / "group_vars").mkdir()
    (inv / "group_vars" / "all.yml").write_text(
        yaml.safe_dump(
            {
                "ansible_connection": "local",
                "ansible_python_interpreter": sys.executable,
                "inferfleet_lock_path": str(tmp_path / "lock"),
                "inferfleet_accelerator": "tpu",  # the preflight refuses: nothing runs
                "inferfleet_model_name": "m",
                "inferfleet_model_version": "v1",
            }
        )
    )
    (inv / "host_vars").mkdir()
    for host, rank in (("a", 1), ("b", 0)):
        (inv / "host_vars" / f"{host}.yml").write_text(
            yaml.safe_dump({"inferfleet_instance": "pp", "inferfleet_rank": rank})
        )
    result = cli.invoke(app, ["rollout", "--canary", "--version", "v2", "-i", str(inv)])
    assert result.exit_code == 4, result.output
    assert "canary: instance pp (b, a) first" in " ".join(result.output.split())
    (record,) = [json.loads(p.read_text()) for p in commands(runs_dir)]
    assert (record["command"], record["limit"]) == ("rollout canary", "b,a")


@pytest.mark.parametrize("version", ["current", "v/2", "_v2", ""])
def test_lab_publish_refuses_a_version_name_model_sync_would_refuse(version):
    result = cli.invoke(app, ["lab", "publish", version])
    assert result.exit_code == 1 and "use letters, digits" in result.output


def test_lab_commands_without_the_lab_say_to_bring_it_up(tmp_path, monkeypatch):
    from inferfleet.commands import common

    lab = inventory(tmp_path, {})  # the lab's inventory as committed: no generated keys
    monkeypatch.setattr(common, "LAB_INVENTORY", lab)
    for command in (["status"], ["verify"], ["rollback"], ["deploy"]):
        result = cli.invoke(app, command)
        assert result.exit_code == 1, (command, result.output)
        assert "the lab is not up" in result.output and "inferfleet lab up" in result.output


def two_node_inventory(tmp_path: Path, nodes: list[str]) -> Path:
    inv = tmp_path / "fleet"
    inv.mkdir()
    (inv / "hosts.yml").write_text(
        yaml.safe_dump(
            {
                "all": {
                    "children": {
                        "inference": {"hosts": dict.fromkeys(nodes)},
                        "loadbalancers": {"hosts": {"lb": None}},
                    }
                }
            }
        )
    )
    return inv


@pytest.mark.parametrize(
    "nodes, args, words",
    [
        (["n1"], [], "--failover needs two instances or more"),
        (
            ["n1", "n2"],
            ["--failover-node", "lb"],
            "--failover-node lb: name an instance's node (n1, n2)",
        ),
        (["n1", "n2"], ["--failover-timeout", "0"], "--failover-timeout 0: give seconds"),
    ],
)
def test_failover_refuses_what_it_cannot_do_before_any_request(
    tmp_path, runs_dir, nodes, args, words
):
    inv = two_node_inventory(tmp_path, nodes)
    result = cli.invoke(app, ["verify", "--failover", *args, "-i", str(inv)])
    assert result.exit_code == 1 and words in result.output, result.output
    assert not list(commands(runs_dir))  # no run (the fleet lock may exist)


def test_haproxy_durations_read_as_seconds():
    from inferfleet.fleet import duration

    assert duration("10s") == 10 and duration("500ms") == 0.5 and duration("2m") == 120
    assert duration(1500) == 1.5  # a bare number is milliseconds, as in HAProxy


def test_playbooks_hand_the_cli_their_reports_as_set_stats_data(tmp_path, runs_dir):
    """The contract between status.yml and `inferfleet status` is data (set_stats),
    keyed by host, not the name of a task: a real run of the shipped playbook."""
    inv = tmp_path / "inv"
    inv.mkdir()
    (inv / "hosts.yml").write_text(
        yaml.safe_dump(
            {
                "all": {
                    "vars": {
                        "ansible_connection": "local",
                        "ansible_python_interpreter": sys.executable,
                    },
                    "children": {
                        "loadbalancers": {
                            "hosts": {
                                # an address this machine holds: 127.0.0.1
                                "lb1": {"load_balancer_kind": "nginx",
                                        "load_balancer_virtual_ip": "127.0.0.1"},
                                "lb2": {"load_balancer_kind": "nginx"},
                            }
                        }
                    },
                }
            }
        )
    )
    result = runner.run_playbook("status", "status.yml", inv, console=Console(quiet=True))
    assert result.rc == 0, result.failures
    assert result.data == {
        "inferfleet_status_balancers": {
            "lb1": {"kind": "nginx", "backends": {}, "routers": {}, "virtual_ip": "127.0.0.1",
                    "holds_virtual_ip": True},
            "lb2": {"kind": "nginx", "backends": {}, "routers": {}, "virtual_ip": "",
                    "holds_virtual_ip": False},
        }
    }


def test_every_preflight_marks_itself_open_then_passed():
    """A refusal is told by data: each preflight task file opens its stage first, for the
    play's hosts in one step, and closes it last, so a failure anywhere inside leaves it
    open for the hosts still in the play (runner.refused)."""
    root = Path(__file__).resolve().parents[2]
    files = sorted(root.glob("roles/*/tasks/preflight*.yml")) + [
        root / "roles/preflight/tasks/inventory.yml",
        root / "roles/preflight/tasks/capacity.yml",
        root / "roles/fabric_preflight/tasks/checks.yml",
    ]
    stages = set()
    for path in files:
        tasks = yaml.safe_load(path.read_text())
        assert tasks[0]["run_once"] is True and tasks[-1]["run_once"] is True, path
        first, last = tasks[0]["ansible.builtin.set_stats"], tasks[-1]["ansible.builtin.set_stats"]
        opened = first["data"]["inferfleet_preflight"]
        closed = last["data"]["inferfleet_preflight"]
        stage = opened.split("{'")[1].split("'")[0]
        marks = f"dict(ansible_play_hosts | product([{{'{stage}': 'open'}}]))"
        assert opened == f"{{{{ {marks} }}}}", path
        assert closed == opened.replace("'open'", "'passed'"), path
        stages.add(stage)
    assert len(stages) == len(files)  # one stage name per file


def tasks_run(runs_dir: Path) -> set[str]:
    """The names of the tasks that ran (ok or failed) in the runs under `runs_dir`."""
    events = (json.loads(p.read_text()) for p in runs_dir.glob("*/artifacts/*/job_events/*.json"))
    return {
        e["event_data"]["task"]
        for e in events
        if e["event"] in ("runner_on_ok", "runner_on_failed")
    }


def _locked_by(tmp_path: Path, holder: dict) -> Path:
    lock = tmp_path / "lock"
    lock.mkdir(mode=0o700)
    (lock / "holder.json").write_text(json.dumps(holder))
    return lock


def test_a_command_is_refused_while_another_holds_the_fleets_lock(tmp_path, runs_dir):
    inv = inventory(tmp_path, {})
    other = {
        "user": "ana",
        "controller": "bastion2",
        "command": "inferfleet rollout",
        "since": "2026-12-01T10:00:00Z",
        "token": "theirs",
        "pid": 4242,
        "boot_id": "b",
    }
    lock = _locked_by(tmp_path, other)
    result = cli.invoke(app, ["deploy", "-i", str(inv)])
    words = " ".join(result.output.split())
    assert result.exit_code == runner.LOCKED, result.output
    assert (
        "locked by ana@bastion2, running `inferfleet rollout` since 2026-12-01T10:00:00Z" in words
    )
    assert "--force-unlock" in words and "another operation holds the fleet's lock" in words
    # Nothing ran past the lock (no preflight) and the lock is still theirs.
    assert tasks_run(runs_dir) and all(t.startswith("Lock | ") for t in tasks_run(runs_dir))
    assert [json.loads(p.read_text())["rc"] for p in commands(runs_dir)] == [runner.LOCKED]
    assert json.loads((lock / "holder.json").read_text()) == other

    forced = cli.invoke(app, ["deploy", "-i", str(inv), "--force-unlock"])
    words = " ".join(forced.output.split())
    assert "two now change the fleet at once" in words
    assert forced.exit_code == 4, forced.output  # it ran: this inventory fails preflight
    assert not lock.exists()  # taken, then released at the end


def test_a_lock_left_by_a_run_of_this_controller_that_is_gone_is_broken(tmp_path, runs_dir):
    inv = inventory(tmp_path, {})
    dead = subprocess.Popen(["true"])
    dead.wait()
    mine = runner.holder("rollout") | {"pid": dead.pid, "token": "gone", "since": "earlier"}
    lock = _locked_by(tmp_path, mine)
    result = cli.invoke(app, ["deploy", "-i", str(inv)])
    assert "broke the fleet's lock left by `inferfleet rollout`" in " ".join(result.output.split())
    assert result.exit_code == 4, result.output
    assert not lock.exists()
    # A live one of this controller (this very process) is not broken.
    _locked_by(tmp_path, runner.holder("rollout") | {"token": "live", "since": "now"})
    assert cli.invoke(app, ["deploy", "-i", str(inv)]).exit_code == runner.LOCKED


def two_model_inventory(tmp_path: Path) -> Path:
    """n1 serves a, n2 serves b (the fleet-wide default is a); the preflight refuses (tpu)."""
    inv = inventory(
        tmp_path,
        {
            "inferfleet_accelerator": "tpu",
            "inferfleet_model_name": "a",
            "inferfleet_model_version": "v1",
        },
    )
    hosts = yaml.safe_load((inv / "hosts.yml").read_text())
    engines = {"n1": None, "n2": {"inferfleet_model_name": "b"}}
    hosts["all"]["children"]["inference"]["hosts"] = engines
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    return inv


@pytest.mark.parametrize(
    "args, words",
    [
        (["rollout", "--version", "v2"], "serves a, b: name the one to rollout with --model"),
        (["rollback"], "serves a, b: name the one to rollback with --model"),
        (["rollout", "--model", "c", "--version", "v2"], "--model c: no instance serves it"),
    ],
)
def test_a_fleet_of_several_models_rolls_one_model_at_a_time(tmp_path, runs_dir, args, words):
    result = cli.invoke(app, [*args, "-i", str(two_model_inventory(tmp_path))])
    assert result.exit_code == 1, result.output
    assert words in " ".join(result.output.split())
    assert not list(commands(runs_dir))


@pytest.mark.parametrize("command", [["rollout", "--version", "v2"], ["rollback"]])
def test_a_models_rollout_is_limited_to_its_instances_and_the_load_balancers(
    tmp_path, runs_dir, command
):
    result = cli.invoke(app, [*command, "--model", "b", "-i", str(two_model_inventory(tmp_path))])
    assert result.exit_code == 4, result.output  # the preflight refused: nothing ran
    (record,) = [json.loads(p.read_text()) for p in commands(runs_dir)]
    assert record["limit"] == "n2,loadbalancers"


@pytest.mark.parametrize("args, words", [
    (["--routing", "cache"], "--routing cache: use leastconn, roundrobin, prefix"),
    (["--engine", "gpu"], "--engine gpu: use vllm or sim"),
    (["--nodes", "6"], "the lab runs 2; for more nodes add --engine sim"),
    (["--nodes", "65", "--engine", "sim"], "--nodes 65: give 2 to 64"),
    (["--nodes", "1", "--engine", "sim"], "--nodes 1: give 2 to 64"),
    (["--models", "2", "--engine", "sim"], "--models 2 puts the second model on a third vLLM node"),
])
def test_lab_up_refuses_a_shape_it_cannot_build_before_touching_anything(args, words):
    result = cli.invoke(app, ["lab", "up", *args])
    assert result.exit_code == 1 and words in " ".join(result.output.split())


def test_a_simulated_lab_inventory_as_ansible_reads_it(tmp_path):
    """`lab up --nodes 5 --engine sim` lists nodes 1 to 5 and runs the sim runtime on all
    five, with the lab's other settings, and lifts the key's rate limit on the load
    balancer; read back by Ansible itself, and by read_nodes."""
    from inferfleet.lab import fleet

    root = Path(__file__).resolve().parents[2]
    lab = tmp_path / "lab"
    for tracked in ("hosts.yml", "group_vars/all/lab.yml"):  # not a running lab's files
        (lab / tracked).parent.mkdir(parents=True, exist_ok=True)
        (lab / tracked).write_text((root / "inventories" / "lab" / tracked).read_text())
    assert fleet.read_nodes(lab) == (2, "vllm")
    fleet.write_nodes(lab, 5, "sim")
    assert fleet.read_nodes(lab) == (5, "sim")
    listed = json.loads(subprocess.run(
        [str(Path(sys.executable).parent / "ansible-inventory"), "-i", str(lab), "--list"],
        capture_output=True, text=True, check=True).stdout)
    nodes = [f"inferfleet-lab-node{i}" for i in range(1, 6)]
    assert sorted(listed["inference"]["hosts"]) == nodes
    for node in nodes:
        hostvars = listed["_meta"]["hostvars"][node]
        assert hostvars["inference_engine_runtime"] == "sim"
        assert hostvars["inference_engine_max_num_seqs"] == 8  # the lab's own
    lb = listed["_meta"]["hostvars"]["inferfleet-lab-lb"]
    assert lb["load_balancer_rate_limit_requests"] == 100000
    assert lb["load_balancer_port"] == 8080  # the lab's own
    fleet.write_nodes(lab, 2, "vllm")  # the lab's own shape: no file
    assert not (lab / "nodes.yml").exists() and fleet.read_nodes(lab) == (2, "vllm")


def test_a_lab_inventory_with_nginx_as_ansible_reads_it(tmp_path):
    """`lab up --nginx --nodes 3 --engine sim --routing prefix`: Nginx joins `loadbalancers`
    beside HAProxy, neither a peer of a shared address, both with the sim lab's lifted rate
    limit, HAProxy alone routing by prefix (Nginx has no such routing); off again, the
    files are gone and the lab has HAProxy alone, routing by leastconn."""
    from inferfleet.lab import fleet

    root = Path(__file__).resolve().parents[2]
    lab = tmp_path / "lab"
    for tracked in ("hosts.yml", "group_vars/all/lab.yml"):
        (lab / tracked).parent.mkdir(parents=True, exist_ok=True)
        (lab / tracked).write_text((root / "inventories" / "lab" / tracked).read_text())
    fleet.write_nginx(lab, True)
    fleet.write_nodes(lab, 3, "sim")
    fleet.write_routing(lab, "prefix")
    assert fleet.inventory_hosts(lab)["loadbalancers"] == ["inferfleet-lab-lb", fleet.NGINX_HOST]
    listed = json.loads(subprocess.run(
        [str(Path(sys.executable).parent / "ansible-inventory"), "-i", str(lab), "--list"],
        capture_output=True, text=True, check=True).stdout)
    assert sorted(listed["loadbalancers"]["hosts"]) == ["inferfleet-lab-lb", fleet.NGINX_HOST]
    hostvars = listed["_meta"]["hostvars"]
    assert hostvars[fleet.NGINX_HOST]["load_balancer_kind"] == "nginx"
    assert "load_balancer_kind" not in hostvars["inferfleet-lab-lb"]  # HAProxy, the default
    assert hostvars["inferfleet-lab-lb"]["load_balancer_routing"] == "prefix"
    assert "load_balancer_routing" not in hostvars[fleet.NGINX_HOST]
    for lb in ("inferfleet-lab-lb", fleet.NGINX_HOST):
        assert hostvars[lb]["load_balancer_ha"] == "none"
        assert hostvars[lb]["load_balancer_rate_limit_requests"] == 100000
    assert "load_balancer_router_pip_find_links" not in hostvars["inferfleet-lab-lb"]
    fleet.write_routing(lab, "cache_aware")  # the router installs from the mounted wheels
    listed = json.loads(subprocess.run(
        [str(Path(sys.executable).parent / "ansible-inventory"), "-i", str(lab), "--list"],
        capture_output=True, text=True, check=True).stdout)
    hostvars = listed["_meta"]["hostvars"]
    assert hostvars["inferfleet-lab-lb"]["load_balancer_routing"] == "cache_aware"
    assert (hostvars["inferfleet-lab-lb"]["load_balancer_router_pip_find_links"]
            == fleet.ROUTER_WHEELS_MOUNT)
    assert "load_balancer_routing" not in hostvars[fleet.NGINX_HOST]
    fleet.write_nginx(lab, False)
    fleet.write_routing(lab, "leastconn")
    assert not (lab / fleet.NGINX_FILE).exists() and not (lab / fleet.ROUTING_FILE).exists()
    assert fleet.balancers(lab) == ["inferfleet-lab-lb"]


def test_lab_up_without_nginx_on_a_lab_that_has_it_is_refused(tmp_path, monkeypatch):
    """A running lab does not lose its Nginx by a plain `lab up`: it says how it runs."""
    from inferfleet.commands import lab as lab_cmd
    from inferfleet.lab import fleet

    inventory = tmp_path / "lab"
    inventory.mkdir()
    root = Path(__file__).resolve().parents[2]
    (inventory / "hosts.yml").write_text((root / "inventories/lab/hosts.yml").read_text())
    fleet.write_nginx(inventory, True)
    monkeypatch.setattr(lab_cmd, "LAB_INVENTORY", inventory)
    monkeypatch.setattr(lab_cmd, "require_lab", lambda: None)
    monkeypatch.setattr(lab_cmd.services, "containers", lambda name: ["inferfleet-lab-lb"])
    result = cli.invoke(app, ["lab", "up"])
    words = " ".join(result.output.split())
    assert result.exit_code == 1, result.output
    assert "the lab runs as `lab up --nodes 2 --engine vllm --nginx`" in words, words
    assert (inventory / fleet.NGINX_FILE).is_file()


def test_lab_up_without_monitoring_on_a_lab_that_has_it_is_refused(tmp_path, monkeypatch):
    """Nor its monitoring host: `lab up --nodes 4 --engine sim` on a lab made with
    --monitoring says how it runs and keeps monitoring.yml."""
    from inferfleet.commands import lab as lab_cmd
    from inferfleet.lab import fleet

    inventory = tmp_path / "lab"
    inventory.mkdir()
    root = Path(__file__).resolve().parents[2]
    (inventory / "hosts.yml").write_text((root / "inventories/lab/hosts.yml").read_text())
    fleet.write_nodes(inventory, 4, "sim")
    fleet.write_monitoring(inventory, True, "sim")
    monkeypatch.setattr(lab_cmd, "LAB_INVENTORY", inventory)
    monkeypatch.setattr(lab_cmd, "require_lab", lambda: None)
    monkeypatch.setattr(lab_cmd.services, "containers", lambda name: ["inferfleet-lab-lb"])
    result = cli.invoke(app, ["lab", "up", "--nodes", "4", "--engine", "sim"])
    words = " ".join(result.output.split())
    assert result.exit_code == 1, result.output
    assert "the lab runs as `lab up --nodes 4 --engine sim --monitoring`" in words, words
    assert fleet.has_monitoring(inventory)


@pytest.mark.parametrize("engine", ["sim", "vllm"])
def test_a_lab_inventory_with_a_monitoring_host_as_ansible_reads_it(tmp_path, engine):
    """`lab up --monitoring`: a host of its own in `monitoring`, every load balancer's
    admin bind (its metrics) on its lab name, where Prometheus reaches it; on a simulated
    lab only the monitoring host runs a node exporter (the nodes share one machine), on the
    vLLM lab every host does; off again, or after `lab down`, the file is gone."""
    from inferfleet.lab import fleet

    root = Path(__file__).resolve().parents[2]
    lab = tmp_path / "lab"
    for tracked in ("hosts.yml", "group_vars/all/lab.yml"):
        (lab / tracked).parent.mkdir(parents=True, exist_ok=True)
        (lab / tracked).write_text((root / "inventories" / "lab" / tracked).read_text())
    nodes = 3 if engine == "sim" else 2
    fleet.write_nginx(lab, True)
    fleet.write_nodes(lab, nodes, engine)
    fleet.write_monitoring(lab, True, engine)
    assert fleet.inventory_hosts(lab)["monitoring"] == [fleet.MONITORING_HOST]
    listed = json.loads(subprocess.run(
        [str(Path(sys.executable).parent / "ansible-inventory"), "-i", str(lab), "--list"],
        capture_output=True, text=True, check=True).stdout)
    assert listed["monitoring"]["hosts"] == [fleet.MONITORING_HOST]
    hostvars = listed["_meta"]["hostvars"]
    balancers = ["inferfleet-lab-lb", fleet.NGINX_HOST]
    for lb in balancers:
        assert hostvars[lb]["load_balancer_admin_address"] == lb
    for host in [*(fleet.node_name(i) for i in range(1, nodes + 1)), *balancers]:
        exporter = hostvars[host].get("monitoring_node_exporter_enabled")
        assert exporter is (False if engine == "sim" else None), (host, exporter)
    assert "monitoring_node_exporter_enabled" not in hostvars[fleet.MONITORING_HOST]
    fleet.write_monitoring(lab, False, engine)
    assert not fleet.has_monitoring(lab) and "monitoring" not in fleet.inventory_hosts(lab)
    fleet.write_monitoring(lab, True, engine)
    fleet.remove_state(lab)
    assert not fleet.has_monitoring(lab)


def test_cache_aware_on_a_lab_made_without_the_router_wheels_is_refused(tmp_path, monkeypatch):
    """`lab up --routing cache_aware` on a running lab whose load balancer was made
    without vllm-router's wheels mounted says to take the lab down first, and changes
    nothing."""
    from inferfleet.commands import lab as lab_cmd
    from inferfleet.lab import fleet

    inventory = tmp_path / "lab"
    inventory.mkdir()
    root = Path(__file__).resolve().parents[2]
    (inventory / "hosts.yml").write_text((root / "inventories/lab/hosts.yml").read_text())
    monkeypatch.setattr(lab_cmd, "LAB_INVENTORY", inventory)
    monkeypatch.setattr(lab_cmd, "require_lab", lambda: None)
    monkeypatch.setattr(lab_cmd.services, "containers", lambda name: ["inferfleet-lab-lb"])
    monkeypatch.setattr(fleet, "mounts", lambda host: ["/opt/inferfleet/wheelhouse"])
    result = cli.invoke(app, ["lab", "up", "--routing", "cache_aware"])
    words = " ".join(result.output.split())
    assert result.exit_code == 1, result.output
    assert "inferfleet-lab-lb runs without vllm-router's wheels" in words, words
    assert "run `inferfleet lab down` first" in words, words
    assert not (inventory / fleet.ROUTING_FILE).exists()


def test_lab_hosts_beyond_the_inotify_limit_are_refused_with_the_fix():
    from inferfleet.lab import fleet

    assert fleet.inotify_shortfall(17, limit=128) == ""
    said = fleet.inotify_shortfall(33, limit=128)
    assert said.startswith("33 lab hosts need about 165 inotify instances, and this machine")
    assert "sysctl -w fs.inotify.max_user_instances=1024" in said


@pytest.mark.parametrize("counts, served", [([5, 5, 5, 6], 1), ([5] * 20, 0)])
def test_failover_waits_for_the_returned_engine_to_serve_up_to_a_second_per_instance(
    tmp_path, monkeypatch, counts, served
):
    """`verify --failover`'s last check with the playbook, the load and the engines stood
    in for (molecule/replicated and the install test run them for real): under its light
    load a returning engine of a large fleet may get its first request well after the slow
    start; the check waits for it, a second more per instance of its model at most, and
    fails when none comes."""
    from types import SimpleNamespace

    from inferfleet import fleet as fleet_mod
    from inferfleet.commands import verify as cmd

    inv = two_node_inventory(tmp_path, ["n1", "n2", "n3"])
    fleet = fleet_mod.load(inv)
    node = fleet.serving[-1]
    clock = [0.0]
    fake_time = SimpleNamespace(time=lambda: 1000.0 + clock[0], monotonic=lambda: clock[0],
                                sleep=lambda s: clock.__setitem__(0, clock[0] + s))
    reads = iter(counts)

    class Load:
        calls: list = []

        def __init__(self, *a, **k):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def failed(self):
            return []

    report = {"stopped_at": 1000.0, "down_at": 1003.0, "started_at": 1010.0, "up_at": 1011.0,
              "haproxies": ["lb"]}
    monkeypatch.setattr(cmd, "time", fake_time)
    monkeypatch.setattr(cmd, "_health_moments", lambda node, stop, out: None)
    monkeypatch.setattr(cmd.v, "LoadLoop", Load)
    monkeypatch.setattr(cmd, "_counters", lambda fleet, node: (next(reads), 0.0))
    monkeypatch.setattr(cmd, "run_playbook", lambda *a, **k: SimpleNamespace(
        data={"inferfleet_failover": {node.host: report}}, failures=[]))
    checks, figures = cmd._failover(fleet, inv, node, 60, True)
    assert figures["served_after_back"] == served
    assert dict((name, ok) for name, ok, _ in checks)["failover: put back"] is (served > 0)
    waited = clock[0] - (fleet.slowstart + 5)
    assert waited == (2 if served else len(fleet.serving_of(node.model))), waited
