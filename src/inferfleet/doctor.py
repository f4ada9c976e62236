"""`inferfleet doctor`'s judgement, as plain functions of what playbooks/doctor.yml
reports (its set_stats data, keyed by host) and of each instance's greedy answer: one
finding per problem, with the hosts, the evidence, the likely cause and the fix.

The cases (docs/troubleshooting.md): an engine that cannot start for memory; instances
of one model that differ (answer, weights, engine, settings); a backend a load balancer
holds down; requests queueing; a pipeline link slower than the pipeline needs; and what
could not be read at all.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
from collections import Counter
from dataclasses import asdict, dataclass, field

from ansible_collections.inferfleet.fleet.plugins.filter.fabric_preflight import link_problems
from ansible_collections.inferfleet.fleet.plugins.module_utils.engine_args import MANAGED_FLAGS
from ansible_collections.inferfleet.fleet.plugins.module_utils.gpu import (
    GpuFactsError,
    parse_query_csv,
)

from inferfleet.verify import metric_sums


@dataclass
class Finding:
    case: str  # memory, answers, backend, queue, link, unreachable
    hosts: list[str]
    symptom: str
    evidence: list[str] = field(default_factory=list)
    cause: str = ""
    fix: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


# --- an engine that cannot start for lack of memory -----------------------------------

# The lines vLLM (and PyTorch, and the kernel through systemd) write when memory runs
# out, each with what it means and which setting to change.
MEMORY_LINES = [
    (
        # vLLM's CPU worker (0.32), before it allocates anything
        re.compile(r"on kv cache allocation is less than requested memory for kv", re.I),
        "the KV cache space asked for is more than the node's available memory",
        "lower inference_engine_cpu_kvcache_space (VLLM_CPU_KVCACHE_SPACE, GiB) below what "
        "the node has free after the weights, or free the memory other processes hold",
    ),
    (
        re.compile(r"KV cache is needed, which is larger than the available KV cache memory"
                   r"|estimated maximum model length", re.I),
        "the KV cache space left after the weights cannot hold one sequence of max_model_len",
        "lower inference_engine_max_model_len, or give the KV cache more memory "
        "(inference_engine_gpu_memory_utilization on GPUs, inference_engine_cpu_kvcache_space "
        "on CPUs)",
    ),
    (
        re.compile(r"less than desired [GC]PU memory utilization"
                   r"|No available memory for the cache blocks", re.I),
        "the GPU's memory is held by something else (another process, a leftover engine) "
        "or gpu_memory_utilization asks for more than is free",
        "find the other process with `nvidia-smi` on the node and stop it, or lower "
        "inference_engine_gpu_memory_utilization",
    ),
    (
        re.compile(r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory", re.I),
        "the weights and activations do not fit the GPUs at this parallelism and batch size",
        "check `inferfleet plan` for this model; raise inference_engine_tensor_parallel_size "
        "(or form a pipeline), or lower inference_engine_max_num_seqs / max_model_len",
    ),
    (
        re.compile(r"can't allocate memory|Cannot allocate memory|not enough memory"
                   r"|MemoryError|out of memory", re.I),
        "the node's memory cannot hold the weights and the KV cache space asked for",
        "lower inference_engine_cpu_kvcache_space (CPU) or raise inference_engine_memory_limit "
        "where one is set; `inferfleet plan` gives the per-node figure",
    ),
]
# Settings a memory finding shows: how much the engine asked for.
MEMORY_FLAGS = ("--max-model-len", "--max-num-seqs", "--gpu-memory-utilization",
                "--tensor-parallel-size", "--pipeline-parallel-size", "--dtype",
                "--quantization", "--kv-cache-dtype")


def exec_start(unit: str) -> list[str]:
    """The words of a unit file's ExecStart= line (as engine_args.systemd_quote wrote it)."""
    for line in unit.splitlines():
        if line.startswith("ExecStart="):
            words = shlex.split(line[len("ExecStart="):])
            return [w.replace("%%", "%").replace("$$", "$") for w in words]
    return []


