"""The product as an operator installs it, and the operator's path on the real lab.

The collection tarball and the wheel are built from this tree, then installed (the wheel
with its [lab] extra) into a fresh virtualenv and a fresh collections path in a folder
outside the checkout, with the source tree on no path. The installed CLI answers `--help`
and `plan`, then runs the lab from the inventory its wheel carries:
- `inferfleet lab up --no-deploy --models 2` starts SeaweedFS with two tiny models and the
  hosts; an operator's own playbook, written there, uses the collection's role and module
  by FQCN;
- `inferfleet lab up --tls --models 2` runs site.yml from the installed collection (three
  vLLM CPU engines, two of tiny-llama and one of tiny-coder, behind HAProxy routing by
  model, TLS at the edge); while it runs a second controller's deploy is refused by the
  fleet's lock; its last play asks each model for a completion over HTTPS;
- a second `inferfleet deploy`, through Mitogen's strategy, changes nothing;
- the curl lines it prints and the openai SDK (trusting the lab's CA) get completions of
  both models, /v1/models lists both, an unknown model is 404; without the CA the
  certificate does not verify, and plain HTTP gets no answer;
- `status`, `verify --failover` (per model: identical answers from its own weights, no
  request on another model's node; an engine stopped and started under load, no request
  failed), the secrets in no log, command line or world-readable file;
- `inferfleet lab up --tls --models 2 --nginx` adds Nginx beside HAProxy (the lab's CA
  issues a certificate for both): its curl lines get each model's greedy answer from its
  own weights (the same as HAProxy's; the engines' counters say each request reached its
  model's nodes only), /v1/models lists both, an unknown model is 404 naming them;
- `inferfleet rollout --model tiny-llama` rolls its two instances v1 -> v2 under load on
  both models through both load balancers: no request fails and tiny-coder's engine keeps
  its process (a model with one instance is not rolled: that would be its outage);
- `inferfleet lab down` leaves nothing: containers, networks, the inventory copy, the CA.
One lab run covers it all: each bring-up costs minutes of CI.
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import openai
import pytest
import yaml

from inferfleet.lab import fleet

pytestmark = pytest.mark.lab

LAB_LABEL = "inferfleet.lab=inferfleet-lab"  # what `inferfleet lab` labels its containers with
# Where a host keeps installed software and model weights: large, and written by no role
# that handles a secret.
SKIP_DIRS = ["venv", "wheelhouse", "models", "site-packages", "dist-packages", "__pycache__"]


def run(cmd: list, cwd: Path, env: dict | None = None, timeout: int = 900, rc: int = 0):
    done = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == rc, (
        f"{' '.join(map(str, cmd))} exited {done.returncode}, not {rc}:\n"
        f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    )
    return done


@pytest.fixture(scope="module")
def installed(tmp_path_factory, repo_root, venv_bin) -> dict:
    """Build both artefacts, install them away from the checkout; the operator's env."""
    work = tmp_path_factory.mktemp("operator")
    dist = work / "dist"
    run(
        [venv_bin / "ansible-galaxy", "collection", "build", "--output-path", dist, repo_root],
        cwd=repo_root,
    )
    run(
        [venv_bin / "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", dist, repo_root],
        cwd=work,
    )
    tarball = next(dist.glob("inferfleet-fleet-*.tar.gz"))
    wheel = next(dist.glob("inferfleet-*.whl"))
    base_python = getattr(sys, "_base_executable", None) or shutil.which("python3")
    run([base_python, "-m", "venv", work / "venv"], cwd=work)
    env = {
        "PATH": f"{work / 'venv' / 'bin'}{os.pathsep}/usr/local/bin:/usr/bin:/bin",
        "HOME": os.environ["HOME"],
        "LANG": "C.UTF-8",
        "ANSIBLE_COLLECTIONS_PATH": str(work / "collections"),
        "ANSIBLE_NOCOLOR": "1",
        "INFERFLEET_RUNS_DIR": str(work / "runs"),
        "XDG_STATE_HOME": str(work / "state"),
    }
    for key in ("PIP_FIND_LINKS", "PIP_CERT", "SSL_CERT_FILE", "DOCKER_HOST"):
        if key in os.environ:
            env[key] = os.environ[key]
    run([work / "venv" / "bin" / "pip", "install", "--quiet", f"{wheel}[lab,mitogen]"], cwd=work,
        env=env)
    run(
        [
            work / "venv" / "bin" / "ansible-galaxy",
            "collection",
            "install",
            "--offline",
            "--force",
            "-p",
            work / "collections",
            tarball,
        ],
        cwd=work,
        env=env,
    )
    return {
        "work": work,
        "env": env,
        "bin": work / "venv" / "bin",
        "wheel": wheel,
        "lab_inventory": work / "state" / "inferfleet" / "lab",
    }


