"""Package and repository selection of gpu_driver and container_runtime, for every
supported OS, driver branch, source and kernel module flavour.

The roles' own data (vars/<os>.yml) and selection (tasks/platform.yml) are rendered by
Ansible itself: one `ansible-playbook` run over many local hosts, each with the facts of
one operating system (set as cacheable facts, no real host is read) and one set of role
variables. Each host's selection, or the message its preflight stopped with, is written
to one JSON file the tests read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"
KERNEL = "6.8.0-51-generic"

OS_FACTS = {
    "ubuntu2204": dict(
        os_family="Debian",
        distribution="Ubuntu",
        distribution_major_version="22",
        distribution_version="22.04",
        distribution_release="jammy",
    ),
    "ubuntu2404": dict(
        os_family="Debian",
        distribution="Ubuntu",
        distribution_major_version="24",
        distribution_version="24.04",
        distribution_release="noble",
    ),
    "debian12": dict(
        os_family="Debian",
        distribution="Debian",
        distribution_major_version="12",
        distribution_version="12.8",
        distribution_release="bookworm",
    ),
    "rhel9": dict(
        os_family="RedHat",
        distribution="RedHat",
        distribution_major_version="9",
        distribution_version="9.5",
        distribution_release="Plow",
    ),
    "rocky9": dict(
        os_family="RedHat",
        distribution="Rocky",
        distribution_major_version="9",
        distribution_version="9.5",
        distribution_release="Blue Onyx",
    ),
    "ubuntu2004": dict(
        os_family="Debian",
        distribution="Ubuntu",
        distribution_major_version="20",
        distribution_version="20.04",
        distribution_release="focal",
    ),
}
SUPPORTED = ["ubuntu2204", "ubuntu2404", "debian12", "rhel9", "rocky9"]
BRANCHES = ["570", "580", "590"]


def _cases() -> dict[str, dict]:
    """host name -> {os, arch, vars}"""
    cases = {}
    for os_name in SUPPORTED:
        for branch in BRANCHES:
            for flavour in ("open", "proprietary"):
                cases[f"{os_name}-cuda-{branch}-{flavour}"] = {
                    "os": os_name,
                    "vars": {
                        "gpu_driver_branch": branch,
                        "gpu_driver_open_kernel_modules": flavour == "open",
                    },
                }
    for os_name in ("ubuntu2204", "ubuntu2404"):
        for flavour in ("open", "proprietary"):
            cases[f"{os_name}-distribution-570-{flavour}"] = {
                "os": os_name,
                "vars": {
                    "gpu_driver_source": "distribution",
                    "gpu_driver_branch": "570",
                    "gpu_driver_open_kernel_modules": flavour == "open",
                },
            }
    for flavour in ("open", "proprietary"):
        cases[f"debian12-distribution-535-{flavour}"] = {
            "os": "debian12",
            "vars": {
                "gpu_driver_source": "distribution",
                "gpu_driver_branch": "535",
                "gpu_driver_open_kernel_modules": flavour == "open",
            },
        }
    cases["ubuntu2204-arm"] = {"os": "ubuntu2204", "arch": "aarch64", "vars": {}}
    cases["rhel9-arm"] = {"os": "rhel9", "arch": "aarch64", "vars": {}}
    cases["debian12-exact"] = {"os": "debian12", "vars": {"gpu_driver_version": "570.133.20"}}
    cases["rhel9-exact"] = {"os": "rhel9", "vars": {"gpu_driver_version": "570.133.20"}}
    cases["ubuntu2404-mirror"] = {
        "os": "ubuntu2404",
        "vars": {
            "gpu_driver_cuda_repo_base_url": "https://mirror.example.internal/cuda/repos/",
            "gpu_driver_packages": ["my-nvidia-bundle"],
            "gpu_driver_extra_packages": ["libnvidia-nscq-570"],
            "gpu_driver_dcgm": True,
            "container_runtime_docker_repo_base_url": "https://mirror.example.internal/docker/",
            "container_runtime_nvidia_toolkit_version": "1.17.8-1",
        },
    }
    cases["rocky9-toolkit-version"] = {
        "os": "rocky9",
        "vars": {"container_runtime_nvidia_toolkit_version": "1.17.8"},
    }
    cases["debian12-docker-distribution-cpu"] = {
        "os": "debian12",
        "vars": {
            "container_runtime_docker_source": "distribution",
            "container_runtime_accelerator": "cpu",
            "container_runtime_default_shm_size": "",
            "container_runtime_log_max_file": 5,
            "container_runtime_daemon_extra": {"live-restore": True},
        },
    }
    # Refused settings: the message each preflight stops with.
    cases["err-ubuntu2004"] = {"os": "ubuntu2004", "vars": {}}
    cases["err-debian12-distribution-570"] = {
        "os": "debian12",
        "vars": {"gpu_driver_source": "distribution", "gpu_driver_branch": "570"},
    }
    cases["err-rhel9-distribution"] = {"os": "rhel9", "vars": {"gpu_driver_source": "distribution"}}
    cases["err-version-branch"] = {"os": "ubuntu2404", "vars": {"gpu_driver_version": "580.65.06"}}
    cases["err-rhel9-docker-distribution"] = {
        "os": "rhel9",
        "vars": {"container_runtime_docker_source": "distribution"},
    }
    return cases


PLAYBOOK = """\
- name: Render the GPU host roles' selections for many operating systems
  hosts: all
  gather_facts: false
  tasks:
    - name: Pretend to be the operating system of this case
      ansible.builtin.set_fact:
        os_family: "{{ fake_facts.os_family }}"
        distribution: "{{ fake_facts.distribution }}"
        distribution_major_version: "{{ fake_facts.distribution_major_version }}"
        distribution_version: "{{ fake_facts.distribution_version }}"
        distribution_release: "{{ fake_facts.distribution_release }}"
        architecture: "{{ fake_facts.architecture }}"
        kernel: "{{ fake_facts.kernel }}"
        cacheable: true

    - name: Select the driver's packages
      block:
        - name: Run gpu_driver's platform tasks
          ansible.builtin.include_role:
            name: inferfleet.fleet.gpu_driver
            tasks_from: platform
            public: true
        - name: Keep the driver selection
          ansible.builtin.set_fact:
            result_driver: "{{ __gpu_driver_selection }}"
      rescue:
        - name: Keep the driver error
          ansible.builtin.set_fact:
            result_driver: {error: "{{ ansible_failed_result.msg }}"}

    - name: Select the container runtime's packages
      block:
        - name: Run container_runtime's platform tasks
          ansible.builtin.include_role:
            name: inferfleet.fleet.container_runtime
            tasks_from: platform
            public: true
        - name: Keep the runtime selection
          ansible.builtin.set_fact:
            result_runtime: >-
              {{ __container_runtime_selection
                 | combine({'daemon_settings': _container_runtime_daemon_settings}) }}
      rescue:
        - name: Keep the runtime error
          ansible.builtin.set_fact:
            result_runtime: {error: "{{ ansible_failed_result.msg }}"}

    - name: Write every host's selections
      ansible.builtin.copy:
        content: >-
          {{ dict(ansible_play_hosts_all | zip(ansible_play_hosts_all
             | map('extract', hostvars) | map('dict2items')
             | map('selectattr', 'key', 'in', ['result_driver', 'result_runtime'])
             | map('items2dict'))) | to_json }}
        dest: "{{ out }}"
        mode: "0644"
      run_once: true
