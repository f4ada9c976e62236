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


def link(to="gpu-b", gbit=9.4, rtt_ms=0.08, error=""):
    return {"to": to, "address": "10.0.0.2", "gbit": gbit, "rtt_ms": rtt_ms, "error": error}


def test_a_link_short_of_the_pipelines_need_names_both_figures():
    pair = [member("gpu-a", 0, link=link(gbit=9.4, rtt_ms=0.8)), member("gpu-b", 1)]
    assert problems(pair, min_bandwidth_gbit=5, max_rtt_ms=1.0) == []
    assert problems(pair, min_bandwidth_gbit=25, max_rtt_ms=0.5) == [
        "link gpu-a -> gpu-b (10.0.0.2): bandwidth 9.4 Gbit/s, the pipeline needs 25 Gbit/s "
        "(fabric_preflight_min_bandwidth_gbit)",
        "link gpu-a -> gpu-b (10.0.0.2): round trip 0.8 ms, the pipeline tolerates 0.5 ms "
        "(fabric_preflight_max_rtt_ms)",
    ]


def test_links_are_only_measured_without_a_bound():
    pair = [member("gpu-a", 0, link=link(gbit=0.001, rtt_ms=900)), member("gpu-b", 1)]
    assert problems(pair, min_bandwidth_gbit=0, max_rtt_ms=0) == []
    lines = fp.fabric_report(pair, "llama70b")
    assert lines[1].endswith("link to gpu-b: 0.001 Gbit/s, round trip 900 ms")
    assert "link to" not in lines[2]  # the last member has no next one


def test_a_link_that_could_not_be_measured_says_why():
    broken = link(gbit=None, rtt_ms=None, error="unable to connect to server: Connection refused")
    found = problems([member("gpu-a", 0, link=broken), member("gpu-b", 1)])
    assert found == [
        "link gpu-a -> gpu-b (10.0.0.2): bandwidth not measured: unable to connect to server: "
        "Connection refused",
        "link gpu-a -> gpu-b (10.0.0.2): round trip not measured (ping had no answer)",
    ]