def test_nothing_of_the_checkout_is_on_a_path(installed, repo_root):
    probe = (
        "import json, sys, inferfleet, ansible_collections.inferfleet.fleet as c; "
        "print(json.dumps({'sys_path': sys.path, 'cli': inferfleet.__file__, "
        "'collection': list(c.__path__)}))"
    )
    seen = json.loads(
        run(
            [installed["bin"] / "python", "-c", probe], cwd=installed["work"], env=installed["env"]
        ).stdout
    )
    assert seen["cli"].startswith(str(installed["work"] / "venv"))
    # the operator's collections path comes first (then the wheel's copy in site-packages)
    assert seen["collection"] == [
        str(installed["work"] / "collections" / "ansible_collections" / "inferfleet" / "fleet")
    ]
    assert [p for p in seen["sys_path"] if p.startswith(str(repo_root))] == []
    listed = run(
        [installed["bin"] / "ansible-galaxy", "collection", "list", "inferfleet.fleet"],
        cwd=installed["work"],
        env=installed["env"],
    ).stdout
    assert str(installed["work"] / "collections") in listed
    assert str(repo_root) not in listed


def test_the_cli_answers_help_and_plan(installed, repo_root):
    helped = run(
        [installed["bin"] / "inferfleet", "--help"], cwd=installed["work"], env=installed["env"]
    ).stdout
    for command in ("plan", "deploy", "status", "verify", "rollout", "rollback", "scale", "doctor"):
        assert command in helped
    config = repo_root / "tests" / "fixtures" / "configs" / "llama-3.1-8b.json"
    shutil.copy(config, installed["work"] / "config.json")
    planned = run(
        [
            installed["bin"] / "inferfleet",
            "plan",
            installed["work"] / "config.json",
            "--gpus-per-node",
            "1",
            "--gpu-memory-gib",
            "80",
            "--json",
        ],
        cwd=installed["work"],
        env=installed["env"],
    ).stdout
    assert json.loads(planned)["decision"] == "replicated"


def test_the_wheel_carries_the_lab_inventory_as_committed(installed, repo_root):
    tracked = run(["git", "ls-files", "inventories/lab"], cwd=repo_root).stdout.split()
    with zipfile.ZipFile(installed["wheel"]) as wheel:
        shipped = [n for n in wheel.namelist() if n.startswith("inferfleet/lab/inventory/")]
    assert sorted(
        n.replace("inferfleet/lab/inventory/", "inventories/lab/") for n in shipped
    ) == sorted(tracked)


OPERATOR_PLAYBOOK = """\
- name: Weights on the node with the collection's role, then its module by FQCN
  hosts: {node}
  gather_facts: false
  roles:
    - role: inferfleet.fleet.model_sync
  tasks:
    - name: The same version again through the module itself changes nothing
      inferfleet.fleet.model_sync:
        name: "{{{{ inferfleet_model_name }}}}"
        version: "{{{{ inferfleet_model_version }}}}"
        s3_endpoint: "{{{{ model_sync_s3_endpoint }}}}"
        s3_bucket: "{{{{ model_sync_s3_bucket }}}}"
        s3_prefix: "{{{{ model_sync_s3_prefix }}}}"
        access_key: "{{{{ model_sync_s3_access_key }}}}"
        secret_key: "{{{{ model_sync_s3_secret_key }}}}"
        cache_root: /var/lib/inferfleet/models
        min_free_mb: 256
      register: again

    - name: Report
      ansible.builtin.debug:
        msg: "{{{{ {{'path': model_sync_model_path, 'digest': model_sync_manifest_digest,
                  'again': again.changed}} | to_json }}}}"
"""


def operators_playbook(installed: dict, inventory: Path, node: str) -> dict:
    """Run the operator's playbook on `node`; return its Report."""
    playbook = installed["work"] / "weights.yml"
    playbook.write_text(OPERATOR_PLAYBOOK.format(node=node))
    env = dict(installed["env"], ANSIBLE_STDOUT_CALLBACK="json")
    played = run(
        [installed["bin"] / "ansible-playbook", "-i", inventory, playbook],
        cwd=installed["work"],
        env=env,
    )
    results = json.loads(played.stdout)
    report = next(
        t["hosts"][node]["msg"]
        for t in results["plays"][0]["tasks"]
        if t["task"]["name"] == "Report"
    )
    return json.loads(report) if isinstance(report, str) else report


