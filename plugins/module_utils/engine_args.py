"""The inference engine's command line, environment and container flags, as pure data.

The inference_engine role renders its systemd unit from these (through the filters in
plugins/filter/engine_args.py), so what runs on a node is exactly what the unit tests
check. Both runtimes start the same program, `vllm serve MODEL ARGS`: from the node's
virtualenv, or as the entrypoint of a container.

Settings are the role's variables without the `inference_engine_` prefix. A setting
that is None (or "") is left to vLLM's own default and not rendered.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

ACCELERATORS = ("nvidia", "cpu")

# Flags each owned by one role variable: given in extra_args they are refused, so a
# value is never set twice (and the unit never disagrees with the inventory).
MANAGED_FLAGS = {
    "--model": "inference_engine_model_path",
    "--served-model-name": "inference_engine_served_model_name",
    "--host": "inference_engine_host",
    "--port": "inference_engine_port",
    "--tensor-parallel-size": "inference_engine_tensor_parallel_size",
    "-tp": "inference_engine_tensor_parallel_size",
    "--pipeline-parallel-size": "inference_engine_pipeline_parallel_size",
    "-pp": "inference_engine_pipeline_parallel_size",
    "--max-model-len": "inference_engine_max_model_len",
    "--gpu-memory-utilization": "inference_engine_gpu_memory_utilization",
    "--device-memory-utilization": "inference_engine_gpu_memory_utilization",
    "--max-num-seqs": "inference_engine_max_num_seqs",
    "--dtype": "inference_engine_dtype",
    "--quantization": "inference_engine_quantization",
    "-q": "inference_engine_quantization",
    "--kv-cache-dtype": "inference_engine_kv_cache_dtype",
    "--enable-prefix-caching": "inference_engine_enable_prefix_caching",
    "--no-enable-prefix-caching": "inference_engine_enable_prefix_caching",
    "--shutdown-timeout": "inference_engine_shutdown_timeout",
    "--api-key": "inference_engine_api_key",
    # A multi-node instance's flags come from the inventory (inferfleet_instance).
    "--nnodes": "inferfleet_instance",
    "--node-rank": "inferfleet_rank",
    "--master-addr": "inference_engine_group_address (of rank 0)",
    "--master-port": "inference_engine_master_port",
    "--headless": "inferfleet_rank",
    "--distributed-executor-backend": "inference_engine_group_backend",
}

GROUP_BACKENDS = ("native", "ray")

# Settings that only mean something on GPUs: not rendered under accelerator cpu.
GPU_ONLY = ("gpu_memory_utilization",)


def _set(value: Any) -> bool:
    return value is not None and value != ""


def serve_args(s: Mapping[str, Any]) -> list[str]:
    """Arguments that follow `vllm serve`: the model path, then flags in a fixed order."""
    accelerator = s.get("accelerator", "nvidia")
    if accelerator not in ACCELERATORS:
        raise ValueError(f"accelerator must be one of {ACCELERATORS}, not {accelerator!r}")
    args = [str(s["model_path"])]

    def flag(name: str, key: str) -> None:
        value = s.get(key)
        if _set(value) and not (accelerator == "cpu" and key in GPU_ONLY):
            args.extend([name, str(value)])

    flag("--served-model-name", "served_model_name")
    flag("--host", "host")
    flag("--port", "port")
    flag("--tensor-parallel-size", "tensor_parallel_size")
    flag("--pipeline-parallel-size", "pipeline_parallel_size")
    flag("--max-model-len", "max_model_len")
    flag("--gpu-memory-utilization", "gpu_memory_utilization")
    flag("--max-num-seqs", "max_num_seqs")
    flag("--dtype", "dtype")
    flag("--quantization", "quantization")
    flag("--kv-cache-dtype", "kv_cache_dtype")
    prefix = s.get("enable_prefix_caching")
    if prefix is not None and prefix != "":
        args.append("--enable-prefix-caching" if _truthy(prefix) else "--no-enable-prefix-caching")
    flag("--shutdown-timeout", "shutdown_timeout")
    extra = [str(a) for a in s.get("extra_args") or []]
    if _truthy(s.get("scale_out")) and "--enable-scale-out" not in extra:
        # vLLM's render endpoints, which a cache_aware router reads token ids from
        # (keyed like /v1 when the engine has an API key)
        args.append("--enable-scale-out")
    args.extend(group_args(s.get("group")))
    args.extend(extra)
    return args


def _group(g: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A multi-node instance's settings, checked; None for a single-node instance.

    Keys: backend (native or ray), size (nodes), rank, master_addr (rank 0's address on
    the group network), master_port, address and interface (this node's), nccl_env,
    ray_port.
    """
    if not g or int(g.get("size") or 1) <= 1:
        return None
    backend = g.get("backend") or "native"
    if backend not in GROUP_BACKENDS:
        raise ValueError(f"group backend must be one of {GROUP_BACKENDS}, not {backend!r}")
    size, rank = int(g["size"]), int(g["rank"])
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} is outside the group of {size} nodes")
    if not _set(g.get("master_addr")):
        raise ValueError("a multi-node instance needs rank 0's address (master_addr)")
    if backend == "native" and not _set(g.get("master_port")):
        raise ValueError("a multi-node instance needs the master port (master_port)")
    return {**g, "backend": backend, "size": size, "rank": rank}


