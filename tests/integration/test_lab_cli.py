"""The operator's path on the real lab, with TLS on: `lab up --tls` -> a client (the
openai SDK, trusting the lab's CA) -> `status` -> `verify --failover` (over HTTPS) ->
`lab down`.

Two vLLM CPU engines behind HAProxy, deployed by site.yml through the CLI (its last play
asks for a completion over HTTPS, verifying the certificate); plain HTTP is refused;
afterwards nothing the lab made is left (containers, networks, generated inventory files).
"""

import json
import os
import ssl
import subprocess
import time
from pathlib import Path

import openai
import pytest
import yaml

from inferfleet.lab import fleet

pytestmark = pytest.mark.lab

GENERATED = ["host_vars/inferfleet-lab-node1.yml", "group_vars/all/secrets.yml", "../lab-ca.pem"]


def _cli(venv_bin, repo_root, *args, timeout=1200):
    return subprocess.run(
        [venv_bin / "inferfleet", *args],
        cwd=repo_root,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _labelled(kind: str) -> list[str]:
    done = subprocess.run(
        ["docker", kind, "ls", "-q", "--filter", "label=inferfleet.lab=inferfleet-lab"],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.split()


LAB_HOSTS = ["inferfleet-lab-node1", "inferfleet-lab-node2", "inferfleet-lab-lb"]
# Where a host keeps installed software and model weights: large, and written by no role
# that handles a secret.
SKIP_DIRS = ["venv", "wheelhouse", "models", "site-packages", "dist-packages", "__pycache__"]


def _exec_ok(host: str, script: str) -> bool:
    done = subprocess.run(["docker", "exec", host, "bash", "-c", script], capture_output=True)
    return done.returncode == 0


def _exec(host: str, script: str, stdin: str = "") -> str:
    done = subprocess.run(
        ["docker", "exec", "-i", host, "bash", "-c", script],
        input=stdin,
        capture_output=True,
        text=True,
    )
    assert done.returncode in (0, 123), done.stderr  # 123: xargs ran on nothing found
    return done.stdout


def secret_leaks(secrets: list[str], runs: Path, since: float) -> list[str]:
    """Where the lab's secrets show outside their private files: the runs' records and
    ansible-runner artifacts on the controller, and on each host every process's command
    line, the whole journal and every world-readable file. The secrets reach the hosts'
    grep on its standard input, never on a command line."""
    found = []
    for path in runs.rglob("*"):
        if path.is_file() and path.stat().st_mtime >= since:
            text = path.read_text(errors="replace")
            found += [f"controller: {path}" for s in secrets if s in text]
    excludes = " ".join(f"--exclude-dir={d}" for d in SKIP_DIRS)
    for host in LAB_HOSTS:
        for what, script in (
            ("a command line", "ps -eo args"),
            ("the journal", "journalctl -o cat --no-pager"),
        ):
            text = _exec(host, script)
            found += [f"{host}: {what}" for s in secrets if s in text]
        files = _exec(
            host,
            f"grep -rlsF -f /dev/stdin {excludes} /etc /opt /var /usr/local /root /home /run /tmp"
            " | xargs -r stat -c '%a %U:%G %n'",
            stdin="\n".join(secrets) + "\n",
        )
        assert files.strip(), f"{host}: no file holds a secret: is the search broken?"
        for line in files.splitlines():
            if int(line.split()[0], 8) & 0o004:
                found.append(f"{host}: world-readable {line}")
    return found


def _second_controller_deploys(venv_bin, repo_root, home: Path) -> subprocess.CompletedProcess:
    """`inferfleet deploy` from another controller process: its own home, its own runs."""
    env = dict(os.environ, HOME=str(home), INFERFLEET_RUNS_DIR=str(home / "runs"))
    env.pop("XDG_STATE_HOME", None)
    return subprocess.run(
        [venv_bin / "inferfleet", "deploy"],
        cwd=repo_root,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def test_lab_up_status_verify_down(
    node_image, wheelhouse, repo_root, venv_bin, tmp_path, lab_hosts
):
    inventory = repo_root / "inventories" / "lab"
    started = time.time()
    try:
        up_run = subprocess.Popen(
            [venv_bin / "inferfleet", "lab", "up", "--tls"],
            cwd=repo_root,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        # While lab up's site.yml runs, a second controller's deploy is refused, naming it,
        # and runs nothing on the fleet (no task but the lock's).
        for _ in range(600):
            if up_run.poll() is not None or _exec_ok(
                "inferfleet-lab-lb", "test -f /var/lib/inferfleet/lock/holder.json"
            ):
                break
            time.sleep(1)
        assert up_run.poll() is None, "lab up ended before its site.yml held the lock"
        second = _second_controller_deploys(venv_bin, repo_root, tmp_path / "home")
        words = " ".join(second.stdout.split())
        assert second.returncode == 6, second.stdout[-3000:] + second.stderr[-2000:]
        assert "running `inferfleet lab up` since" in words and "wait until it ends" in words
        events = [
            json.loads(p.read_text())
            for p in (tmp_path / "home" / "runs").glob("*/artifacts/*/job_events/*.json")
        ]
        ran = {e["event_data"]["task"] for e in events if e["event"] == "runner_on_ok"}
        assert ran and all(task.startswith("Lock | ") for task in ran), ran
        out, err = up_run.communicate(timeout=1500)
        up = subprocess.CompletedProcess(up_run.args, up_run.returncode, out, err)
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-2000:]
        assert not _exec_ok("inferfleet-lab-lb", "test -e /var/lib/inferfleet/lock")  # released
        ca = fleet.ca_file(inventory)
        assert f"curl -s --cacert {ca} https://" in up.stdout
        assert "Authorization: Bearer sk-lab-" in up.stdout
        values = yaml.safe_load((inventory / "group_vars" / "all" / "secrets.yml").read_text())
        lb = yaml.safe_load((inventory / "host_vars" / "inferfleet-lab-lb.yml").read_text())
        endpoint = f"{lb['inferfleet_address']}:8080"

        # A client as the README shows it: the openai SDK, trusting the lab's CA.
        client = openai.OpenAI(
            base_url=f"https://{endpoint}/v1",
            api_key=values["inferfleet_lab_api_key"],
            http_client=openai.DefaultHttpxClient(verify=ssl.create_default_context(cafile=ca)),
        )
        answer = client.completions.create(
            model="tiny-llama", prompt="Hello, fleet", max_tokens=8, temperature=0
        )
        assert answer.choices[0].text, answer
        # Without the lab's CA the certificate does not verify; plain HTTP gets no answer.
        with pytest.raises(openai.APIConnectionError):
            openai.OpenAI(
                base_url=f"https://{endpoint}/v1", api_key="x", max_retries=0
            ).models.list()
        plain = subprocess.run(
            ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", f"http://{endpoint}/v1/models"],
            capture_output=True,
            text=True,
        )
        assert not plain.stdout.startswith("2"), plain

        status = _cli(venv_bin, repo_root, "status", "--json", timeout=300)
        assert status.returncode == 0, status.stdout + status.stderr
        # Ansible reads the inventory directory, and nothing in it but the inventory.
        assert "Unable to parse" not in status.stderr, status.stderr
        nodes = json.loads(status.stdout)["nodes"]
        assert sorted(n["host"] for n in nodes) == [
            "inferfleet-lab-node1",
            "inferfleet-lab-node2",
        ]
        for node in nodes:
            assert node["unit"] == "active" and node["healthy"], node
            assert node["model_version"] == "v1" and node["manifest_digest"].startswith("sha256:")
            assert node["engine_version"], node
            assert node["lb"] == "inferfleet-lab-lb: UP", node
        assert len({n["manifest_digest"] for n in nodes}) == 1

        time.sleep(10)  # past the lab's slow start (load_balancer_slowstart: 10s)
        verify = _cli(
            venv_bin, repo_root, "verify", "--json", "--count", "48", "--failover", timeout=900
        )
        report = json.loads(verify.stdout)
        assert verify.returncode == 0 and report["ok"], verify.stdout + verify.stderr
        assert report["load"]["sent"] == 48 and report["load"]["failed"] == 0
        # node2's engine stopped and started under load: no request failed, HAProxy took
        # it out once it stopped answering (3 failed checks, 2 s apart) and put it back
        # once it answered again, and it served afterwards.
        failover = report["failover"]
        assert failover["host"] == "inferfleet-lab-node2" and failover["sent"] > 0, failover
        assert failover["failed"] == 0, failover
        assert failover["unanswered_after_s"] is not None, failover
        assert failover["taken_out_after_s"] >= failover["unanswered_after_s"], failover
        assert failover["put_back_after_s"] >= failover["answers_again_after_s"], failover
        assert failover["served_after_back"] > 0, failover

        # Secrets hygiene after deploy, status and verify (issue "hardening"). The
        # S3 access key is an identifier, not a secret.
        secrets_file = inventory / "group_vars" / "all" / "secrets.yml"
        assert secrets_file.stat().st_mode & 0o777 == 0o600
        values = yaml.safe_load(secrets_file.read_text())
        public = {
            "inferfleet_lab_s3_access_key",
            "inferfleet_lab_tls_ca",
            "inferfleet_lab_tls_certificate",
        }
        # One line each (grep -F takes a pattern per line): a PEM key's base64 lines.
        secrets = [
            line
            for k, v in values.items()
            if k not in public
            for line in str(v).splitlines()
            if line.strip() and not line.startswith("-----")
        ]
        assert "inferfleet_lab_tls_key" in values
        runs = Path(os.environ.get("INFERFLEET_RUNS_DIR", repo_root / "runs"))
        assert secret_leaks(secrets, runs, started) == []
    finally:
        down = _cli(venv_bin, repo_root, "lab", "down", timeout=300)
    assert down.returncode == 0, down.stdout + down.stderr
    assert _labelled("container") == [] and _labelled("network") == []
    assert [g for g in GENERATED if (inventory / g).exists()] == []
