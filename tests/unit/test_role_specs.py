"""Every role's meta/argument_specs.yml mirrors its defaults/main.yml (STYLE.md)."""

from pathlib import Path

import pytest
import yaml

ROLES = sorted(p for p in (Path(__file__).parents[2] / "roles").iterdir() if p.is_dir())


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_argument_specs_mirror_defaults(role):
    defaults_file = role / "defaults" / "main.yml"
    defaults = yaml.safe_load(defaults_file.read_text()) or {} if defaults_file.exists() else {}
    specs = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())
    options = specs["argument_specs"]["main"].get("options", {})
    assert set(defaults) == set(options), (
        f"{role.name}: only in defaults {sorted(set(defaults) - set(options))}, "
        f"only in argument_specs {sorted(set(options) - set(defaults))}"
    )
    for name, spec in options.items():
        assert spec.get("description"), f"{role.name}: {name} has no description"
        assert name.startswith(role.name + "_"), f"{role.name}: {name} lacks the role's prefix"