def group_args(g: Mapping[str, Any] | None) -> list[str]:
    """`vllm serve` flags that make one node part of a multi-node instance.

    native: vLLM's own multi-node runtime (torch.distributed over the master port);
    every rank runs `vllm serve`, ranks > 0 headless. ray: rank 0 alone runs `vllm serve`
    on the Ray cluster its members form (see ray_start_args).
    """
    group = _group(g)
    if group is None:
        return []
    if group["backend"] == "ray":
        if group["rank"] > 0:
            raise ValueError("under the ray backend only rank 0 runs vllm serve")
        return ["--distributed-executor-backend", "ray"]
    args = ["--nnodes", str(group["size"]), "--node-rank", str(group["rank"]),
            "--master-addr", str(group["master_addr"]), "--master-port", str(group["master_port"])]
    if group["rank"] > 0:
        args.append("--headless")
    return args


def group_environment(g: Mapping[str, Any] | None) -> dict[str, str]:
    """The group network for torch.distributed, NCCL, Gloo (and Ray): this node's own
    address and interface, so none of them guesses (a wrong guess is the classic hang)."""
    group = _group(g)
    if group is None:
        return {}
    env = {}
    if _set(group.get("address")):
        env["VLLM_HOST_IP"] = str(group["address"])
    if _set(group.get("interface")):
        env["NCCL_SOCKET_IFNAME"] = str(group["interface"])
        env["GLOO_SOCKET_IFNAME"] = str(group["interface"])
    for key, value in (group.get("nccl_env") or {}).items():
        if not str(key).startswith("NCCL_"):
            raise ValueError(f"nccl_env holds {key}: only NCCL_* variables belong there")
        env[str(key)] = str(value)
    if group["backend"] == "ray":
        env["RAY_ADDRESS"] = f"{group['master_addr']}:{group['ray_port']}"
        if _truthy(group.get("ray_auth")):
            env["RAY_AUTH_MODE"] = "token"  # the token itself is in the secret file
    return env


def ray_start_args(r: Mapping[str, Any]) -> list[str]:
    """`ray start` arguments for one member of a Ray-backed instance: the head on rank 0,
    a worker joining it elsewhere. Every port is explicit (the firewall opens exactly
    these, between members only) and the dashboard binds the node's group address.

    Keys: rank, address (this node's), master_addr (the head's), port, dashboard_port,
    client_port, node_manager_port, object_manager_port, agent_port, agent_listen_port,
    metrics_port,
    runtime_env_agent_port, min_worker_port, max_worker_port, num_gpus (None on CPU).
    """
    args = ["start", "--block", "--disable-usage-stats", "--node-ip-address", str(r["address"])]
    if int(r["rank"]) == 0:
        args += ["--head", "--port", str(r["port"]), "--dashboard-host", str(r["address"]),
                 "--dashboard-port", str(r["dashboard_port"]),
                 "--ray-client-server-port", str(r["client_port"])]
    else:
        args += ["--address", f"{r['master_addr']}:{r['port']}"]
    args += ["--node-manager-port", str(r["node_manager_port"]),
             "--object-manager-port", str(r["object_manager_port"]),
             "--dashboard-agent-grpc-port", str(r["agent_port"]),
             "--dashboard-agent-listen-port", str(r["agent_listen_port"]),
             "--metrics-export-port", str(r["metrics_port"]),
             "--runtime-env-agent-port", str(r["runtime_env_agent_port"]),
             "--min-worker-port", str(r["min_worker_port"]),
             "--max-worker-port", str(r["max_worker_port"])]
    if _set(r.get("num_gpus")):
        args += ["--num-gpus", str(r["num_gpus"])]
    return args


def ray_ports(r: Mapping[str, Any]) -> list[str]:
    """The ports a Ray-backed instance's members open to each other (for the firewall)."""
    keys = ("port", "dashboard_port", "client_port", "node_manager_port", "object_manager_port",
            "agent_port", "agent_listen_port", "metrics_port", "runtime_env_agent_port")
    return [str(r[k]) for k in keys] + [f"{r['min_worker_port']}-{r['max_worker_port']}"]


