"""gpu_facts: its parsers on written nvidia-smi samples (tests/fixtures/nvidia-smi), the
collection over a fake node (a fake sysfs/procfs tree and a fake nvidia-smi), and the
module itself run once through Ansible."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.inferfleet.fleet.plugins.module_utils import gpu as g

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "nvidia-smi"
FAKE_SMI = REPO / "molecule" / "gpu_host" / "files" / "fake-nvidia-smi"




def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


# --- parsers ----------------------------------------------------------------------------


def test_query_csv_h100():
    rows = g.parse_query_csv(fixture("h100x8.query.csv"))
    assert len(rows) == 8
    assert rows[0]["memory.total"] == "81559"  # the header's "[MiB]" is dropped from the key
    assert rows[7]["pci.bus_id"] == "00000000:DB:00.0"
    assert rows[0]["name"] == "NVIDIA H100 80GB HBM3"


def test_query_csv_refuses_output_without_header():
    with pytest.raises(g.GpuFactsError, match="no CSV header"):
        g.parse_query_csv("0, GPU-x, NVIDIA L40S\n")


def test_query_csv_refuses_ragged_rows():
    with pytest.raises(g.GpuFactsError, match="3 values for 2 fields"):
        g.parse_query_csv("index, name\n0, a, b\n")


def test_empty_query_is_no_gpus():
    assert g.parse_query_csv("\n") == []


@pytest.mark.parametrize(
    "raw, mib", [("81559", 81559), ("46068 MiB", 46068), ("[N/A]", None), ("", None)]
)
def test_memory(raw, mib):
    assert g.parse_memory_mib(raw) == mib


def test_cuda_version_from_q_and_banner():
    assert g.parse_cuda_version(fixture("h100x8.q-compute.txt")) == "12.8"
    assert g.parse_cuda_version(fixture("l40sx2.q-compute.txt")) == "12.4"
    banner = "| NVIDIA-SMI 570.133.20   Driver Version: 570.133.20   CUDA Version: 12.8  |"
    assert g.parse_cuda_version(banner) == "12.8"
    assert g.parse_cuda_version("nothing here") is None


def test_topology_h100_nvswitch_all_pairs():
    matrix = g.parse_topology(fixture("h100x8.topo.txt"))
    assert sorted(matrix) == [f"GPU{i}" for i in range(8)]
    assert matrix["GPU0"]["GPU7"] == "NV18"
    assert "NIC0" not in matrix["GPU0"] and "GPU0" not in matrix["GPU0"]
    assert g.topology_summary(matrix) == {
        "nvlink": True,
        "nvlink_all_pairs": True,
        "nvlink_links_max": 18,
    }


def test_topology_l40s_pcie_only():
    matrix = g.parse_topology(fixture("l40sx2.topo.txt"))
    assert matrix == {"GPU0": {"GPU1": "SYS"}, "GPU1": {"GPU0": "SYS"}}
    assert g.topology_summary(matrix)["nvlink"] is False


def test_topology_ignores_terminal_escapes():
    text = "\x1b[4m\tGPU0\tGPU1\tCPU Affinity\x1b[0m\nGPU0\t X \tNV4\t0-7\nGPU1\tNV4\t X \t0-7\n"
    assert g.parse_topology(text) == {"GPU0": {"GPU1": "NV4"}, "GPU1": {"GPU0": "NV4"}}


@pytest.mark.parametrize(
    "name, version, flavour",
    [
        ("proc-driver-version-open.txt", "570.133.20", "open"),
        ("proc-driver-version-proprietary.txt", "550.144.03", "proprietary"),
    ],
)
def test_driver_version_file(name, version, flavour):
    assert g.parse_driver_version_file(fixture(name)) == {
        "version": version,
        "kernel_module": flavour,
    }
    assert g.driver_branch(version) == version.split(".")[0]


def test_build_and_summarize_h100():
    gpus = g.build_gpus(
        g.parse_query_csv(fixture("h100x8.query.csv")),
        g.parse_query_csv(fixture("h100x8.health.csv")),
    )
    summary = g.summarize(gpus, "12.8", g.parse_topology(fixture("h100x8.topo.txt")))
    assert summary["count"] == 8
    assert summary["model"] == "NVIDIA H100 80GB HBM3"
    assert summary["memory_mib"] == 81559 and summary["memory_mib_total"] == 8 * 81559
    assert summary["driver_version"] == "570.133.20"
    assert summary["mig_enabled"] is False
    assert summary["healthy"] is True and summary["problems"] == []
    assert gpus[2]["temperature_c"] == 33 and gpus[0]["compute_cap"] == "9.0"


def test_health_findings_name_the_gpu():
    gpus = g.build_gpus(
        g.parse_query_csv(fixture("h100x8.query.csv")),
        g.parse_query_csv(fixture("h100x8-faulty.health.csv")),
    )
    summary = g.summarize(gpus, "12.8", {})
    assert summary["healthy"] is False
    assert [gpu["index"] for gpu in gpus if not gpu["healthy"]] == [3, 5, 6]
    problems = "\n".join(summary["problems"])
    assert "GPU3 (00000000:5D:00.0): 2 uncorrectable ECC error(s)" in problems
    assert "GPU5 (00000000:AB:00.0): a row remapping is pending" in problems
    assert "GPU6 (00000000:BA:00.0): nvidia-smi reports it lost or in need of a reset" in problems


def test_l40s_and_mig():
    l40s = g.build_gpus(g.parse_query_csv(fixture("l40sx2.query.csv")), None)
    summary = g.summarize(l40s, "12.4", g.parse_topology(fixture("l40sx2.topo.txt")))
    assert (summary["count"], summary["memory_mib"], summary["mig_enabled"]) == (2, 46068, False)
    assert l40s[0]["mig_mode"] is None  # [N/A]: the L40S has no MIG
    assert l40s[0]["health_read"] is False and summary["healthy"] is True
    a100 = g.build_gpus(g.parse_query_csv(fixture("a100x8-mig.query.csv")), None)
    assert g.summarize(a100, None, {})["mig_enabled"] is True


def test_mixed_models():
    rows = g.parse_query_csv(fixture("l40sx2.query.csv"))
    rows[1]["name"] = "NVIDIA L4"
    rows[1]["memory.total"] = "23034"
    summary = g.summarize(g.build_gpus(rows, None), None, {})
    assert summary["model"] == "mixed" and summary["models"] == ["NVIDIA L4", "NVIDIA L40S"]
    assert summary["memory_mib"] == 23034


def test_clock_parsers():
    assert g.parse_chronyc_tracking(fixture("chronyc-tracking-synced.txt")) is True
    assert g.parse_chronyc_tracking(fixture("chronyc-tracking-unsynced.txt")) is False
    assert g.parse_timedatectl(fixture("timedatectl-show-synced.txt")) is True
    assert g.parse_timedatectl("NTPSynchronized=no\n") is False
    assert g.parse_timedatectl("Timezone=UTC\n") is None


# --- collection over a fake node ---------------------------------------------------------


def fake_node(root: Path, *, gpus=(), switches=(), driver_file=None, modules=()):
    for address, klass, device in [(a, "0x030200", d) for a, d in gpus] + [
        (a, "0x068000", d) for a, d in switches
    ]:
        folder = root / "sys/bus/pci/devices" / address
        folder.mkdir(parents=True)
        (folder / "vendor").write_text("0x10de\n")
        (folder / "class").write_text(klass + "\n")
        (folder / "device").write_text(device + "\n")
    other = root / "sys/bus/pci/devices/0000:00:00.0"
    other.mkdir(parents=True)
    (other / "vendor").write_text("0x8086\n")
    (other / "class").write_text("0x060000\n")
    (root / "proc/driver/nvidia").mkdir(parents=True)
    if driver_file:
        (root / "proc/driver/nvidia/version").write_text(fixture(driver_file))
    (root / "proc/modules").write_text(
        "".join(f"{m} 16384 0 - Live 0x0000000000000000\n" for m in modules)
    )
    return root


def runner(shape: str | None, fail_health_fields: bool = False):
    """A stand-in for the node's commands, answering from the fixtures."""

    def run(argv):
        if shape is None:
            return 127, "", "nvidia-smi: command not found"
        if shape == "no-driver":
            return 9, fixture("no-driver.stderr.txt"), ""
        args = argv[1:]
        if args[0].startswith("--query-gpu=index,uuid"):
            return 0, fixture(f"{shape}.query.csv"), ""
        if args[0].startswith("--query-gpu=index,ecc"):
            if fail_health_fields and "remapped_rows" in args[0]:
                return 2, fixture("invalid-field.stdout.txt"), ""
            name = f"{shape}.health.csv"
            return (0, fixture(name), "") if (FIXTURES / name).exists() else (2, "", "no")
        if args[:1] == ["-q"]:
            name = f"{shape}.q-compute.txt"
            return (0, fixture(name), "") if (FIXTURES / name).exists() else (6, "", "")
        if args[:2] == ["topo", "-m"]:
            return 0, fixture(f"{shape}.topo.txt"), ""
        raise AssertionError(argv)

    return run


