"""Each molecule scenario is one test: create, converge, idempotence, side effects,
verify, destroy, on the lab's node image with real systemd."""

import re
import subprocess

import pytest

pytestmark = pytest.mark.lab

# molecule/rolling is a link to molecule/replicated (one fleet, one converge: rolling
# updates, canaries and rollback, scaling in and out, the monitoring and its alerts):
# CI runs it once, as `replicated`. scripts/test.sh runs replicated in one lane and
# the others (pipeline first) in the second.
SCENARIOS = ["default", "lb", "replicated", "pipeline", "gpu_host"]


def failures(log: str) -> str:
    """The failed tasks with a few lines of context: what a person needs first."""
    lines = log.splitlines()
    hits = [i for i, line in enumerate(lines) if re.search(r"fatal:|FAILED!|failed: \[", line)]
    return "\n".join("\n".join(lines[max(0, i - 3) : i + 12]) for i in hits[:5])


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario(scenario, node_image, wheelhouse, repo_root, venv_bin, tmp_path_factory):
    done = subprocess.run(
        [venv_bin / "molecule", "test", "-s", scenario],
        cwd=repo_root,
        capture_output=True,
        text=True,
    )
    log = done.stdout + done.stderr
    path = tmp_path_factory.mktemp("molecule") / f"{scenario}.log"
    path.write_text(log)
    assert done.returncode == 0, (
        f"molecule test -s {scenario} failed (whole log: {path}):\n{failures(log)}\n"
        f"{log[-3000:]}"
    )
