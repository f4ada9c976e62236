"""The rollout role's read of a node (plugins/modules/release_info.py), run by Ansible on a
local connection: the release record, whether the engine's unit is active (here: a unit
systemd does not know, so not serving) and the model version the cache serves, in one
step; a record that is not one fails naming the file and what to do."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import yaml
from ansible_collections.inferfleet.fleet.plugins.module_utils import model_sync_transfer

ROOT = Path(__file__).resolve().parents[2]


def read(tmp_path: Path) -> subprocess.CompletedProcess:
    play = [{
        "hosts": "localhost",
        "gather_facts": False,
        "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
        "tasks": [
            {"inferfleet.fleet.release_info": {
                "state_dir": str(tmp_path / "rollout"), "unit": "inferfleet-no-such-engine.service",
                "model_name": "tiny", "cache_root": str(tmp_path / "models")},
             "register": "node"},
            {"ansible.builtin.copy": {"content": "{{ node | to_json }}",
                                      "dest": str(tmp_path / "node.json")}},
        ],
    }]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    return subprocess.run(
        [shutil.which("ansible-playbook") or str(ROOT / ".venv/bin/ansible-playbook"),
         "-i", "localhost,", str(tmp_path / "play.yml")],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )


def test_a_node_without_record_or_model(tmp_path):
    done = read(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    node = json.loads((tmp_path / "node.json").read_text())
    assert node["recorded"] == {} and node["serving"] is False
    assert node["served"]["version"] == "" and node["served"]["digest"] == ""
    assert node["served"]["cache_dir"] == str(tmp_path / "models/tiny")


def test_a_node_with_a_record_and_a_verified_version(tmp_path):
    (tmp_path / "rollout").mkdir()
    (tmp_path / "rollout/release.json").write_text(
        json.dumps({"vars": {"inferfleet_model_version": "v2"}, "at": "then"}))
    version = tmp_path / "models/tiny/v2"
    version.mkdir(parents=True)
    (version / model_sync_transfer.MARKER_FILE).write_text("sha256:abc\n")
    (tmp_path / "models/tiny/current").symlink_to("v2")
    done = read(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    node = json.loads((tmp_path / "node.json").read_text())
    assert node["recorded"] == {"inferfleet_model_version": "v2"}
    assert node["served"] == {"version": "v2", "digest": "sha256:abc",
                              "path": str(tmp_path / "models/tiny/current"),
                              "cache_dir": str(tmp_path / "models/tiny")}


def test_a_record_that_is_not_one_is_refused_naming_it(tmp_path):
    (tmp_path / "rollout").mkdir()
    (tmp_path / "rollout/release.json").write_text("{half")
    done = read(tmp_path)
    out = " ".join(done.stdout.split())
    assert done.returncode != 0
    assert f"{tmp_path}/rollout/release.json is not a release record" in out
    assert "remove it to run with the inventory" in out