H100_BUSES = [
    "0000:18:00.0",
    "0000:2a:00.0",
    "0000:3a:00.0",
    "0000:5d:00.0",
    "0000:9a:00.0",
    "0000:ab:00.0",
    "0000:ba:00.0",
    "0000:db:00.0",
]


def test_collect_h100_node(tmp_path):
    root = fake_node(
        tmp_path,
        gpus=[(a, "0x2330") for a in H100_BUSES],
        switches=[(f"0000:0{i + 1}:00.0", "0x22a3") for i in range(4)],
        driver_file="proc-driver-version-open.txt",
        modules=["nvidia", "nvidia_uvm"],
    )
    facts = g.collect_gpu(runner("h100x8"), host_root=str(root))
    assert facts["present"] and facts["count"] == 8 and facts["nvswitch"]
    assert facts["pci"]["nvswitches"] == 4 and len(facts["pci"]["gpus"]) == 8
    assert facts["driver"] == {
        "loaded": True,
        "version": "570.133.20",
        "branch": "570",
        "kernel_module": "open",
        "nouveau_loaded": False,
    }
    assert facts["cuda_version"] == "12.8" and facts["nvlink_all_pairs"]


def test_collect_gpus_without_driver(tmp_path):
    """A bare machine: GPUs on the bus, nouveau loaded, no nvidia-smi."""
    root = fake_node(
        tmp_path,
        gpus=[("0000:41:00.0", "0x26b9"), ("0000:c1:00.0", "0x26b9")],
        modules=["nouveau", "drm"],
    )
    facts = g.collect_gpu(runner(None), host_root=str(root))
    assert facts["present"] is True and facts["count"] == 0
    assert facts["driver"]["loaded"] is False and facts["driver"]["nouveau_loaded"] is True
    assert facts["nvidia_smi"] == {"usable": False, "error": "nvidia-smi: command not found"}
    assert facts["nvswitch"] is False


