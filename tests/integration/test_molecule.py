"""Each molecule scenario is one test: create, converge, idempotence, side effects,
verify, destroy, on the lab's node image with real systemd."""

import subprocess

import pytest

pytestmark = pytest.mark.lab

SCENARIOS = ["default", "lb", "gpu_host", "engine", "replicated"]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario(scenario, node_image, wheelhouse, repo_root, venv_bin):
    done = subprocess.run(
        [venv_bin / "molecule", "test", "-s", scenario],
        cwd=repo_root,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, (
        f"molecule test -s {scenario} failed:\n{done.stdout[-20000:]}\n{done.stderr[-5000:]}"
    )
