"""The preflight play refuses an inventory that cannot work, before any host is touched:
site.yml runs against hosts on a local connection and must stop in its first play."""

import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "tests" / "fixtures" / "configs"


def run_site(
    tmp_path: Path, group_vars: dict, hosts=("n1", "n2"), host_vars: dict | None = None
) -> subprocess.CompletedProcess:
    inventory = {
        "all": {
            # the fleet's lock in this test's folder (a refused run keeps it)
            "vars": {
                "ansible_connection": "local",
                "ansible_python_interpreter": sys.executable,
                "inferfleet_lock_path": str(tmp_path / "lock"),
            },
            "children": {"inference": {"hosts": {h: (host_vars or {}).get(h) for h in hosts}}},
        }
    }
    (tmp_path / "inv").mkdir()
    (tmp_path / "inv" / "hosts.yml").write_text(yaml.safe_dump(inventory))
    (tmp_path / "inv" / "group_vars").mkdir()
    (tmp_path / "inv" / "group_vars" / "all.yml").write_text(yaml.safe_dump(group_vars))
    return subprocess.run(
        [
            shutil.which("ansible-playbook") or str(ROOT / ".venv/bin/ansible-playbook"),
            "-i",
            str(tmp_path / "inv"),
            str(ROOT / "site.yml"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def model_folder(tmp_path: Path, config: str) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text((CONFIGS / config).read_text())
    return folder


BASE = {
    "inferfleet_accelerator": "nvidia",
    "inferfleet_model_name": "m",
    "inferfleet_model_version": "v1",
}


def test_an_impossible_fleet_is_refused_with_the_planners_numbers(tmp_path):
    done = run_site(
        tmp_path,
        {
            **BASE,
            "preflight_model_location": str(model_folder(tmp_path, "llama-3.1-70b.json")),
            "preflight_gpus_per_node": 1,
            "preflight_gpu_memory_gib": 24,
            "preflight_context": 8192,
            "preflight_concurrency": 4,
        },
    )
    out = done.stdout + done.stderr
    assert done.returncode != 0
    assert "does not fit 2 node(s) x 1 GPU(s) x 24 GiB" in out
    assert "short by" in out and "GiB per GPU" in out
    assert "Sync the model weights" not in out  # nothing after preflight ran


def test_instances_smaller_than_the_needed_pipeline_are_refused(tmp_path):
    done = run_site(
        tmp_path,
        {
            **BASE,
            "preflight_model_location": str(model_folder(tmp_path, "llama-3.1-70b.json")),
            "preflight_gpus_per_node": 2,
            "preflight_gpu_memory_gib": 48,
            "preflight_context": 8192,
            "preflight_concurrency": 4,
        },
    )
    out = done.stdout + done.stderr
    assert done.returncode != 0
    assert "needs instances of 2 nodes" in out
    assert "inferfleet_instance" in out


def test_bad_rank_is_refused_naming_the_variable(tmp_path):
    done = run_site(tmp_path, {**BASE, "inferfleet_instance": "big", "inferfleet_rank": 0})
    out = done.stdout + done.stderr
    assert done.returncode != 0
    assert "instance big: inferfleet_rank values [0, 0] must be 0..1" in out


def test_unknown_accelerator_is_refused(tmp_path):
    done = run_site(tmp_path, {**BASE, "inferfleet_accelerator": "tpu"})
    assert done.returncode != 0
    assert "set inferfleet_accelerator to cpu or nvidia (now tpu)" in done.stdout


def test_members_of_one_instance_on_different_models_are_refused(tmp_path):
    host_vars = {
        "n1": {"inferfleet_instance": "g", "inferfleet_model_name": "llama"},
        "n2": {"inferfleet_instance": "g", "inferfleet_model_name": "qwen"},
    }
    done = run_site(tmp_path, BASE, host_vars=host_vars)
    out = done.stdout + done.stderr
    assert done.returncode != 0
    assert "instance g (n1, n2)" in out
    assert "n1=llama, n2=qwen" in out
    assert "Sync the model weights" not in out
