"""The fabric preflight's verdict (plugins/filter/fabric_preflight.py): each problem of a
multi-node instance is found and names the failing node or link."""

from __future__ import annotations

import pytest
from ansible_collections.inferfleet.fleet.plugins.filter import fabric_preflight as fp

GIB = 1024**3
SETTINGS = {
    "mtu": None,
    "require_clock_sync": True,
    "max_skew": 2.0,
    "shm_min_mib": 1024,
    "accelerator": "nvidia",
}


def member(host, rank, **over):
    base = {
        "host": host,
        "rank": rank,
        "interface": "ens1f0",
        "interface_found": True,
        "address": f"10.0.0.{rank + 1}",
        "mtu": 9000,
        "shm_bytes": 64 * GIB,
        "clock_synchronized": True,
        "clock_source": "chrony",
        "time": 1000.0 + rank * 0.1,
        "driver_version": "570.133.20",
        "cuda_version": "12.8",
        "gpu_count": 8,
        "engine_version": "0.32.0",
        "ports": [{"to": "x", "address": "10.0.0.9", "port": 29500, "ok": True, "msg": ""}],
    }
    base.update(over)
    return base


def problems(members, **settings):
    return fp.fabric_problems(members, {**SETTINGS, **settings})


def test_a_healthy_pair_has_no_problem():
    assert problems([member("gpu-a", 0), member("gpu-b", 1)]) == []


def test_a_single_node_is_never_judged():
    assert problems([member("gpu-a", 0, mtu=1500, shm_bytes=0)]) == []


def test_mtu_mismatch_lists_every_member():
    found = problems([member("gpu-a", 0), member("gpu-b", 1, mtu=1500)])
    assert found == [
        "MTU differs across the instance: gpu-a 9000, gpu-b 1500 (on ens1f0); make it the same"
    ]


def test_required_mtu_names_the_node():
    found = problems([member("gpu-a", 0), member("gpu-b", 1, mtu=1500)], mtu=9000)
    assert found == ["gpu-b: MTU of ens1f0 is 1500, not 9000"]


def test_unreachable_port_names_the_link():
    bad = {
        "to": "gpu-b",
        "address": "10.0.0.2",
        "port": 29500,
        "ok": False,
        "msg": "Timeout when waiting for 10.0.0.2:29500",
    }
    found = problems([member("gpu-a", 0, ports=[bad]), member("gpu-b", 1)])
    assert found == [
        "link gpu-a -> gpu-b (10.0.0.2:29500): cannot connect: "
        "Timeout when waiting for 10.0.0.2:29500"
    ]


def test_clock_not_synchronised_and_skew():
    found = problems(
        [
            member("gpu-a", 0),
            member("gpu-b", 1, clock_synchronized=False, clock_source="timedatectl", time=1010.0),
        ]
    )
    assert "gpu-b: clock not synchronised (timedatectl)" in found
    assert "clocks differ by 10.0 s between gpu-a and gpu-b (at most 2.0 s)" in found
    unknown = problems(
        [member("gpu-a", 0), member("gpu-b", 1, clock_synchronized=None, clock_source=None)]
    )
    assert unknown == ["gpu-b: clock unknown (no chrony, no timedatectl)"]
    assert (
        problems(
            [member("gpu-a", 0), member("gpu-b", 1, clock_synchronized=False)],
            require_clock_sync=False,
        )
        == []
    )


def test_small_shm_names_the_node():
    found = problems([member("gpu-a", 0), member("gpu-b", 1, shm_bytes=64 * 1024 * 1024)])
    assert found == ["gpu-b: /dev/shm is 64 MiB, below 1024 MiB"]


@pytest.mark.parametrize(
    "key, value, message",
    [
        (
            "driver_version",
            "570.124.06",
            "driver versions differ: gpu-a 570.133.20, gpu-b 570.124.06",
        ),
        ("cuda_version", "12.4", "CUDA versions differ: gpu-a 12.8, gpu-b 12.4"),
        ("gpu_count", 4, "GPU counts differ: gpu-a 8, gpu-b 4"),
        ("engine_version", "0.31.0", "engine versions differ: gpu-a 0.32.0, gpu-b 0.31.0"),
    ],
)
def test_versions_must_match(key, value, message):
    assert problems([member("gpu-a", 0), member("gpu-b", 1, **{key: value})]) == [message]


def test_cpu_groups_compare_only_the_engine():
    pair = [member("cpu-a", 0, driver_version=None), member("cpu-b", 1, driver_version="x")]
    assert problems(pair, accelerator="cpu") == []


def test_missing_interface_and_missing_member():
    found = problems(
        [
            member("gpu-a", 0, interface="ib0", interface_found=False, mtu=None),
            {"host": "gpu-b", "missing": True},
            member("gpu-c", 2),
        ]
    )
    assert found[0].startswith("gpu-b: reported nothing")
    assert "gpu-a: interface ib0 not found" in found[1]
    assert any(p.startswith("MTU differs") for p in found)


def test_report_lines():
    lines = fp.fabric_report([member("gpu-a", 0), {"host": "gpu-b", "missing": True}], "llama70b")
    assert lines[0] == "instance llama70b:"
    assert lines[1].startswith("  rank 0 gpu-a: ens1f0 10.0.0.1 mtu 9000, shm 65536 MiB")
    assert "driver 570.133.20 CUDA 12.8 8 GPU(s)" in lines[1]
    assert lines[2] == "  gpu-b: no report"
