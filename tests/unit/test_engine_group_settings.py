"""The engine role's settings preflight (roles/inference_engine/tasks/preflight.yml) for
multi-node instances and the sim runtime, run by Ansible on a local connection: each bad
setting is refused with a message that names the variable to change."""

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def preflight(tmp_path: Path, settings: dict) -> subprocess.CompletedProcess:
    play = [{
        "hosts": "localhost",
        "gather_facts": False,
        "vars": {"ansible_connection": "local", "inferfleet_accelerator": "cpu", **settings},
        "tasks": [{"ansible.builtin.include_role": {"name": "inferfleet.fleet.inference_engine",
                                                    "tasks_from": "preflight"}}],
    }]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    return subprocess.run(
        [shutil.which("ansible-playbook") or str(ROOT / ".venv/bin/ansible-playbook"),
         "-i", "localhost,", str(tmp_path / "play.yml")],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )


def test_sound_group_settings_pass(tmp_path):
    done = preflight(tmp_path, {"inferfleet_accelerator": "nvidia",
                                "inference_engine_nccl_env": {"NCCL_IB_HCA": "mlx5_0"},
                                "inference_engine_group_backend": "ray",
                                "inference_engine_ray_token": "t0ken"})
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("settings, message", [
    ({"inference_engine_nccl_env": {"IB_HCA": "mlx5_0"}},
     "inference_engine_nccl_env holds IB_HCA: only NCCL_* variables belong there"),
    ({"inference_engine_group_backend": "mpi"},
     "inference_engine_group_backend must be native or ray"),
    ({"inference_engine_group_backend": "ray", "inference_engine_runtime": "container",
      "inference_engine_ray_token": "t0ken"},
     "inference_engine_group_backend ray needs inference_engine_runtime venv"),
    ({"inference_engine_group_backend": "ray", "inference_engine_ray_token": "t0ken"},
     "inference_engine_group_backend ray needs GPUs: the CPU build of vLLM has no Ray executor"),
    ({"inference_engine_group_backend": "ray"},
     "Ray 2.60.0 supports token authentication: set inference_engine_ray_token"),
    ({"inference_engine_group_backend": "ray", "inference_engine_ray_version": "2.40.0",
      "inference_engine_ray_token": "t0ken"},
     "inference_engine_ray_token needs Ray 2.52 or later (inference_engine_ray_version is 2.40.0)"),
    ({"inference_engine_master_port": 8000},
     "inference_engine_master_port must be a TCP port other than inference_engine_port"),
    ({"inference_engine_group_rendezvous_timeout": 10},
     "inference_engine_group_rendezvous_timeout must be at least 60 seconds"),
    ({"inference_engine_extra_secret_env": {"HF_TOKEN": "hf_t0ken\nsecond line"}},
     "inference_engine_extra_secret_env values must be single lines"),
])
def test_bad_group_settings_are_refused_naming_the_variable(tmp_path, settings, message):
    done = preflight(tmp_path, settings)
    out = " ".join((done.stdout + done.stderr).split())
    assert done.returncode != 0
    assert message in out
    assert "t0ken" not in out  # the Ray token and the secret environment are never printed


@pytest.mark.parametrize("settings, message", [
    ({"inference_engine_pipeline_parallel_size": 2},
     "inference_engine_runtime sim simulates single-node instances: "
     "set inference_engine_pipeline_parallel_size to 1"),
    ({"inference_engine_sim_profile": "h100-llama"},
     "inference_engine_sim_profile h100-llama is not a shipped profile (h100-sxm-llama-3.1-8b, "
     "h100-sxm-qwen2.5-72b, l4-qwen2.5-0.5b): name one of them"),
    ({}, None),
    ({"inference_engine_sim_profile": "/srv/profiles/mine.json"}, None),
])
def test_sim_runtime_settings(tmp_path, settings, message):
    done = preflight(tmp_path, {"inference_engine_runtime": "sim", **settings})
    out = " ".join((done.stdout + done.stderr).split())
    if message is None:
        assert done.returncode == 0, out
    else:
        assert done.returncode != 0
        assert message in out