def labelled(kind: str) -> list[str]:
    return subprocess.run(
        ["docker", kind, "ls", "-q", "--filter", f"label={LAB_LABEL}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()


def _exec_ok(host: str, script: str) -> bool:
    return (
        subprocess.run(
            ["docker", "exec", host, "bash", "-c", script], capture_output=True
        ).returncode
        == 0
    )


def _exec(host: str, script: str, stdin: str = "") -> str:
    done = subprocess.run(
        ["docker", "exec", "-i", host, "bash", "-c", script],
        input=stdin,
        capture_output=True,
        text=True,
    )
    assert done.returncode in (0, 123), done.stderr  # 123: xargs ran on nothing found
    return done.stdout


def secret_leaks(secrets: list[str], hosts: list[str], runs: Path, since: float) -> list[str]:
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
    for host in hosts:
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


def _lab_up_tls_with_a_second_controller(installed: dict, inventory: Path, balancer: str):
    """`lab up --tls`; while its site.yml holds the fleet's lock, `inferfleet deploy` from
    another controller (its own home and runs) is refused, naming it, and runs nothing on
    the fleet but the lock's tasks. Returns lab up's stdout."""
    cli, work, env = installed["bin"] / "inferfleet", installed["work"], installed["env"]
    up_run = subprocess.Popen(
        [cli, "lab", "up", "--tls", "--models", "2"],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    for _ in range(600):
        if up_run.poll() is not None or _exec_ok(
            balancer, "test -f /var/lib/inferfleet/lock/holder.json"
        ):
            break
        time.sleep(1)
    assert up_run.poll() is None, "lab up ended before its site.yml held the lock"
    home = work / "second-controller"
    second_env = dict(
        env,
        HOME=str(home),
        INFERFLEET_RUNS_DIR=str(home / "runs"),
        XDG_STATE_HOME=str(home / "state"),
    )
    second = run([cli, "deploy", "-i", inventory], cwd=work, env=second_env, timeout=300, rc=6)
    words = " ".join(second.stdout.split())
    assert "running `inferfleet lab up` since" in words and "wait until it ends" in words
    events = [
        json.loads(p.read_text()) for p in (home / "runs").glob("*/artifacts/*/job_events/*.json")
    ]
    ran = {e["event_data"]["task"] for e in events if e["event"] == "runner_on_ok"}
    assert ran and all(task.startswith("Lock | ") for task in ran), ran
    out, err = up_run.communicate(timeout=1500)
    assert up_run.returncode == 0, out[-3000:] + err[-2000:]
    assert not _exec_ok(balancer, "test -e /var/lib/inferfleet/lock")  # released
    return out


def _deploy_again_with_mitogen(cli: Path, work: Path, env: dict) -> None:
    """A second deploy, through Mitogen's strategy (the [mitogen] extra), changes nothing."""
    again = run([cli, "deploy"], cwd=work, env=env | {"INFERFLEET_MITOGEN": "1"}).stdout
    record = json.loads(Path(again.rsplit("record: ", 1)[1].split()[0]).read_text())
    assert (record["command"], record["mitogen"], record["rc"]) == ("deploy", True, 0), record
    assert sum(record["stats"]["changed"].values()) == 0, record["stats"]
    assert len(record["stats"]["ok"]) == 4, record["stats"]  # three engine nodes, HAProxy


def _clients(up: str, inventory: Path, balancer: str, work: Path, env: dict) -> None:
    """The curl lines lab up printed (one per model), and the openai SDK as the README
    shows it, trusting the lab's CA, get completions of both models from their own weights;
    /v1/models lists both, an unknown model is 404; without the CA, or over plain HTTP,
    nothing answers."""
    ca = fleet.ca_file(inventory)
    curls = [line for line in up.splitlines() if line.startswith("curl -s ")]
    assert ['"model": "tiny-llama"' in curls[0], '"model": "tiny-coder"' in curls[1]] == [1, 1]
    texts = []
    for curl in curls:
        assert curl.startswith(f"curl -s --cacert {ca} https://"), curl
        assert "Authorization: Bearer sk-lab-" in curl
        answer = json.loads(run(["bash", "-c", curl], cwd=work, env=env, timeout=120).stdout)
        assert answer["object"] == "text_completion" and "text" in answer["choices"][0], answer
        texts.append(answer["choices"][0]["text"])
    assert texts[0] != texts[1], texts  # other weights, other greedy answers

    values = yaml.safe_load((inventory / "group_vars" / "all" / "secrets.yml").read_text())
    address = yaml.safe_load((inventory / "host_vars" / f"{balancer}.yml").read_text())
    endpoint = f"{address['inferfleet_address']}:8080"
    client = openai.OpenAI(
        base_url=f"https://{endpoint}/v1",
        api_key=values["inferfleet_lab_api_key"],
        http_client=openai.DefaultHttpxClient(verify=ssl.create_default_context(cafile=ca)),
    )
    answer = client.completions.create(
        model="tiny-llama", prompt="Hello, fleet", max_tokens=8, temperature=0
    )
    assert answer.choices[0].text, answer
    assert sorted(m.id for m in client.models.list()) == ["tiny-coder", "tiny-llama"]
    with pytest.raises(openai.NotFoundError) as unknown:
        client.completions.create(model="tiny-gpt", prompt="Hello", max_tokens=4)
    assert "served: tiny-coder, tiny-llama" in str(unknown.value), unknown.value
    with pytest.raises(openai.APIConnectionError):
        openai.OpenAI(base_url=f"https://{endpoint}/v1", api_key="x", max_retries=0).models.list()
    plain = subprocess.run(
        ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", f"http://{endpoint}/v1/models"],
        capture_output=True,
        text=True,
    )
    assert not plain.stdout.startswith("2"), plain


def _status_and_failover(cli: Path, work: Path, env: dict, nodes: list, balancer: str) -> None:
    status = run([cli, "status", "--json"], cwd=work, env=env, timeout=300)
    # Ansible reads the inventory directory, and nothing in it but the inventory.
    assert "Unable to parse" not in status.stderr, status.stderr
    seen = json.loads(status.stdout)["nodes"]
    # Grouped by model: tiny-coder's node first.
    assert [(n["model"], n["host"]) for n in seen] == [
        ("tiny-coder", nodes[2]), ("tiny-llama", nodes[0]), ("tiny-llama", nodes[1])]
    for node in seen:
        assert node["unit"] == "active" and node["healthy"], node
        assert node["model_version"] == "v1" and node["manifest_digest"].startswith("sha256:")
        assert node["engine_version"], node
        assert node["lb"] == f"{balancer}: UP", node
    digests = [{n["manifest_digest"] for n in seen if n["model"] == m} for m in ("tiny-llama",
                                                                               "tiny-coder")]
    assert [len(d) for d in digests] == [1, 1] and digests[0] != digests[1], digests
    # The healthy lab (two models, TLS, real vLLM and HAProxy): nothing to report.
    doctor = subprocess.run([cli, "doctor", "--json"], cwd=work, env=env, capture_output=True,
                            text=True, timeout=300)
    assert (doctor.returncode, json.loads(doctor.stdout)["findings"]) == (0, []), doctor

    time.sleep(10)  # past the lab's slow start (load_balancer_slowstart: 10s)
    verify = subprocess.run(
        [cli, "verify", "--json", "--count", "48", "--failover", "--failover-node", nodes[1]],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    report = json.loads(verify.stdout)
    assert verify.returncode == 0 and report["ok"], verify.stdout + verify.stderr
    assert report["load"]["sent"] == 48 and report["load"]["failed"] == 0
    assert [report["loads"][m]["failed"] for m in ("tiny-llama", "tiny-coder")] == [0, 0]
    # Per model: its instances and the load balancer give one greedy answer, and its load
    # reached its own instances only (each engine's request counter says so).
    passed = {c["check"] for c in report["checks"] if c["passed"]}
    for model in ("tiny-llama", "tiny-coder"):
        assert f"identical greedy answers: {model}" in passed, report["checks"]
        assert f"no request to another model's instances: {model}" in passed, report["checks"]
    # node2's engine (a tiny-llama instance) stopped and started under load: no request
    # failed, HAProxy took it out once it stopped answering (3 failed checks, 2 s apart)
    # and put it back once it answered again, and it served afterwards.
    failover = report["failover"]
    assert failover["host"] == nodes[1] and failover["sent"] > 0, failover
    assert failover["failed"] == 0, failover
    assert failover["unanswered_after_s"] is not None, failover
    assert failover["taken_out_after_s"] >= failover["unanswered_after_s"], failover
    assert failover["put_back_after_s"] >= failover["answers_again_after_s"], failover
    assert failover["served_after_back"] > 0, failover


def _main_pid(host: str) -> str:
    return _exec(host, "systemctl show -p MainPID --value inferfleet-engine").strip()


def _base(inventory: Path, host: str, port: int = 8080, scheme: str = "https") -> str:
    address = yaml.safe_load((inventory / "host_vars" / f"{host}.yml").read_text())
    return f"{scheme}://{address['inferfleet_address']}:{port}"


def _nginx_beside_haproxy(
    cli: Path, work: Path, env: dict, inventory: Path, nodes: list, balancer: str
) -> str:
    """`lab up --tls --models 2 --nginx` grows the lab by Nginx: each model's greedy answer
    through it is HAProxy's, and came from that model's nodes only (the engines' request
    counters); the openai SDK lists both models there and gets 404 naming them for an
    unknown one. Returns Nginx's host."""
    from inferfleet import verify as v

    up = run([cli, "lab", "up", "--tls", "--models", "2", "--nginx"], cwd=work, env=env,
             timeout=1500).stdout
    balancers = fleet.inventory_hosts(inventory)["loadbalancers"]
    assert balancers == [balancer, fleet.NGINX_HOST], balancers
    values = yaml.safe_load((inventory / "group_vars" / "all" / "secrets.yml").read_text())
    key, engine_key = values["inferfleet_lab_api_key"], values["inferfleet_lab_engine_key"]
    ca = fleet.ca_file(inventory)  # issued again, for both load balancers
    v.trust(ca.read_text())
    haproxy, nginx = (_base(inventory, lb) for lb in balancers)
    curls = [line for line in up.splitlines() if line.startswith("curl -s ")]
    assert [nginx in c for c in curls] == [False, False, True, True], curls

    def served() -> dict[str, float]:
        return {
            h: v.served_requests(
                v.get(f"{_base(inventory, h, 8000, 'http')}/metrics", engine_key)[1]
            )
            for h in nodes
        }

    expected = {m: v.complete(haproxy, m, key).text for m in ("tiny-llama", "tiny-coder")}
    before = served()
    for model, count in (("tiny-llama", 4), ("tiny-coder", 2)):
        answers = [v.complete(nginx, model, key) for _ in range(count)]
        assert all(a.ok for a in answers), [(a.status, a.error) for a in answers]
        assert {a.text for a in answers} == {expected[model]}, (model, answers)
    after = served()
    # nodes[2] serves tiny-coder alone, nodes[0] and nodes[1] tiny-llama.
    assert after[nodes[2]] - before[nodes[2]] == 2, (before, after)
    assert sum(after[h] - before[h] for h in nodes[:2]) == 4, (before, after)

    client = openai.OpenAI(
        base_url=f"{nginx}/v1",
        api_key=key,
        http_client=openai.DefaultHttpxClient(verify=ssl.create_default_context(cafile=ca)),
    )
    assert sorted(m.id for m in client.models.list()) == ["tiny-coder", "tiny-llama"]
    with pytest.raises(openai.NotFoundError) as unknown:
        client.completions.create(model="tiny-gpt", prompt="Hello", max_tokens=4)
    assert "served: tiny-coder, tiny-llama" in str(unknown.value), unknown.value
    return fleet.NGINX_HOST


def _one_model_rolls_alone(
    cli: Path, work: Path, env: dict, inventory: Path, nodes: list, balancers: list
) -> None:
    """tiny-llama (two instances) v1 -> v2 under load on both models through every load
    balancer: no failed request, tiny-coder's engine untouched (the same process),
    tiny-llama's nodes on v2 with other answers."""
    from inferfleet import verify as v

    run([cli, "lab", "publish", "v2"], cwd=work, env=env)
    values = yaml.safe_load((inventory / "group_vars" / "all" / "secrets.yml").read_text())
    bases = [_base(inventory, lb) for lb in balancers]
    base = bases[0]
    v.trust(fleet.ca_file(inventory).read_text())
    key = values["inferfleet_lab_api_key"]
    before = v.complete(base, "tiny-llama", key).text
    pids = {h: _main_pid(h) for h in nodes}
    with (
        v.LoadLoop(bases, "tiny-llama", key, workers=1, pause=0.3) as llama,
        v.LoadLoop(bases, "tiny-coder", key, workers=1, pause=0.3) as coder,
    ):
        rolled = run(
            [cli, "rollout", "--model", "tiny-llama", "--version", "v2"],
            cwd=work,
            env=env,
            timeout=1200,
        )
    for model, load in (("tiny-llama", llama), ("tiny-coder", coder)):
        assert len(load.calls) >= 2 * len(bases), (model, len(load.calls))  # through each
        assert not load.failed(), (model, len(load.calls), load.failed()[:3])
    assert _main_pid(nodes[2]) == pids[nodes[2]], rolled.stdout
    assert [_main_pid(h) != pids[h] for h in nodes[:2]] == [True, True], rolled.stdout
    seen = json.loads(run([cli, "status", "--json"], cwd=work, env=env, timeout=300).stdout)
    versions = {n["host"]: n["model_version"] for n in seen["nodes"]}
    assert versions == {nodes[0]: "v2", nodes[1]: "v2", nodes[2]: "v1"}, versions
    after = {v.complete(b, "tiny-llama", key).text for b in bases}
    assert len(after) == 1 and before not in after, (before, after)


def _no_secret_leaks(inventory: Path, hosts: list, runs: Path, since: float) -> None:
    """After deploy, status and verify; the S3 access key is an identifier, not a secret."""
    secrets_file = inventory / "group_vars" / "all" / "secrets.yml"
    assert secrets_file.stat().st_mode & 0o777 == 0o600
    values = yaml.safe_load(secrets_file.read_text())
    public = {
        "inferfleet_lab_s3_access_key",
        "inferfleet_lab_tls_ca",
        "inferfleet_lab_tls_certificate",
    }
    assert "inferfleet_lab_tls_key" in values
    # One line each (grep -F takes a pattern per line): a PEM key's base64 lines.
    secrets = [
        line
        for k, v in values.items()
        if k not in public
        for line in str(v).splitlines()
        if line.strip() and not line.startswith("-----")
    ]
    assert secret_leaks(secrets, hosts, runs, since) == []


def test_the_installed_cli_runs_the_lab(installed, node_image, wheelhouse, lab_names):
    """node_image and wheelhouse: built under the suite's locks, found by `lab up`."""
    cli, work, env = installed["bin"] / "inferfleet", installed["work"], installed["env"]
    inventory = installed["lab_inventory"]
    started = time.time()
    try:
        run([cli, "lab", "up", "--no-deploy", "--models", "2"], cwd=work, env=env)
        groups = fleet.inventory_hosts(inventory)
        nodes = groups["inference"]
        assert nodes[2:] == [fleet.SECOND_MODEL["host"]], nodes
        (balancer,) = groups["loadbalancers"]
        report = operators_playbook(installed, inventory, nodes[0])
        assert report["path"] == "/var/lib/inferfleet/models/tiny-llama/current"
        assert report["digest"].startswith("sha256:")
        assert report["again"] is False

        # the life-cycle playbooks are collection playbooks, from the operator's collections
        checked = run(
            [
                installed["bin"] / "ansible-playbook",
                "-i",
                inventory,
                "inferfleet.fleet.site",
                "--syntax-check",
            ],
            cwd=work,
            env=env,
        ).stdout
        assert f"playbook: {work / 'collections'}" in checked

        up = _lab_up_tls_with_a_second_controller(installed, inventory, balancer)
        (record,) = [json.loads(p.read_text()) for p in (work / "runs").glob("*/record.json")]
        assert (record["command"], record["playbook"], record["rc"]) == ("lab up", "site.yml", 0)
        assert record["inventory"] == str(inventory)
        assert record["stats"]["ok"][balancer] > 0
        _clients(up, inventory, balancer, work, env)
        _deploy_again_with_mitogen(cli, work, env)

        status = run([cli, "lab", "status"], cwd=work, env=env).stdout
        assert all(host in status for host in [*nodes, balancer]), status
        _status_and_failover(cli, work, env, nodes, balancer)
        nginx = _nginx_beside_haproxy(cli, work, env, inventory, nodes, balancer)
        _one_model_rolls_alone(cli, work, env, inventory, nodes, [balancer, nginx])
        _no_secret_leaks(inventory, [*nodes, balancer, nginx], work / "runs", started)
    finally:
        down = subprocess.run(
            [cli, "lab", "down"], cwd=work, env=env, capture_output=True, text=True, timeout=300
        )
    assert down.returncode == 0, down.stdout + down.stderr
    assert labelled("container") == [] and labelled("network") == []
    assert not inventory.exists() and not fleet.ca_file(inventory).exists()
