"""Each molecule scenario is one test: create, converge, idempotence, side effects,
verify, destroy, on the lab's node image with real systemd."""

import os
import re
import signal
import subprocess

import pytest

pytestmark = pytest.mark.lab

# molecule/replicated is one fleet, one converge: rolling updates, canaries and rollback,
# scaling in and out, the monitoring and its alerts. scripts/test.sh runs replicated and
# gpu_host in one lane and the others (pipeline first) in the second.
SCENARIOS = ["default", "lb", "replicated", "pipeline", "gpu_host"]
# In these two, every CLI command (rollouts, rollback, scale, deploy, doctor) runs
# through Mitogen (INFERFLEET_MITOGEN=1; docs/scaling.md), so CI runs that strategy on
# real vLLM engines and a real pipeline; the others keep Ansible's own. (Not for speed:
# these scenarios' time is vLLM starting and the waits.) Molecule's own playbooks keep
# Ansible's: its create and destroy poll async docker tasks, which hang under Mitogen
# (its issue 835).
MITOGEN = {"replicated", "pipeline"}
# Their engine nodes start from the engine image (vLLM installed: tests/conftest.py,
# engine_image), so each converge skips the same install on every node; the install
# test and `make demo` install on plain nodes.
ENGINE_IMAGE = {"replicated", "pipeline"}
# How long a scenario may run before it is taken for hung and stopped, with its log so
# far (seconds; 30 minutes unless named). Beside the other lane in a fresh-clone run here:
# pipeline 55 minutes (alone about 30), replicated 38, lb 8, gpu_host 7.
LIMIT_S = {"pipeline": 4500, "replicated": 3600}


def ignored(lines: list[str], i: int) -> bool:
    """Whether the failure on line i was ignored: "...ignoring" before the next task."""
    for later in lines[i + 1 :]:
        if "...ignoring" in later:
            return True
        if "TASK [" in later or "PLAY [" in later:
            return False
    return False


def failures(scenario: str, log: str) -> str:
    """What a person needs first: the line of an image build that failed (dependency steps
    print "inferfleet: cannot build ..."), else the failed tasks that were not ignored, the
    last ones first (the one that ended the run), each with its message."""
    lines = log.splitlines()
    builds = [line for line in lines if line.startswith("inferfleet: cannot build")]
    if builds:
        return f"{builds[0]}\n(in molecule test -s {scenario}'s dependency step)"
    hits = [
        i
        for i, line in enumerate(lines)
        if re.search(r"fatal:|FAILED!|failed: \[", line) and not ignored(lines, i)
    ]
    tasks = "\n---\n".join("\n".join(lines[max(0, i - 3) : i + 40]) for i in reversed(hits[-3:]))
    return f"molecule test -s {scenario} failed:\n{tasks}"


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario(scenario, node_image, wheelhouse, repo_root, venv_bin, tmp_path_factory,
                  request):
    if scenario in ENGINE_IMAGE:
        request.getfixturevalue("engine_image")
    env = dict(os.environ, INFERFLEET_MITOGEN="1" if scenario in MITOGEN else "0")
    path = tmp_path_factory.mktemp("molecule") / f"{scenario}.log"
    limit = LIMIT_S.get(scenario, 1800)
    with open(path, "w") as out:
        run = subprocess.Popen(
            [venv_bin / "molecule", "test", "-s", scenario],
            cwd=repo_root, env=env, stdout=out, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,  # its playbooks and CLI runs go with it on a timeout
        )
        try:
            returncode = run.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            returncode = None
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
            subprocess.run([venv_bin / "molecule", "destroy", "-s", scenario], cwd=repo_root,
                           env=env, capture_output=True, timeout=600)
    log = path.read_text(errors="replace")
    if returncode is None:
        pytest.fail(f"molecule test -s {scenario} still ran after {limit} s "
                    f"(stopped, its containers destroyed); where it was:\n{log[-5000:]}\n"
                    f"(whole log: {path})", pytrace=False)
    assert returncode == 0, f"{failures(scenario, log)}\n(whole log: {path})\n{log[-3000:]}"