def _truthy(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def managed_flag_conflicts(extra_args: Iterable[str]) -> list[str]:
    """Messages for extra arguments that a role variable owns (empty when none)."""
    out = []
    for arg in extra_args or []:
        name = str(arg).split("=", 1)[0]
        if name in MANAGED_FLAGS:
            var = MANAGED_FLAGS[name]
            out.append(f"inference_engine_extra_args sets {name}: use {var} instead")
    return out


def environment(s: Mapping[str, Any]) -> dict[str, str]:
    """The engine's environment, secrets excepted: fixed values, CPU-only settings, extras."""
    env = {
        "HF_HUB_OFFLINE": "1",  # the weights are local; never reach for a hub
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }
    if s.get("accelerator") == "cpu":
        if _set(s.get("cpu_kvcache_space")):
            env["VLLM_CPU_KVCACHE_SPACE"] = str(s["cpu_kvcache_space"])
        if _set(s.get("cpu_omp_threads_bind")):
            env["VLLM_CPU_OMP_THREADS_BIND"] = str(s["cpu_omp_threads_bind"])
    if _set(s.get("model_revision")):
        # Not read by vLLM: it makes the environment file change with the model version,
        # which is what restarts the engine when `current` points elsewhere.
        env["INFERFLEET_MODEL_REVISION"] = str(s["model_revision"])
    env.update(group_environment(s.get("group")))
    for key, value in (s.get("extra_env") or {}).items():
        env[str(key)] = str(value)
    return env


def secret_environment(s: Mapping[str, Any]) -> dict[str, str]:
    """The secret part of the environment: the API key (vLLM reads VLLM_API_KEY) and
    extra secret variables. Written to its own file, mode 0600, never on the command line."""
    env = {str(k): str(v) for k, v in (s.get("extra_secret_env") or {}).items()}
    if _set(s.get("api_key")):
        env["VLLM_API_KEY"] = str(s["api_key"])
    if _set(s.get("ray_token")):
        env["RAY_AUTH_TOKEN"] = str(s["ray_token"])
    return env


def env_file(env: Mapping[str, str], fmt: str = "systemd") -> str:
    """The text of an environment file: systemd's EnvironmentFile= or docker's --env-file.

    systemd unquotes double-quoted values; docker takes everything after `=` literally,
    so its values are written raw. Newlines cannot be represented in either: refused.
    """
    lines = []
    for key, value in env.items():
        value = str(value)
        if "\n" in value or "\n" in key or not key:
            raise ValueError(f"environment variable {key!r}: names and values must be one line")
        if fmt == "docker":
            lines.append(f"{key}={value}")
        elif fmt == "systemd":
            escaped = value.replace("\\", "\\\\").replace('"', '\\"')
            escaped = escaped.replace("$", "\\$").replace("`", "\\`")
            lines.append(f'{key}="{escaped}"')
        else:
            raise ValueError(f"fmt must be systemd or docker, not {fmt!r}")
    return "\n".join(lines) + "\n"


def container_flags(c: Mapping[str, Any]) -> list[str]:
    """`docker run` flags (before the image) for the container runtime.

    Keys: name, accelerator, gpus, ipc, shm_size, memory_limit, cpu_limit, nofile_limit,
    env_file, secret_env_file, mounts (list of host paths mounted read-only at the same path).
    """
    flags = ["--rm", "--name", str(c["name"]), "--network", "host", "--init"]
    if c.get("accelerator", "nvidia") == "nvidia":
        flags += ["--gpus", str(c.get("gpus") or "all")]
    ipc = c.get("ipc") or "host"
    flags.append(f"--ipc={ipc}")
    if _set(c.get("shm_size")):
        if ipc == "host":
            raise ValueError("shm_size needs an ipc mode other than host "
                             "(host IPC uses the host's /dev/shm)")
        flags += ["--shm-size", str(c["shm_size"])]
    if _set(c.get("memory_limit")):
        flags += ["--memory", str(c["memory_limit"])]
    if _set(c.get("cpu_limit")):
        flags += ["--cpus", str(c["cpu_limit"])]
    if _set(c.get("nofile_limit")):
        flags += ["--ulimit", f"nofile={c['nofile_limit']}:{c['nofile_limit']}"]
    if _set(c.get("env_file")):
        flags += ["--env-file", str(c["env_file"])]
    if _set(c.get("secret_env_file")):
        flags += ["--env-file", str(c["secret_env_file"])]
    for path in c.get("mounts") or []:
        flags += ["--volume", f"{path}:{path}:ro"]
    flags += ["--log-driver", "none", "--entrypoint", "vllm"]
    return flags


def systemd_quote(args: Iterable[Any]) -> str:
    """Join arguments for an ExecStart= line: each word quoted where systemd needs it.

    systemd splits on whitespace, honours double quotes with C-style escapes, and
    expands `%` specifiers and `$VAR`: those are escaped so every word arrives verbatim.
    """
    words = []
    for arg in args:
        word = str(arg)
        if "\n" in word:
            raise ValueError(f"argument {word!r}: newlines cannot be passed on ExecStart=")
        word = word.replace("%", "%%").replace("$", "$$")
        if word == "" or any(ch in word for ch in " \t\"'\\;"):
            word = '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'
        words.append(word)
    return " ".join(words)


# Filters by the names the role's templates use (plugins/filter/engine_args.py wraps them).
FILTERS = {
    "vllm_serve_args": serve_args,
    "vllm_container_flags": container_flags,
    "vllm_environment": environment,
    "vllm_secret_environment": secret_environment,
    "vllm_env_file": env_file,
    "vllm_managed_flag_conflicts": managed_flag_conflicts,
    "systemd_quote": systemd_quote,
    "ray_start_args": ray_start_args,
}
