"""scripts/gpu-check/measure.py on CPU (its scaled-down shapes): the planner's memory
figures against PyTorch's, and a measured latency profile the simulated engine loads.

The project's virtualenv has no torch: the script runs under the torch_python fixture's
interpreter (CPU PyTorch from the lab's wheelhouse, or INFERFLEET_TORCH_PYTHON's).
"""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts/gpu-check/measure.py"
pytestmark = pytest.mark.lab

spec = importlib.util.spec_from_file_location("sim_engine",
                                              ROOT / "roles/inference_engine/files/sim_engine.py")
sim = sys.modules.setdefault("sim_engine", importlib.util.module_from_spec(spec))
if not hasattr(sim, "Profile"):
    spec.loader.exec_module(sim)


@pytest.fixture
def measure(torch_python):
    def run(*args):
        return subprocess.run([torch_python, SCRIPT, *map(str, args), "--device", "cpu"],
                              capture_output=True, text=True, timeout=300)

    return run


@pytest.fixture(scope="module")
def collections(tmp_path_factory):
    """A folder holding ansible_collections/inferfleet/fleet: this checkout."""
    top = tmp_path_factory.mktemp("collections")
    (top / "ansible_collections/inferfleet").mkdir(parents=True)
    (top / "ansible_collections/inferfleet/fleet").symlink_to(ROOT)
    return top


def test_memory_rows_within_one_percent(measure, collections, tmp_path):
    done = measure("memory", "--collections", collections, "--out", tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads((tmp_path / "memory.json").read_text())
    kinds = ["weights_bf16", "kv_per_token"]
    if not any("no fp8 rows" in note for note in result["notes"]):  # torch has float8
        kinds.append("weights_fp8")
    assert sorted((r["shape"], r["what"]) for r in result["rows"]) == sorted(
        (shape, kind) for shape in ("llama-3.1-8b", "qwen2.5-72b") for kind in kinds)
    for row in result["rows"]:
        assert row["within_1pct"] and abs(row["ratio"] - 1) <= 0.01, row
        assert row["measured_bytes"] > 0 and row["planner_bytes"] > 0
    assert len(done.stdout.strip().splitlines()) == len(result["rows"]) + 1


def test_profile_loads_in_the_simulator(measure, tmp_path):
    done = measure("profile", "--out", tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    path = tmp_path / "profile-llama-3.1-8b.json"
    written = json.loads(path.read_text())
    fields = [f.name for f in sim.dataclasses.fields(sim.Profile)]
    assert sorted(written) == sorted(fields)
    profile = sim.Profile.load(str(path))
    assert profile.name == "cpu-small-llama" and profile.block_size == 16
    assert profile.kv_blocks > 0 and profile.max_num_seqs == 256
    figures = [getattr(profile, f) for f in fields if f.endswith("_ms")]
    assert all(v >= 0 for v in figures)
    assert profile.prefill_per_token_ms > 0
    assert profile.decode_base_ms + profile.decode_per_seq_ms > 0
    points = json.loads((tmp_path / "profile-llama-3.1-8b.points.json").read_text())
    assert {p["kind"] for p in points["points"]} == {"decode", "prefill"}
    assert points["ceilings"] == "unknown"  # a CPU has no known peak


def test_wrong_collections_folder_exits_2(measure, tmp_path):
    missing = tmp_path / "no-such-collections"
    done = measure("memory", "--collections", missing, "--out", tmp_path / "out")
    assert done.returncode == 2
    assert str(missing) in done.stderr
