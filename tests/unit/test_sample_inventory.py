"""inventories/sample lists every role variable at its default, commented out."""

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = sorted((ROOT / "inventories" / "sample" / "group_vars").glob("*/*.yml"))
ROLE_SAMPLES = [p for p in SAMPLES if (ROOT / "roles" / p.stem).is_dir()]


def test_every_deployed_role_has_a_sample():
    sampled = {p.stem for p in ROLE_SAMPLES}
    for role in ("model_sync", "inference_engine", "load_balancer", "monitoring", "preflight",
                 "gpu_driver", "container_runtime", "fabric_preflight"):
        assert role in sampled, f"inventories/sample/group_vars/*/{role}.yml is missing"


@pytest.mark.parametrize("sample", ROLE_SAMPLES, ids=lambda p: p.stem)
def test_sample_lists_every_default(sample):
    defaults = yaml.safe_load((ROOT / "roles" / sample.stem / "defaults" / "main.yml").read_text())
    listed = set(re.findall(r"^# ([a-z][a-z0-9_]*):", sample.read_text(), re.M))
    assert set(defaults) <= listed, f"{sample.name} lacks {sorted(set(defaults) - listed)}"