def flags(args: list[str]) -> dict[str, str]:
    """`--flag value` and bare `--flag` pairs of a command line ("" for a bare flag)."""
    out: dict[str, str] = {}
    for i, word in enumerate(args):
        if word.startswith("-") and not word.lstrip("-").isdigit():
            value = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else ""
            key, _, inline = word.partition("=")
            out[key] = inline or value
    return out


def environment(text: str) -> dict[str, str]:
    """KEY=VALUE lines of an environment file (quotes as systemd and Docker read them)."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and not line.startswith("#"):
            out[key.strip()] = value.strip().strip('"')
    return out


# systemd's line for each start of the unit (in its journal, beside the engine's own)
STARTED = re.compile(r"^Started \S+\.service\b")


def recent(lines: list[str]) -> list[str]:
    """The journal lines of the unit's last two starts: the attempt now and the one before
    it (which a start in progress follows after a failure), not older history."""
    starts = [i for i, line in enumerate(lines) if STARTED.match(line)]
    return lines[starts[-2] if len(starts) > 1 else 0:]


GIB = 1024**3


def node_memory(text: str) -> str | None:
    """The node's memory and the model folder's size (the role's "memory" read) as a line."""
    kb = dict(re.findall(r"^(MemTotal|MemAvailable):\s+(\d+)", text, re.M))
    model = re.search(r"^model: (\d+)", text, re.M)
    if "MemTotal" not in kb:
        return None
    line = (f"node memory: {int(kb.get('MemAvailable', 0)) / 1024**2:.1f} GiB available of "
            f"{int(kb['MemTotal']) / 1024**2:.1f} GiB")
    if model:
        size = int(model.group(1))
        line += "; the model's folder " + (
            f"{size / GIB:.2f} GiB" if size >= GIB else f"{size / 1024**2:.0f} MiB")
    return line


def gpu_memory(text: str) -> list[str]:
    """Each GPU's memory and the processes other than the engine's that hold it, from the
    role's "gpus" read (nvidia-smi's GPUs, their compute processes, the engine's pids)."""
    gpus, apps, engine = (text.split("---") + ["", ""])[:3]
    try:
        rows = parse_query_csv(gpus)
        held = parse_query_csv(apps, required="pid")
    except GpuFactsError as err:
        return [f"nvidia-smi: {err}"]
    lines = []
    for row in rows:
        others = [f"pid {a['pid']} {a['process_name']} ({a['used_gpu_memory']} MiB)"
                  for a in held if a["gpu_uuid"] == row["uuid"] and a["pid"] not in engine.split()]
        lines.append(f"GPU {row['index']}: {row['memory.used']} of {row['memory.total']} MiB "
                     "used; " + ("held by other processes: " + ", ".join(others) if others
                                 else "no process but the engine's holds it"))
    return lines


def plan_line(plan: dict) -> str | None:
    """The capacity plan's per-GPU figures for the inventory's model and hardware."""
    if not plan:
        return None
    if plan.get("error"):
        return f"capacity plan: none ({plan['error']})"
    gpu, hw = plan.get("per_gpu") or {}, plan.get("hardware") or {}
    if not gpu:
        return (f"capacity plan ({plan.get('decision')}): nothing fits {hw.get('gpus_per_node')} "
                f"GPU(s) x {hw.get('gpu_memory_gib')} GiB per node; short by "
                f"{plan.get('shortfall_gib')} GiB per GPU")
    return (f"capacity plan for {hw.get('gpus_per_node')} GPU(s) x {hw.get('gpu_memory_gib')} "
            f"GiB per node: TP {plan.get('tensor_parallel_size')} x PP "
            f"{plan.get('pipeline_parallel_size')}, per GPU weights {gpu.get('weights_gib')} GiB "
            f"+ overhead {gpu.get('overhead_gib')} GiB + KV cache {gpu.get('kv_cache_gib')} GiB "
            f"of {gpu.get('usable_gib')} GiB usable")


def memory(nodes: dict, evidence: dict, plan: dict | None = None) -> list[Finding]:
    """An engine that fails to start (not healthy, and not stopped cleanly) whose last
    starts' log, or systemd, says memory ran out; with the node's memory, its GPUs' and
    who holds them, and the capacity plan's per-GPU figures where the inventory has one."""
    found = []
    for host, node in sorted(nodes.items()):
        ev = evidence.get(host) or {}
        stopped = node.get("unit") == "inactive" and ev.get("result") == "success"
        if node.get("healthy") or stopped:
            continue
        lines = recent([str(x) for x in ev.get("log") or []])
        hit = None
        for line in reversed(lines):  # the last attempt's error
            for pattern, cause, fix in MEMORY_LINES:
                if pattern.search(line):
                    hit = (line.strip(), cause, fix)
                    break
            if hit:
                break
        if hit is None and ev.get("result") == "oom-kill":
            hit = ("systemd: the unit's last run ended in oom-kill (the kernel's OOM killer)",
                   *MEMORY_LINES[-1][1:])
        if hit is None:
            continue
        line, cause, fix = hit
        f = flags(exec_start(ev.get("unit") or ""))
        settings = [f"{k} {f[k]}" for k in MEMORY_FLAGS if k in f]
        kv = environment(ev.get("environment") or "").get("VLLM_CPU_KVCACHE_SPACE")
        if kv:
            settings.append(f"VLLM_CPU_KVCACHE_SPACE={kv} GiB")
        figures = [node_memory(ev.get("memory") or ""), *gpu_memory(ev.get("gpus") or ""),
                   plan_line(plan or {})]
        found.append(Finding(
            "memory", [host],
            f"{host}: the engine does not start (unit {node.get('unit', '?')}, "
            f"{ev.get('restarts', 0)} restarts): memory",
            [f"log: {line}", "runs with: " + (", ".join(settings) or "vLLM's defaults")]
            + [f for f in figures if f],
            cause, fix + "; then `inferfleet deploy`",
        ))
    return found


# --- instances of one model that differ -----------------------------------------------

# Flags that differ between nodes by design (addresses, ranks), only size capacity, or
# lay an instance out (its parallelism, how its processes run): one model may run as a
# pipeline beside single-node instances, with the same answers.
NODE_FLAGS = {"--host", "--port", "--master-addr", "--master-port", "--node-rank", "--nnodes",
              "--headless", "--shutdown-timeout", "--max-num-seqs", "--gpu-memory-utilization",
              "--device-memory-utilization", "--api-key", "--pipeline-parallel-size",
              "--tensor-parallel-size", "--data-parallel-size", "--distributed-executor-backend",
              "--enforce-eager"}
NODE_ENV = {"VLLM_HOST_IP", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "RAY_ADDRESS",
            "VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND", "INFERFLEET_MODEL_REVISION",
            "VLLM_ENABLE_V1_MULTIPROCESSING", "OMP_NUM_THREADS"}
# Nor is any NCCL_* variable compared: a group's transport (inference_engine_nccl_env).


def _differ(what: str, values: dict[str, str], lines: list[str], odd: set[str],
            wanted: dict[str, str] | None = None) -> None:
    """Where the hosts' values differ: the odd ones out named in `lines` and added to
    `odd`. Those off what their own inventory renders (`wanted`, per host) are the odd
    ones; where every host runs what its inventory says, those off a value most hosts
    share; with neither, every host's value."""
    if len(set(values.values())) < 2:
        return
    wanted = wanted or {}
    drifted = sorted(h for h, value in values.items() if h in wanted and value != wanted[h])
    common, count = Counter(values.values()).most_common(1)[0]
    if drifted and len(drifted) < len(values):
        rest = sorted({repr(values[h]) for h in values if h not in drifted})
        lines.append(f"{what}: " + ", ".join(f"{h} {values[h]!r} (its inventory says "
                                             f"{wanted[h]!r})" for h in drifted)
                     + f"; the others {' or '.join(rest)}")
        off = drifted
    elif count * 2 > len(values):
        off = sorted(h for h, value in values.items() if value != common)
        lines.append(f"{what}: " + ", ".join(f"{h} {values[h]!r}" for h in off)
                     + f"; the others {common!r}")
    else:
        off = sorted(values)
        lines.append(f"{what}: " + ", ".join(f"{h} {values[h]!r}" for h in off))
    odd.update(off)


def answers(nodes: dict, evidence: dict, replies: dict) -> list[Finding]:
    """Per model, its healthy instances (rank 0s) compared: the greedy answer, then what
    makes it: the weights' digest, the model version, vLLM's version, the command line and
    the environment. One finding per model that differs, naming the odd ones out (an
    engine that does not answer is another finding's)."""
    by_model: dict[str, list[str]] = {}
    for host, node in sorted(nodes.items()):
        if int(node["instance"]["rank"]) == 0 and node.get("healthy"):
            by_model.setdefault(str(node.get("model", "")), []).append(host)
    found = []
    for model, hosts in by_model.items():
        if len(hosts) < 2:
            continue
        lines: list[str] = []
        odd: set[str] = set()
        got = {h: replies[h] for h in hosts if replies.get(h) is not None}
        if len(got) > 1:
            _differ("greedy answer", got, lines, odd)
        # What each host's inventory renders (playbooks/doctor.yml), where it could.
        inv = {h: (evidence.get(h) or {}).get("inventory") or {} for h in hosts}
        _differ("weights (manifest digest)",
                {h: str(nodes[h].get("manifest_digest", "")) for h in hosts}, lines, odd)
        _differ("model version", {h: str(nodes[h].get("model_version", "")) for h in hosts},
                lines, odd, {h: str(inv[h]["model_version"]) for h in hosts
                             if inv[h].get("model_version")})
        _differ("vLLM", {h: str(nodes[h].get("engine_version", "")) for h in hosts}, lines, odd)
        args = {h: flags(exec_start((evidence.get(h) or {}).get("unit") or "")) for h in hosts}
        want_args = {h: flags([str(a) for a in inv[h]["args"]]) for h in hosts
                     if inv[h].get("args")}
        for flag in sorted({k for a in args.values() for k in a} - NODE_FLAGS):
            variable = MANAGED_FLAGS.get(flag, "inference_engine_extra_args")
            _differ(f"{flag} ({variable})", {h: args[h].get(flag, "(unset)") for h in hosts},
                    lines, odd, {h: a.get(flag, "(unset)") for h, a in want_args.items()})
        env = {h: environment((evidence.get(h) or {}).get("environment") or "") for h in hosts}
        want_env = {h: {str(k): str(v) for k, v in inv[h]["env"].items()} for h in hosts
                    if isinstance(inv[h].get("env"), dict)}
        for name in sorted({k for e in env.values() for k in e if not k.startswith("NCCL_")}
                           - NODE_ENV):
            _differ(f"environment {name} (inference_engine_extra_env)",
                    {h: env[h].get(name, "(unset)") for h in hosts}, lines, odd,
                    {h: e.get(name, "(unset)") for h, e in want_env.items()})
        if not lines:
            continue
        found.append(Finding(
            "answers", sorted(odd),
            f"instances of {model or 'the model'} differ: {', '.join(sorted(odd))}"
            + (f" against {len(hosts) - len(odd)} other(s)" if len(odd) < len(hosts) else ""),
            lines,
            "a node on another model version, engine or setting (seed, sampling defaults, "
            "dtype, quantization) than the rest of its model's instances",
            "make the inventory say what every instance of the model runs (host_vars, "
            "group_vars), then `inferfleet rollout" + (f" --model {model}" if model else "")
            + "`: it puts the inventory's version and settings back instance by instance (a "
            "deploy never restarts a serving engine); `--version V` for another version",
        ))
    return found


# --- a backend a load balancer holds down ---------------------------------------------

def _port(addr: str) -> str:
    return addr.rsplit(":", 1)[-1]


def _covers(ports: str, port: int) -> bool:
    """Whether an nftables dport expression (`8000`, `8000-8010`, `{ 22, 32768-60999 }`)
    takes `port`."""
    for item in ports.strip("{} ").split(","):
        low, _, high = item.strip().partition("-")
        if low.isdigit() and int(low) <= port <= int(high if high.isdigit() else low):
            return True
    return False


def _port_rules(rules: str, port: str) -> list[str]:
    """The lines of a firewall table (`nft list table`) that speak of `port`, in order."""
    return [line.strip() for line in rules.splitlines()
            if (m := re.search(r"dport (\{[^}]*\}|\S+)", line)) and port.isdigit()
            and _covers(m.group(1), int(port))]


def _accepted(lines: list[str], source: str) -> bool:
    """Whether the first of these rules that matches `source` accepts it (nftables stops
    at the first verdict; none matching: the table's policy, drop)."""
    try:
        addr = ipaddress.ip_address(source)
    except ValueError:
        return True  # no address to judge by
    for line in lines:
        text = line.split(' comment "')[0]
        verdict = re.search(r"\b(accept|drop|reject)\b", text)
        if not verdict:
            continue
        m = re.search(r"saddr (\{[^}]*\}|\S+)", text)
        nets = m.group(1).strip("{} ").split(",") if m else ["0.0.0.0/0", "::/0"]
        for net in nets:
            try:
                if addr in ipaddress.ip_network(net.strip(), strict=False):
                    return verdict.group(1) == "accept"
            except (ValueError, TypeError):
                continue
    return False


def backends(nodes: dict, evidence: dict, balancers: dict) -> list[Finding]:
    """Each HAProxy server that is DOWN: HAProxy's last check, the same probe repeated from
    the load balancer, the engine's own /health and unit, and the firewall on its node."""
    found = []
    for lb, seen in sorted(balancers.items()):
        for server in seen.get("servers") or []:
            status = str(server.get("status", ""))
            if not status.startswith("DOWN"):
                continue
            host, addr = server["name"], str(server.get("addr", ""))
            node, ev = nodes.get(host) or {}, evidence.get(host) or {}
            probe = int((seen.get("probe_status") or {}).get(host, -1))
            route = str((seen.get("route") or {}).get(host, ""))
            source = (re.search(r"src (\S+)", route) or [None, ""])[1]
            lines = [
                f"{lb}: HAProxy has {host} {status}, last check {server.get('check_status') or '?'}"
                + (f" ({server['last_chk']})" if server.get("last_chk") else ""),
                f"{lb} -> {addr}{' from ' + source if source else ''}: "
                + (f"HTTP {probe}" if probe > 0 else
                   f"no answer ({(seen.get('probe_message') or {}).get(host, '')})"),
                f"{host} itself: unit {node.get('unit', '?')}, "
                f"/health {'200' if node.get('healthy') else 'fails'}",
            ]
            rules = str(ev.get("firewall") or "")
            port_lines = _port_rules(rules, _port(addr))
            service = node.get('service') or 'inferfleet-engine'
            journal = f"`journalctl -u {service}` on {host}"
            if node.get("unit") in ("inactive", "failed"):
                cause = f"the engine is not running (its unit is {node['unit']})"
                fix = f"`inferfleet deploy` starts it; {journal} says why it stopped"
            elif server.get("agent_down") and node.get("healthy"):
                cause = (f"the engine's agent last told {lb} \"down\" and {lb} has not heard "
                         "\"up\" since: the agent's socket unit is stopped, or its port "
                         "(inference_engine_agent_port) is blocked")
                fix = (f"`inferfleet deploy` starts the agent ({service}-agent.socket) on "
                       f"{host} and opens its port to the load balancers")
            elif not node.get("healthy"):
                cause = (f"the engine is starting, or failing and restarted by systemd "
                         f"({ev.get('restarts', 0)} restarts): its /health fails")
                fix = (f"wait for the start, or see why it fails: the memory finding when there "
                       f"is one, else {journal}")
            elif probe <= 0:
                if rules and not _accepted(port_lines, source):
                    cause = (f"the firewall on {host} does not accept {source or lb} on port "
                             f"{_port(addr)}: the engine answers itself, the probe never arrives")
                    lines.append(f"{host}'s firewall (table inet inferfleet), port {_port(addr)}: "
                                 + ("; ".join(port_lines) or "no rule"))
                    fix = (f"`inferfleet deploy` puts back the firewall role's rules on {host} "
                           "(the load balancers' addresses are derived from the inventory); a rule "
                           "added by hand or through firewall_extra_rules that drops them must go")
                else:
                    cause = (f"the network between {lb} and {host} drops the probe (the engine "
                             "answers itself; its firewall accepts the load balancer)")
                    fix = (f"check the route from {lb} to {addr} and any firewall between them; "
                           "inferfleet_address must be an address the load balancers reach")
            else:
                cause = (f"the probe from {lb} answers HTTP {probe} but HAProxy's check fails: "
                         "the check does not match the engine (path, port or address)")
                fix = ("compare load_balancer_health_path and the server's address/port with the "
                       "engine's (inference_engine_port); `inferfleet deploy` renders them again")
            found.append(Finding("backend", [host], f"{lb} holds {host} down", lines, cause, fix))
    return found


# --- requests queueing ---------------------------------------------------------------

def _engine_load(node: dict, evidence: dict) -> tuple[float, float, float, str | None]:
    """An engine's running and waiting requests, KV cache use, and max_num_seqs."""
    m = metric_sums(node.get("metrics") or [])
    seqs = flags(exec_start(evidence.get("unit") or "")).get("--max-num-seqs")
    return (m.get("vllm:num_requests_running", 0.0), m.get("vllm:num_requests_waiting", 0.0),
            m.get("vllm:kv_cache_usage_perc", 0.0), seqs)


def _load_line(host: str, node: dict, evidence: dict) -> str:
    running, waiting, kv, seqs = _engine_load(node, evidence)
    return (f"{host}: {running:.0f} running (max_num_seqs {seqs or 'vLLM default'}), "
            f"{waiting:.0f} waiting in the engine, KV cache {kv:.0%} used")


MORE_INSTANCES = "add instances (`inferfleet scale --add HOST`; `inferfleet plan` sizes the fleet)"


def queue(nodes: dict, evidence: dict, balancers: dict) -> list[Finding]:
    """Requests waiting: at a load balancer for a backend (HAProxy's queue, where requests
    wait once every server has load_balancer_backend_maxconn in flight) or in an engine
    (vllm:num_requests_waiting); with each engine's running sequences against its
    max_num_seqs and its KV cache use, which together say what to change."""
    found = []
    for lb, seen in sorted(balancers.items()):
        for backend, q in sorted((seen.get("queues") or {}).items()):
            if q["queued"] <= 0:
                continue
            hosts = sorted({s["name"] for s in seen.get("servers") or []
                            if s.get("backend") == backend and s["name"] in nodes})
            full = [h for h in hosts if _engine_load(nodes[h], evidence.get(h) or {})[2] >= 0.9]
            found.append(Finding(
                "queue", hosts, f"requests wait at {lb} for {backend}",
                [f"{lb}: {q['queued']} request(s) queued for {backend} ({q['sessions']} "
                 "sessions in all)"]
                + [_load_line(h, nodes[h], evidence.get(h) or {}) for h in hosts],
                "every server of the backend has load_balancer_backend_maxconn requests in "
                "flight: the instances are busy and the load balancer holds the rest"
                + (f" ({', '.join(full)}: KV cache full)" if full else ""),
                MORE_INSTANCES + ("" if full else "; where the KV cache has room, raise "
                                  "inference_engine_max_num_seqs and load_balancer_backend_"
                                  "maxconn together (`inferfleet plan` says how far)"),
            ))
    for host, node in sorted(nodes.items()):
        running, waiting, kv, seqs = _engine_load(node, evidence.get(host) or {})
        if waiting <= 0:
            continue
        if kv >= 0.9:
            cause = "the KV cache is full: the engine cannot take more sequences"
            fix = MORE_INSTANCES + ", or give the KV cache more memory"
        elif seqs and running >= int(seqs):
            cause = (f"every one of the {seqs} sequence slots is taken while the KV cache has "
                     f"room ({kv:.0%} used)")
            fix = ("raise inference_engine_max_num_seqs (`inferfleet plan` says how far the KV "
                   "cache allows), or " + MORE_INSTANCES)
        else:
            cause = "the engine is at its limit (its own scheduler queues the requests)"
            fix = MORE_INSTANCES
        found.append(Finding("queue", [host], f"requests wait in {host}'s engine",
                             [_load_line(host, node, evidence.get(host) or {})], cause, fix))
    return found


# --- a slow link between pipeline members ---------------------------------------------

def links(measured: dict) -> list[Finding]:
    """Each pipeline member's link to the next by rank, measured again by doctor.yml,
    against what the pipeline needs of it (the inventory's fabric_preflight_min_bandwidth_
    gbit and fabric_preflight_max_rtt_ms, which `inferfleet plan --write-vars` writes):
    the fabric preflight's own judgement (one owner), one finding per slow link."""
    found = []
    for host, seen in sorted(measured.items()):
        link = seen.get("link")
        if not link:
            continue
        need = seen.get("need") or {}
        problems = link_problems([{"host": host, "link": link}], need)
        if not problems:
            continue
        unmeasured = link.get("gbit") is None or link.get("rtt_ms") is None
        wanted = (f"the pipeline needs at least {float(need.get('min_bandwidth_gbit') or 0):g} "
                  f"Gbit/s and a round trip of at most {float(need.get('max_rtt_ms') or 0):g} ms "
                  "(0: not set)")
        found.append(Finding(
            "link", [host, link["to"]],
            f"pipeline {seen.get('instance', '?')}: the link {host} -> {link['to']} "
            + ("could not be measured" if unmeasured else "is slower than the pipeline needs"),
            problems + [wanted],
            "the members reach each other over a network the pipeline cannot use at speed: "
            "another interface or route than the fast one, a shaped or congested link, or a "
            "firewall in the way of the test" if not unmeasured else
            "the link test could not run between them (its tools or port)",
            "check the route and interface between them (fabric_preflight_interface, "
            "NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME through inference_engine_extra_env) and "
            "whatever shapes the link (`tc qdisc show` on both); `inferfleet plan` says what "
            "each link needs, and whether the model fits one node (replicas need no such link)"
            if not unmeasured else
            "`inferfleet deploy` installs ping and iperf3 (the fabric preflight's link test) "
            "and opens fabric_preflight_link_port between the members",
        ))
    return found


def unreachable(failures: list[str]) -> list[Finding]:
    """Hosts the run could not read: nothing else about them can be judged."""
    return [Finding("unreachable", [], "the doctor could not read every host", list(failures),
                    "a host is unreachable, or a read failed on it",
                    "check the connection (`ansible -m ping`) and run `inferfleet doctor` again")
            ] if failures else []


def diagnose(data: dict, replies: dict, failures: list[str]) -> list[Finding]:
    """Every finding from doctor.yml's data (status.yml's reports and its own) and the
    instances' greedy answers ({host: text, or None where it gave none})."""
    nodes = data.get("inferfleet_status_nodes") or {}
    evidence = data.get("inferfleet_doctor_nodes") or {}
    balancers = data.get("inferfleet_doctor_balancers") or {}
    return (memory(nodes, evidence, data.get("inferfleet_doctor_plan"))
            + answers(nodes, evidence, replies)
            + backends(nodes, evidence, balancers) + queue(nodes, evidence, balancers)
            + links(data.get("inferfleet_doctor_links") or {}) + unreachable(failures))
