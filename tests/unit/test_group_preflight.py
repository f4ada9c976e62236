"""A multi-node instance's preflight (module_utils.group), the watchdog's reading of the
kernel's TCP tables and the route parsing (roles/inference_engine/files): every mismatch
names the node and both values."""

import importlib.util
from pathlib import Path

import pytest
from ansible_collections.inferfleet.fleet.plugins.module_utils.group import (
    group_problems,
    layer_split,
)

FILES = Path(__file__).parents[2] / "roles/inference_engine/files"


def _load(name):
    spec = importlib.util.spec_from_file_location(name, FILES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


watchdog = _load("group_watchdog")
route = _load("group_route")


def member(host, rank, **changes):
    """A member of a 2 x 8 GPU instance (TP 8, PP 2) of an 80-layer model."""
    base = {
        "host": host, "rank": rank, "engine_version": "0.32.0", "runtime": "venv",
        "manifest_digest": "sha256:" + "ab" * 32, "tensor_parallel_size": 8,
        "pipeline_parallel_size": 2, "backend": "native", "master_port": 29500,
        "max_model_len": 8192, "dtype": "auto", "quantization": None, "kv_cache_dtype": "auto",
        "layer_partition": "", "extra_args": [], "gpus": 8, "gpu_count": 8, "layers": 80,
    }
    return {**base, **changes}


def test_a_sound_group_has_no_problem():
    assert group_problems("big", [member("gpu-a", 0), member("gpu-b", 1)]) == []
    # single-node instances are not groups
    assert group_problems("one", [member("gpu-a", 0, pipeline_parallel_size=1)]) == []


@pytest.mark.parametrize("key, value, words", [
    ("engine_version", "0.31.0", "engine version"),
    ("manifest_digest", "sha256:" + "cd" * 32, "model manifest digest"),
    ("tensor_parallel_size", 4, "tensor parallel size"),
    ("pipeline_parallel_size", 4, "pipeline parallel size"),
    ("backend", "ray", "group backend"),
    ("master_port", 29501, "master port"),
    ("max_model_len", 4096, "max model length"),
    ("dtype", "float16", "dtype"),
    ("quantization", "fp8", "quantization"),
    ("runtime", "container", "engine runtime"),
    ("extra_args", ["--enforce-eager"], "extra engine arguments"),
])
def test_each_mismatch_names_the_node_and_both_values(key, value, words):
    ranks = [member("gpu-a", 0), member("gpu-b", 1), member("gpu-c", 2, **{key: value})]
    for m in ranks:
        m["pipeline_parallel_size"] = 3 if key != "pipeline_parallel_size" else m[
            "pipeline_parallel_size"]
    problems = group_problems("big", ranks)
    assert problems == [f"instance big: gpu-c has {words} {value!r}, rank 0 (gpu-a) has "
                        f"{ranks[0][key]!r}"]


def test_rank_order_decides_the_reference_not_list_order():
    problems = group_problems("big", [member("gpu-b", 1, engine_version="0.31.0"),
                                      member("gpu-a", 0)])
    assert problems == ["instance big: gpu-b has engine version '0.31.0', rank 0 (gpu-a) has "
                        "'0.32.0'"]


def test_pp_times_tp_must_equal_the_devices_used():
    problems = group_problems("big", [member(h, r, pipeline_parallel_size=1)
                                      for r, h in enumerate(["gpu-a", "gpu-b"])])
    assert problems == [
        "instance big: pipeline parallel size 1 x tensor parallel size 8 = 8, but its 2 nodes use"
        " 16 devices (gpu-a 8, gpu-b 8): set inference_engine_pipeline_parallel_size to 2 and"
        " inference_engine_tensor_parallel_size to the devices per node",
        "instance big: pipeline parallel size 1 does not split over its 2 nodes: make it a "
        "multiple of 2",
    ]


def test_a_member_cannot_use_more_gpus_than_it_has():
    problems = group_problems("big", [member("gpu-a", 0), member("gpu-b", 1, gpu_count=4)])
    assert problems == ["instance big: gpu-b would use 8 GPUs but has 4"]


def test_cpu_members_count_one_device_each():
    cpu = {"tensor_parallel_size": 1, "gpus": 1, "gpu_count": None, "layers": 4}
    assert group_problems("pp", [member("n1", 0, **cpu), member("n2", 1, **cpu)]) == []


def test_layers_must_split_over_the_stages():
    few = [member("n1", 0, layers=1), member("n2", 1, layers=1)]
    assert group_problems("pp", few) == [
        "instance pp: the model has 1 layers, fewer than the pipeline parallel size 2: every "
        "stage needs at least one; lower inference_engine_pipeline_parallel_size"]
    # vLLM splits an odd count unevenly by itself: 81 layers over 2 stages is fine
    assert group_problems("pp", [member("n1", 0, layers=81), member("n2", 1, layers=81)]) == []


def test_a_layer_partition_must_match_the_stages_and_the_layers():
    assert layer_split(80, 2, "40,40") == []
    assert layer_split(80, 2, "50,30") == []
    assert layer_split(80, 2, "40,30") == [
        "VLLM_PP_LAYER_PARTITION '40,30' must give every stage at least one layer and sum to "
        "the model's 80 layers (sums to 70)"]
    assert layer_split(80, 2, "20,20,40") == [
        "VLLM_PP_LAYER_PARTITION '20,20,40' names 3 stages, the pipeline parallel size is 2"]
    assert layer_split(80, 2, "a,b") == [
        "VLLM_PP_LAYER_PARTITION 'a,b' must be comma-separated layer counts"]
    group = [member("n1", 0, layer_partition="40,30"), member("n2", 1, layer_partition="40,30")]
    assert group_problems("pp", group) == [
        "instance pp: VLLM_PP_LAYER_PARTITION '40,30' must give every stage at least one layer "
        "and sum to the model's 80 layers (sums to 70)"]


# /proc/net/tcp and tcp6 as the kernel prints them (addresses in little-endian words):
# 172.18.0.2:29500 <- 172.18.0.3:41234 established, a listener, and a TIME_WAIT one.
TCP = """  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid
   0: 00000000:733C 00000000:0000 0A 00000000:00000000 00:00000000 00000000   998
   1: 020012AC:733C 030012AC:A112 01 00000000:00000000 00:00000000 00000000   998
   2: 020012AC:733C 040012AC:A113 06 00000000:00000000 00:00000000 00000000   998
"""
# ::ffff:172.18.0.4:29500 <- ::ffff:172.18.0.3:50000 (an IPv4-mapped IPv6 socket)
TCP6 = """  sl  local_address                         remote_address                        st
   0: 0000000000000000FFFF0000040012AC:733C 0000000000000000FFFF0000030012AC:C350 01 0
"""


def test_the_watchdog_reads_established_connections_from_the_kernel_tables():
    assert watchdog.connections([TCP, TCP6]) == {
        ("172.18.0.2", 29500, "172.18.0.3", 41234),
        ("172.18.0.4", 29500, "172.18.0.3", 50000),
    }


def test_the_watchdog_picks_the_group_links_of_each_rank():
    conns = {
        ("172.18.0.2", 29500, "172.18.0.3", 41234),  # rank 1 -> rank 0's store
        ("172.18.0.2", 29500, "172.18.0.2", 40000),  # rank 0's own worker
        ("172.18.0.2", 8000, "172.18.0.9", 1234),  # a client of the API
    }
    rank0 = watchdog.group_links(conns, 0, "172.18.0.2", 29500, ["172.18.0.3"])
    assert rank0 == {("172.18.0.2", 29500, "172.18.0.3", 41234)}
    assert watchdog.missing_peers(rank0, ["172.18.0.3", "172.18.0.4"]) == ["172.18.0.4"]
    rank1_view = {("172.18.0.3", 41234, "172.18.0.2", 29500), ("172.18.0.3", 5, "1.1.1.1", 80)}
    assert watchdog.group_links(rank1_view, 1, "172.18.0.2", 29500, []) == {
        ("172.18.0.3", 41234, "172.18.0.2", 29500)}


def test_the_route_names_the_interface_and_source_address():
    line = "172.18.0.2 dev eth0 src 172.18.0.3 uid 0 \\    cache "
    assert route.parse_route(line) == {"interface": "eth0", "address": "172.18.0.3"}
    assert route.parse_route("local 172.18.0.3 dev lo table local src 172.18.0.3") == {
        "interface": "lo", "address": "172.18.0.3"}
