"""Every role's meta/argument_specs.yml mirrors its defaults/main.yml (STYLE.md); the
values several roles read are defined once, in roles/fleet_defaults, and described by
their owner (the role their name starts with), which depends on fleet_defaults."""

from pathlib import Path

import pytest
import yaml

ROLES_DIR = Path(__file__).parents[2] / "roles"
SHARED = yaml.safe_load((ROLES_DIR / "fleet_defaults" / "defaults" / "main.yml").read_text())
ROLES = sorted(p for p in ROLES_DIR.iterdir() if p.is_dir() and p.name != "fleet_defaults")


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_argument_specs_mirror_defaults(role):
    defaults_file = role / "defaults" / "main.yml"
    defaults = yaml.safe_load(defaults_file.read_text()) or {} if defaults_file.exists() else {}
    specs = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())
    options = specs["argument_specs"]["main"].get("options", {})
    owned = {name for name in SHARED if name.startswith(role.name + "_")}
    assert not owned & set(defaults), f"{role.name}: defines again {sorted(owned & set(defaults))}"
    defaults = {**defaults, **dict.fromkeys(owned)}
    assert set(defaults) == set(options), (
        f"{role.name}: only in defaults {sorted(set(defaults) - set(options))}, "
        f"only in argument_specs {sorted(set(options) - set(defaults))}"
    )
    for name, spec in options.items():
        assert spec.get("description"), f"{role.name}: {name} has no description"
        assert name.startswith(role.name + "_"), f"{role.name}: {name} lacks the role's prefix"


def test_every_shared_value_has_an_owner_that_depends_on_it():
    for name in SHARED:
        owners = [r for r in ROLES if name.startswith(r.name + "_")]
        assert len(owners) == 1, f"{name}: no single owning role ({owners})"
        meta = yaml.safe_load((owners[0] / "meta" / "main.yml").read_text())
        deps = [d["role"] if isinstance(d, dict) else d for d in meta["dependencies"]]
        assert "inferfleet.fleet.fleet_defaults" in deps, f"{owners[0].name} lacks the dependency"