"""


@pytest.fixture(scope="module")
def selections(tmp_path_factory) -> dict[str, dict]:
    folder = tmp_path_factory.mktemp("gpu-packages")
    hosts = {}
    for name, case in _cases().items():
        facts = {
            **OS_FACTS[case["os"]],
            "architecture": case.get("arch", "x86_64"),
            "kernel": KERNEL,
        }
        hosts[name] = {
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
            "fake_facts": facts,
            **case["vars"],
        }
    (folder / "inventory.yml").write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    (folder / "render.yml").write_text(PLAYBOOK)
    out = folder / "selections.json"
    env = {
        **os.environ,
        "ANSIBLE_FORKS": "20",
        "ANSIBLE_GATHERING": "explicit",
    }
    done = subprocess.run(
        [
            ANSIBLE_PLAYBOOK,
            "-i",
            folder / "inventory.yml",
            folder / "render.yml",
            "-e",
            f"out={out}",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=folder,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return json.loads(out.read_text())


def driver(selections, host):
    result = selections[host]["result_driver"]
    assert "error" not in result, result
    return result


def runtime(selections, host):
    result = selections[host]["result_runtime"]
    assert "error" not in result, result
    return result


CUDA = "https://developer.download.nvidia.com/compute/cuda/repos"


# --- gpu_driver: NVIDIA's CUDA repository -------------------------------------------------


@pytest.mark.parametrize("os_name", ["ubuntu2204", "ubuntu2404"])
@pytest.mark.parametrize("branch", BRANCHES)
@pytest.mark.parametrize("flavour", ["open", "proprietary"])
def test_ubuntu_cuda_repo(selections, os_name, branch, flavour):
    sel = driver(selections, f"{os_name}-cuda-{branch}-{flavour}")
    # The branch is in the package names up to 580, and only in the pin from 590 on.
    s = f"-{branch}" if int(branch) < 590 else ""
    dkms = f"nvidia-dkms{s}-open" if flavour == "open" else f"nvidia-dkms{s}"
    assert sel["driver_packages"] == [
        dkms,
        f"libnvidia-compute{s}",
        f"nvidia-utils{s}",
        f"nvidia-compute-utils{s}",
    ]
    assert sel["prerequisites"] == [f"linux-headers-{KERNEL}"]
    assert sel["cuda_repo"] == {
        "url": f"{CUDA}/{os_name}/x86_64/",
        "key": f"{CUDA}/{os_name}/x86_64/3bf863cc.pub",
    }
    assert sel["version_package"] == f"libnvidia-compute{s}"
    assert sel["fabricmanager_package"] == f"nvidia-fabricmanager{s}"
    assert sel["apt_pin"] == f"{branch}.*"
    assert (sel["pkg_mgr"], sel["flavour"], sel["branch"]) == ("apt", flavour, branch)
    assert sel["distribution_repository"] == {} and sel["dcgm_packages"] == []


@pytest.mark.parametrize("branch", BRANCHES)
@pytest.mark.parametrize("flavour", ["open", "proprietary"])
def test_debian_cuda_repo(selections, branch, flavour):
    sel = driver(selections, f"debian12-cuda-{branch}-{flavour}")
    kernel_pkg = "nvidia-kernel-open-dkms" if flavour == "open" else "nvidia-kernel-dkms"
    assert sel["driver_packages"] == ["nvidia-driver-cuda", kernel_pkg, "nvidia-persistenced"]
    assert sel["cuda_repo"]["url"] == f"{CUDA}/debian12/x86_64/"
    assert sel["cuda_repo"]["key"] == f"{CUDA}/debian12/x86_64/3bf863cc.pub"
    # Debian's NVIDIA packages carry no branch: the APT pin holds it.
    assert sel["apt_pin"] == f"{branch}.*"
    assert sel["version_package"] == "nvidia-driver-cuda"
    s = f"-{branch}" if int(branch) < 590 else ""
    assert sel["fabricmanager_package"] == f"nvidia-fabricmanager{s}"


@pytest.mark.parametrize("os_name", ["rhel9", "rocky9"])
@pytest.mark.parametrize("branch", BRANCHES)
@pytest.mark.parametrize("flavour", ["open", "proprietary"])
def test_rhel_cuda_repo(selections, os_name, branch, flavour):
    sel = driver(selections, f"{os_name}-cuda-{branch}-{flavour}")
    stream = f"nvidia-driver:{branch}-{'open' if flavour == 'open' else 'dkms'}"
    assert sel["module_stream"] == stream
    assert sel["driver_packages"] == [f"@{stream}", "nvidia-driver-cuda", "nvidia-persistenced"]
    assert sel["prerequisites"] == [f"kernel-devel-{KERNEL}", "kernel-headers", "dkms"]
    assert sel["cuda_repo"] == {
        "url": f"{CUDA}/rhel9/x86_64/",
        "key": f"{CUDA}/rhel9/x86_64/D42D0685.pub",
    }
    assert sel["fabricmanager_package"] == "nvidia-fabric-manager"
    assert (sel["pkg_mgr"], sel["apt_pin"]) == ("dnf", "")
    epel = (
        "https://dl.fedoraproject.org/pub/epel/epel-release-latest-9.noarch.rpm"
        if os_name == "rhel9"
        else "epel-release"
    )
    assert sel["epel_package"] == epel


def test_arm_servers_use_sbsa(selections):
    assert driver(selections, "ubuntu2204-arm")["cuda_repo"]["url"] == f"{CUDA}/ubuntu2204/sbsa/"
    assert driver(selections, "rhel9-arm")["cuda_repo"]["url"] == f"{CUDA}/rhel9/sbsa/"
    assert runtime(selections, "ubuntu2204-arm")["toolkit_repo"]["url"] == (
        "https://nvidia.github.io/libnvidia-container/stable/deb/arm64"
    )


def test_exact_version(selections):
    assert driver(selections, "debian12-exact")["apt_pin"] == "570.133.20-*"
    assert driver(selections, "rhel9-exact")["version"] == "570.133.20"


def test_defaults_are_branch_570_open_from_cuda_repo(selections):
    sel = driver(selections, "ubuntu2204-arm")
    assert (sel["source"], sel["branch"], sel["flavour"]) == ("cuda_repo", "570", "open")


def test_mirror_override_and_extras(selections):
    sel = driver(selections, "ubuntu2404-mirror")
    assert sel["cuda_repo"] == {
        "url": "https://mirror.example.internal/cuda/repos/ubuntu2404/x86_64/",
        "key": "https://mirror.example.internal/cuda/repos/ubuntu2404/x86_64/3bf863cc.pub",
    }
    assert sel["driver_packages"] == ["my-nvidia-bundle"]
    assert sel["extra_packages"] == ["libnvidia-nscq-570"]
    assert sel["dcgm_packages"] == ["datacenter-gpu-manager-4-cuda12"]


# --- gpu_driver: the distributions' own packages ------------------------------------------


@pytest.mark.parametrize("os_name", ["ubuntu2204", "ubuntu2404"])
@pytest.mark.parametrize("flavour", ["open", "proprietary"])
def test_ubuntu_distribution(selections, os_name, flavour):
    sel = driver(selections, f"{os_name}-distribution-570-{flavour}")
    headless = "nvidia-headless-570-server" + ("-open" if flavour == "open" else "")
    assert sel["driver_packages"] == [headless, "nvidia-utils-570-server"]
    assert sel["version_package"] == "libnvidia-compute-570-server"
    assert sel["fabricmanager_package"] == "nvidia-fabricmanager-570"
    assert sel["distribution_repository"] == {}


@pytest.mark.parametrize("flavour", ["open", "proprietary"])
def test_debian_distribution(selections, flavour):
    sel = driver(selections, f"debian12-distribution-535-{flavour}")
    if flavour == "open":
        expected = [
            "nvidia-open-kernel-dkms",
            "firmware-nvidia-gsp",
            "nvidia-smi",
            "libcuda1",
            "nvidia-persistenced",
        ]
    else:
        expected = ["nvidia-kernel-dkms", "nvidia-smi", "libcuda1", "nvidia-persistenced"]
    assert sel["driver_packages"] == expected
    assert sel["distribution_repository"] == {
        "uris": "http://deb.debian.org/debian",
        "suites": ["bookworm", "bookworm-updates"],
        "components": ["contrib", "non-free", "non-free-firmware"],
    }
    assert sel["fabricmanager_package"] == ""  # Debian ships none: refused on NVSwitch nodes
    assert sel["apt_pin"] == "535.*"


# --- refused settings ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "host, role, message",
    [
        (
            "err-ubuntu2004",
            "result_driver",
            "supports Ubuntu 22.04/24.04, Debian 12 and RHEL/Rocky 9, not Ubuntu 20.04",
        ),
        ("err-ubuntu2004", "result_runtime", "not Ubuntu 20.04"),
        ("err-debian12-distribution-570", "result_driver", "ships the driver branch 535 only"),
        (
            "err-rhel9-distribution",
            "result_driver",
            "RedHat ships no NVIDIA driver packages: set gpu_driver_source: cuda_repo",
        ),
        (
            "err-version-branch",
            "result_driver",
            "gpu_driver_version 580.65.06 is not of branch 570",
        ),
        ("err-rhel9-docker-distribution", "result_runtime", "RedHat ships no Docker engine"),
    ],
)
def test_refused(selections, host, role, message):
    error = " ".join(selections[host][role].get("error", "").split())
    assert message in error, selections[host][role]


# --- container_runtime ---------------------------------------------------------------------


@pytest.mark.parametrize("os_name", ["ubuntu2204", "ubuntu2404", "debian12"])
def test_docker_repo_apt(selections, os_name):
    sel = runtime(selections, f"{os_name}-cuda-570-open")
    distro = "debian" if os_name == "debian12" else "ubuntu"
    suite = {"ubuntu2204": "jammy", "ubuntu2404": "noble", "debian12": "bookworm"}[os_name]
    assert sel["docker_repo"] == {
        "url": f"https://download.docker.com/linux/{distro}",
        "key": f"https://download.docker.com/linux/{distro}/gpg",
        "suite": suite,
        "component": "stable",
    }
    assert sel["docker_packages"] == [
        "docker-ce",
        "docker-ce-cli",
        "containerd.io",
        "docker-buildx-plugin",
    ]
    assert sel["toolkit_repo"] == {
        "url": "https://nvidia.github.io/libnvidia-container/stable/deb/amd64",
        "key": "https://nvidia.github.io/libnvidia-container/gpgkey",
    }
    assert sel["toolkit_packages"] == ["nvidia-container-toolkit"]


@pytest.mark.parametrize("os_name, path", [("rhel9", "rhel"), ("rocky9", "centos")])
def test_docker_repo_dnf(selections, os_name, path):
    sel = runtime(selections, f"{os_name}-cuda-570-open")
    assert sel["docker_repo"]["url"] == (
        f"https://download.docker.com/linux/{path}/$releasever/$basearch/stable"
    )
    assert sel["docker_repo"]["key"] == f"https://download.docker.com/linux/{path}/gpg"
    assert sel["toolkit_repo"]["url"] == (
        "https://nvidia.github.io/libnvidia-container/stable/rpm/$basearch"
    )


def test_toolkit_version_pins_all_its_packages(selections):
    assert runtime(selections, "ubuntu2404-mirror")["toolkit_packages"] == [
        "nvidia-container-toolkit=1.17.8-1",
        "nvidia-container-toolkit-base=1.17.8-1",
        "libnvidia-container-tools=1.17.8-1",
        "libnvidia-container1=1.17.8-1",
    ]
    assert runtime(selections, "rocky9-toolkit-version")["toolkit_packages"][0] == (
        "nvidia-container-toolkit-1.17.8"
    )
    assert runtime(selections, "ubuntu2404-mirror")["docker_repo"]["url"] == (
        "https://mirror.example.internal/docker/ubuntu"
    )


def test_docker_from_the_distribution_on_cpu(selections):
    sel = runtime(selections, "debian12-docker-distribution-cpu")
    assert sel["docker_packages"] == ["docker.io"]
    assert sel["docker_repo"] == {} and sel["toolkit_repo"] == {} and sel["toolkit_packages"] == []
    assert sel["daemon_settings"] == {
        "log-driver": "json-file",
        "log-opts": {"max-size": "100m", "max-file": "5"},
        "live-restore": True,
    }


def test_default_daemon_settings(selections):
    assert runtime(selections, "debian12-cuda-570-open")["daemon_settings"] == {
        "log-driver": "json-file",
        "log-opts": {"max-size": "100m", "max-file": "3"},
        "default-shm-size": "1g",
    }