def test_collect_driver_not_answering(tmp_path):
    root = fake_node(tmp_path, gpus=[("0000:41:00.0", "0x26b9")])
    facts = g.collect_gpu(runner("no-driver"), host_root=str(root))
    assert facts["nvidia_smi"]["usable"] is False
    assert "couldn't communicate with the NVIDIA driver" in facts["nvidia_smi"]["error"]


def test_collect_no_gpu(tmp_path):
    facts = g.collect_gpu(runner(None), host_root=str(fake_node(tmp_path)))
    assert facts["present"] is False and facts["count"] == 0 and facts["gpus"] == []


def test_collect_falls_back_to_fewer_health_fields(tmp_path):
    root = fake_node(tmp_path, gpus=[("0000:41:00.0", "0x26b9"), ("0000:c1:00.0", "0x26b9")])
    facts = g.collect_gpu(runner("l40sx2", fail_health_fields=True), host_root=str(root))
    assert facts["count"] == 2 and facts["healthy"]
    assert all(gpu["health_read"] for gpu in facts["gpus"])
    # no procfs view (as in a container): the driver version comes from nvidia-smi
    assert facts["driver"]["version"] == "550.144.03" and facts["driver"]["loaded"]


def test_collect_node(tmp_path):
    for name, mtu in (("eth0", "9000"), ("lo", "65536")):
        (tmp_path / "sys/class/net" / name).mkdir(parents=True)
        (tmp_path / "sys/class/net" / name / "mtu").write_text(mtu + "\n")
        (tmp_path / "sys/class/net" / name / "operstate").write_text("up\n")
    (tmp_path / "dev/shm").mkdir(parents=True)
    ip_json = json.dumps(
        [
            {
                "ifname": "eth0",
                "mtu": 9000,
                "operstate": "UP",
                "addr_info": [{"local": "10.0.0.5", "prefixlen": 24}],
            },
        ]
    )

    def run(argv):
        if argv[0] == "ip":
            return 0, ip_json, ""
        if argv[0] == "chronyc":
            raise FileNotFoundError(argv[0])
        return 0, fixture("timedatectl-show-synced.txt"), ""

    node = g.collect_node(run, str(tmp_path))
    assert node["interfaces"]["eth0"] == {"mtu": 9000, "state": "up", "addresses": ["10.0.0.5/24"]}
    assert node["interfaces"]["lo"]["mtu"] == 65536
    assert node["clock"] == {"synchronized": True, "source": "timedatectl"}
    assert node["shm_bytes"] and node["shm_bytes"] > 0


# --- the module, through Ansible ----------------------------------------------------------


def test_module_through_ansible(tmp_path):
    """gpu_facts run by `ansible localhost -m gpu_facts` against the fake nvidia-smi."""
    shape = tmp_path / "shape"
    shape.mkdir()
    for name in ("query.csv", "health.csv", "q-compute.txt", "topo.txt"):
        (shape / name).write_text(fixture(f"l40sx2.{name}"))
    l40s = [("0000:41:00.0", "0x26b9"), ("0000:c1:00.0", "0x26b9")]
    root = fake_node(tmp_path / "root", gpus=l40s)
    env = {
        **os.environ,
        "FAKE_NVIDIA_SMI_DIR": str(shape),
        "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
        "ANSIBLE_STDOUT_CALLBACK": "json",
        "ANSIBLE_PYTHON_INTERPRETER": sys.executable,
    }
    done = subprocess.run(
        [
            Path(sys.executable).parent / "ansible",
            "localhost",
            "-c",
            "local",
            "-m",
            "inferfleet.fleet.gpu_facts",
            "-a",
            f"nvidia_smi={FAKE_SMI} host_root={root}",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]
    facts = result["ansible_facts"]["inferfleet_gpu"]
    assert result["changed"] is False
    assert (facts["count"], facts["model"], facts["memory_mib"]) == (2, "NVIDIA L40S", 46068)
    assert (facts["driver_version"], facts["cuda_version"]) == ("550.144.03", "12.4")
    assert facts["nvlink"] is False and facts["nvswitch"] is False and facts["healthy"]
