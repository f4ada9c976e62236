"""`inferfleet doctor`'s judgement (src/inferfleet/doctor.py) over reports shaped as
playbooks/doctor.yml hands them over; each case found, named, and nothing on a healthy
fleet."""

from inferfleet import doctor as d
from inferfleet.verify import parse_metrics

UNIT = (
    "[Service]\nExecStart=/opt/venv/bin/vllm serve /models/current --served-model-name tiny "
    "--host 0.0.0.0 --port 8000 --max-num-seqs {seqs} --dtype {dtype} --seed 0 "
    '--override-generation-config "{{\\"temperature\\": 0.7}}"\n'
)
ENV = "HF_HUB_OFFLINE=1\nVLLM_CPU_KVCACHE_SPACE={kv}\nVLLM_HOST_IP={ip}\n"


def node(host, instance=None, rank=0, healthy=True, unit="active", version="v1",
         digest="sha256:aa", running=0, waiting=0, kv=0.1, model="tiny"):
    return {
        "instance": {"instance": instance or host, "rank": rank},
        "unit": unit, "healthy": healthy, "model": model, "model_version": version,
        "manifest_digest": digest, "engine_version": "0.32.0",
        "metrics": [f"vllm:num_requests_running{{engine=\"0\"}} {running}",
                    f"vllm:num_requests_waiting{{engine=\"0\"}} {waiting}",
                    f"vllm:kv_cache_usage_perc{{engine=\"0\"}} {kv}"],
    }


def evidence(host, seqs=8, dtype="bfloat16", kv=1, log=(), result="success", firewall=""):
    return {"result": result, "restarts": 3 if log else 0,
            "unit": UNIT.format(seqs=seqs, dtype=dtype),
            "environment": ENV.format(kv=kv, ip=f"10.0.0.{host[-1]}"),
            "log": list(log), "firewall": firewall}


def healthy_fleet():
    nodes = {h: node(h) for h in ("node1", "node2", "node3")}
    ev = {h: evidence(h) for h in nodes}
    return nodes, ev


def test_a_healthy_fleet_has_no_finding():
    nodes, ev = healthy_fleet()
    lbs = {"lb": {"servers": [{"name": h, "status": "UP", "addr": f"10.0.0.{h[-1]}:8000",
                               "check_status": "L7OK"} for h in nodes]}}
    data = {"inferfleet_status_nodes": nodes, "inferfleet_doctor_nodes": ev,
            "inferfleet_doctor_balancers": lbs}
    assert d.diagnose(data, {h: " the same" for h in nodes}, []) == []


def test_the_command_line_is_read_back_as_systemd_quoted_it():
    args = d.exec_start(UNIT.format(seqs=8, dtype="auto"))
    assert args[:3] == ["/opt/venv/bin/vllm", "serve", "/models/current"]
    f = d.flags(args)
    assert f["--max-num-seqs"] == "8" and f["--seed"] == "0"
    assert f["--override-generation-config"] == '{"temperature": 0.7}'
    assert d.flags(["--headless", "--port", "1"]) == {"--headless": "", "--port": "1"}


def test_an_engine_that_cannot_start_for_kv_cache_space_is_named_with_its_setting():
    nodes, ev = healthy_fleet()
    nodes["node2"] = node("node2", healthy=False, unit="activating")
    line = ("ValueError: Available memory on node 0 (20.1/23.4 GiB) on kv cache allocation is "
            "less than requested memory for kv (64.0 GiB). Decrease --kv-cache-memory-bytes, ...")
    ev["node2"] = evidence("node2", kv=64, log=["INFO loading", line, "Engine core failed"])
    [f] = d.memory(nodes, ev)
    assert f.case == "memory" and f.hosts == ["node2"]
    assert f.evidence[0] == f"log: {line}"
    assert "VLLM_CPU_KVCACHE_SPACE=64 GiB" in f.evidence[1] and "--max-num-seqs 8" in f.evidence[1]
    assert "inference_engine_cpu_kvcache_space" in f.fix
    # the same lines on a healthy engine, on one stopped on purpose, or before the last
    # two starts are history, not a finding
    nodes["node2"]["healthy"] = True
    assert d.memory(nodes, ev) == []
    nodes["node2"] = node("node2", healthy=False, unit="inactive")
    assert d.memory(nodes, ev) == []
    nodes["node2"]["unit"] = "activating"
    started = "Started inferfleet-engine.service - inferfleet inference engine (vLLM 0.32.0)"
    ev["node2"]["log"] = [started, line, started, "INFO ok", started, "INFO loading"]
    assert d.memory(nodes, ev) == []
    # the attempt before this one failed for memory
    ev["node2"]["log"] = [started, "INFO ok", started, line, started, "INFO loading"]
    assert len(d.memory(nodes, ev)) == 1


def test_each_memory_error_gets_its_own_fix():
    cases = {
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB":
            "inference_engine_tensor_parallel_size",
        "ValueError: Free memory on device (6.9/80.0 GiB) on startup is less than desired GPU "
        "memory utilization (0.9, 72.0 GiB)": "nvidia-smi",
        "ValueError: To serve at least one request with the models's max seq len (40960), (5.62 "
        "GiB KV cache is needed, which is larger than the available KV cache memory (4.50 GiB)":
            "inference_engine_max_model_len",
    }
    for line, fix in cases.items():
        nodes = {"n1": node("n1", healthy=False, unit="failed")}
        [f] = d.memory(nodes, {"n1": evidence("n1", log=[line])})
        assert fix in f.fix, (line, f.fix)


MEMINFO = "MemTotal:       24576000 kB\nMemAvailable:   10485760 kB\nmodel: 2684354560\n"
SMI = """index, uuid, memory.used [MiB], memory.total [MiB]
0, GPU-aaa, 81000, 81559
1, GPU-bbb, 300, 81559
---
gpu_uuid, pid, process_name, used_gpu_memory [MiB]
GPU-aaa, 4242, /usr/bin/python3, 78000
GPU-aaa, 777, /opt/inferfleet/engine/bin/python, 3000
---
777
778
"""
PLAN = {"decision": "replicated", "hardware": {"gpus_per_node": 2, "gpu_memory_gib": 80},
        "tensor_parallel_size": 1, "pipeline_parallel_size": 1,
        "per_gpu": {"weights_gib": 14.96, "overhead_gib": 2.1, "kv_cache_gib": 54.6,
                    "usable_gib": 71.66}}


def test_a_memory_finding_shows_the_nodes_memory_who_holds_the_gpus_and_the_plan():
    nodes = {"n1": node("n1", healthy=False, unit="activating")}
    ev = {"n1": evidence("n1", log=["ValueError: Free memory on device (0.6/79.6 GiB) on "
                                    "startup is less than desired GPU memory utilization"])}
    ev["n1"].update(memory=MEMINFO, gpus=SMI)
    [f] = d.memory(nodes, ev, PLAN)
    assert f.evidence[2:] == [
        "node memory: 10.0 GiB available of 23.4 GiB; the model's folder 2.50 GiB",
        "GPU 0: 81000 of 81559 MiB used; held by other processes: pid 4242 /usr/bin/python3 "
        "(78000 MiB)",
        "GPU 1: 300 of 81559 MiB used; no process but the engine's holds it",
        "capacity plan for 2 GPU(s) x 80 GiB per node: TP 1 x PP 1, per GPU weights 14.96 GiB "
        "+ overhead 2.1 GiB + KV cache 54.6 GiB of 71.66 GiB usable",
    ]
    assert "nvidia-smi" in f.fix
    assert d.gpu_memory("Failed to initialize NVML\n---\n---\n") == [
        "nvidia-smi: nvidia-smi printed no CSV header: 'Failed to initialize NVML'"]
    assert d.node_memory("MemTotal: 2097152 kB\nmodel: 5242880\n") == (
        "node memory: 0.0 GiB available of 2.0 GiB; the model's folder 5 MiB")
    short = {"decision": "none", "hardware": {"gpus_per_node": 1, "gpu_memory_gib": 24},
             "per_gpu": None, "shortfall_gib": 3.2}
    assert d.plan_line(short) == ("capacity plan (none): nothing fits 1 GPU(s) x 24 GiB per "
                                  "node; short by 3.2 GiB per GPU")
    assert d.plan_line({"error": "no such model"}) == "capacity plan: none (no such model)"
    # what was not read adds nothing
    ev["n1"].update(memory="", gpus="")
    [f] = d.memory(nodes, ev, None)
    assert len(f.evidence) == 2
    data = {"inferfleet_status_nodes": nodes, "inferfleet_doctor_nodes": ev,
            "inferfleet_doctor_plan": PLAN}
    [f] = d.diagnose(data, {}, [])
    assert f.evidence[-1].startswith("capacity plan for 2 GPU(s)")


def test_the_kernels_oom_killer_is_a_memory_finding_without_a_log_line():
    nodes = {"n1": node("n1", healthy=False, unit="failed")}
    [f] = d.memory(nodes, {"n1": evidence("n1", result="oom-kill")})
    assert "oom-kill" in f.evidence[0]
    assert d.memory(nodes, {"n1": evidence("n1")}) == []  # no evidence of memory: no guess


def test_the_instance_on_another_model_version_is_the_odd_one_out():
    nodes, ev = healthy_fleet()
    nodes["node3"] = node("node3", version="v2", digest="sha256:bb")
    [f] = d.answers(nodes, ev, {"node1": " a", "node2": " a", "node3": " b"})
    assert f.case == "answers" and f.hosts == ["node3"]
    assert "greedy answer: node3 ' b'; the others ' a'" in f.evidence
    assert "model version: node3 'v2'; the others 'v1'" in f.evidence
    assert any(e.startswith("weights (manifest digest): node3") for e in f.evidence)
    assert "`inferfleet rollout --model tiny`" in f.fix


def test_a_setting_that_differs_names_its_variable_and_per_node_settings_do_not_count():
    nodes, ev = healthy_fleet()
    ev["node1"] = evidence("node1", dtype="float16", seqs=16, kv=2)  # seqs, kv: capacity
    [f] = d.answers(nodes, ev, {})
    assert f.hosts == ["node1"]
    assert f.evidence == [
        "--dtype (inference_engine_dtype): node1 'float16'; the others 'bfloat16'"]
    ev["node1"]["environment"] += "VLLM_ATTENTION_BACKEND=TORCH_SDPA\n"
    ev["node1"]["unit"] = UNIT.format(seqs=8, dtype="bfloat16").replace("--seed 0", "--seed 7")
    [f] = d.answers(nodes, ev, {})
    assert "--seed (inference_engine_extra_args): node1 '7'; the others '0'" in f.evidence
    assert ("environment VLLM_ATTENTION_BACKEND (inference_engine_extra_env): node1 "
            "'TORCH_SDPA'; the others '(unset)'") in f.evidence


def test_models_are_compared_within_themselves_and_pipeline_members_not_at_all():
    nodes = {"a1": node("a1", model="chat"), "a2": node("a2", model="chat"),
             "c1": node("c1", model="coder", version="v9"),
             "p0": node("p0", instance="pipe", model="coder", version="v9"),
             "p1": node("p1", instance="pipe", rank=1, model="coder", version="v1")}
    ev = {h: evidence(h) for h in nodes}
    ev["p1"]["unit"] += "ExecStart=--headless\n"
    assert d.answers(nodes, ev, {"a1": "x", "a2": "x", "c1": "y", "p0": "y"}) == []


def _down(name, check="L4TOUT", last=""):
    return {"name": name, "status": "DOWN", "addr": f"10.0.0.{name[-1]}:8000",
            "check_status": check, "last_chk": last}


FIREWALL = """table inet inferfleet {
	chain input {
		type filter hook input priority filter; policy drop;
		ip saddr { 10.0.0.9 } tcp dport 8000 accept comment "load balancers to the engine API"
		ip saddr { 10.1.0.0/16 } tcp dport 22 accept comment "ssh"
		counter packets 12 bytes 720 comment "dropped by the policy"
	}
}"""


def test_a_backend_the_firewall_keeps_from_the_load_balancer():
    nodes, ev = healthy_fleet()
    ev["node2"]["firewall"] = FIREWALL
    lbs = {"lb": {"servers": [_down("node2")], "probe_status": {"node2": -1},
                  "probe_message": {"node2": "Status code was -1: timed out"},
                  "route": {"node2": "10.0.0.2 dev eth0 src 10.0.0.5 uid 0"}}}
    [f] = d.backends(nodes, ev, lbs)
    assert f.hosts == ["node2"] and f.symptom == "lb holds node2 down"
    assert f.evidence[0] == "lb: HAProxy has node2 DOWN, last check L4TOUT"
    assert f.evidence[1].startswith("lb -> 10.0.0.2:8000 from 10.0.0.5: no answer (Status code")
    assert f.evidence[2] == "node2 itself: unit active, /health 200"
    assert "firewall on node2 does not accept 10.0.0.5 on port 8000" in f.cause
    assert 'ip saddr { 10.0.0.9 } tcp dport 8000 accept' in f.evidence[3]
    # the load balancer's address accepted: the network between, not this firewall
    ev["node2"]["firewall"] = FIREWALL.replace("10.0.0.9", "10.0.0.5")
    [f] = d.backends(nodes, ev, lbs)
    assert "the network between lb and node2" in f.cause
    # a drop rule put in front of the accept names the load balancer's address
    ev["node2"]["firewall"] = FIREWALL.replace("\t\tip saddr { 10.0.0.9 }", (
        "\t\tip saddr 10.0.0.5 tcp dport 8000 drop\n\t\tip saddr { 10.0.0.5 }"))
    [f] = d.backends(nodes, ev, lbs)
    assert "ip saddr 10.0.0.5 tcp dport 8000 drop" in f.evidence[3]
    assert "does not accept 10.0.0.5" in f.cause
    # port ranges, in a set or alone, count for the ports they take (and only for those)
    for dports, accepted in (("{ 22, 7990-8010 }", True), ("8000-8001", True),
                             ("{ 80, 8001-8010 }", False), ("18000", False)):
        ev["node2"]["firewall"] = FIREWALL.replace(
            "\t\tip saddr { 10.0.0.9 } tcp dport 8000",
            f"\t\tip saddr {{ 10.0.0.5 }} tcp dport {dports}")
        [f] = d.backends(nodes, ev, lbs)
        assert ("the network between" in f.cause) is accepted, dports


def test_a_backend_down_because_its_engine_is_stopped_or_its_check_is_wrong():
    nodes, ev = healthy_fleet()
    nodes["node1"] = node("node1", healthy=False, unit="inactive")
    lbs = {"lb": {"servers": [_down("node1", "L4CON", "Connection refused")],
                  "probe_status": {"node1": -1}, "route": {}}}
    [f] = d.backends(nodes, ev, lbs)
    assert f.cause == "the engine is not running (its unit is inactive)"
    assert f.fix.startswith("`inferfleet deploy` starts it; `journalctl -u inferfleet-engine`")
    assert "(Connection refused)" in f.evidence[0]
    nodes["node1"] = node("node1", healthy=False, unit="activating")
    [f] = d.backends(nodes, ev, lbs)
    assert f.cause.startswith("the engine is starting, or failing and restarted by systemd")
    nodes["node1"] = node("node1")
    lbs["lb"]["probe_status"]["node1"] = 200
    lbs["lb"]["servers"] = [_down("node1", "L7STS", "HTTP status check returned code 404")]
    [f] = d.backends(nodes, ev, lbs)
    assert "the check does not match the engine" in f.cause
    assert "load_balancer_health_path" in f.fix
    # healthy, checks passing, but its agent said "down" and went silent
    lbs["lb"]["servers"] = [{**_down("node1", "L7OK"), "agent_down": True}]
    [f] = d.backends(nodes, ev, lbs)
    assert "the engine's agent last told lb \"down\"" in f.cause
    assert "inference_engine_agent_port" in f.cause and "inferfleet-engine-agent.socket" in f.fix
    # servers taken out on purpose (MAINT, DRAIN) are not findings
    lbs["lb"]["servers"] = [{**_down("node1"), "status": "MAINT"}]
    assert d.backends(nodes, ev, lbs) == []


def test_queueing_says_where_requests_wait_and_what_limits_them():
    nodes, ev = healthy_fleet()
    nodes["node1"] = node("node1", running=8, waiting=5, kv=0.3)
    nodes["node2"] = node("node2", running=3, waiting=2, kv=0.97)
    found = {f.hosts[0]: f for f in d.queue(nodes, ev, {})}
    assert set(found) == {"node1", "node2"}
    assert found["node1"].evidence == [
        "node1: 8 running (max_num_seqs 8), 5 waiting in the engine, KV cache 30% used"]
    assert "raise inference_engine_max_num_seqs" in found["node1"].fix
    assert "KV cache is full" in found["node2"].cause


def test_a_queue_at_the_load_balancer_names_the_backends_engines():
    nodes, ev = healthy_fleet()
    for h in ("node1", "node2"):
        nodes[h] = node(h, running=8, kv=0.4)
    servers = [{"name": h, "backend": "inferfleet_engines", "status": "UP"}
               for h in ("node1", "node2")] + [
        {"name": "node3", "backend": "inferfleet_engines_coder", "status": "UP"}]
    lbs = {"lb": {"servers": servers, "queues": {
        "inferfleet_engines": {"queued": 24, "sessions": 40},
        "inferfleet_engines_coder": {"queued": 0, "sessions": 0}}}}
    [f] = d.queue(nodes, ev, lbs)
    assert f.hosts == ["node1", "node2"]
    assert f.symptom == "requests wait at lb for inferfleet_engines"
    assert f.evidence[0] == "lb: 24 request(s) queued for inferfleet_engines (40 sessions in all)"
    assert f.evidence[1].startswith("node1: 8 running (max_num_seqs 8), 0 waiting")
    assert "raise inference_engine_max_num_seqs and load_balancer_backend_maxconn" in f.fix
    nodes["node2"] = node("node2", running=8, kv=0.95)
    [f] = d.queue(nodes, ev, lbs)
    assert "(node2: KV cache full)" in f.cause and "raise" not in f.fix


def test_hosts_that_could_not_be_read_are_a_finding():
    [f] = d.unreachable(["node2: unreachable: ssh timed out"])
    assert f.case == "unreachable" and f.evidence == ["node2: unreachable: ssh timed out"]


def test_metrics_lines_parse_as_the_status_report_gives_them():
    assert parse_metrics(node("x", waiting=2)["metrics"][1])[0][2] == 2.0


def test_two_instances_that_differ_are_both_named_and_a_dead_one_is_not_compared():
    nodes = {"n1": node("n1"), "n2": node("n2"), "n3": node("n3", healthy=False)}
    ev = {h: evidence(h) for h in nodes}
    ev["n1"]["unit"] = ev["n1"]["unit"].replace("--seed 0", "--seed 7")
    nodes["n3"]["engine_version"] = ""  # it does not answer /version
    [f] = d.answers(nodes, ev, {"n1": "x", "n2": "x", "n3": None})
    assert f.hosts == ["n1", "n2"] and f.symptom == "instances of tiny differ: n1, n2"
    assert f.evidence == ["--seed (inference_engine_extra_args): n1 '7', n2 '0'"]


def test_of_two_instances_the_one_off_its_own_inventory_is_the_odd_one_out():
    nodes = {"n1": node("n1"), "n2": node("n2", version="v2")}
    ev = {h: evidence(h) for h in nodes}
    ev["n2"]["unit"] = ev["n2"]["unit"].replace("--seed 0", "--seed 7")
    ev["n2"]["environment"] += "NCCL_IB_DISABLE=1\n"  # a group's transport: not compared
    rendered = d.exec_start(UNIT.format(seqs=8, dtype="bfloat16"))[2:]  # after `vllm serve`
    for h in nodes:
        ev[h]["inventory"] = {"model_version": "v1", "args": rendered,
                              "env": {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}}
    [f] = d.answers(nodes, ev, {"n1": "x", "n2": "x"})
    assert f.hosts == ["n2"] and f.symptom == "instances of tiny differ: n2 against 1 other(s)"
    assert f.evidence == [
        "model version: n2 'v2' (its inventory says 'v1'); the others 'v1'",
        "--seed (inference_engine_extra_args): n2 '7' (its inventory says '0'); the others '0'"]
    # The inventory itself gives n2 the seed (host_vars): no one is off it, both named.
    ev["n2"]["inventory"]["args"] = [a if a != "0" else "7" for a in rendered]
    nodes["n2"]["model_version"] = "v1"
    [f] = d.answers(nodes, ev, {"n1": "x", "n2": "x"})
    assert f.hosts == ["n1", "n2"]
    assert f.evidence == ["--seed (inference_engine_extra_args): n1 '0', n2 '7'"]


def test_a_pipeline_beside_single_node_instances_of_its_model_is_not_a_difference():
    nodes, ev = healthy_fleet()
    ev["node1"]["unit"] = ev["node1"]["unit"].replace(
        "--seed 0", "--seed 0 --pipeline-parallel-size 2 --distributed-executor-backend mp")
    ev["node2"]["unit"] = ev["node2"]["unit"].replace("--seed 0", "--seed 0 --enforce-eager")
    ev["node2"]["environment"] += "VLLM_ENABLE_V1_MULTIPROCESSING=0\nOMP_NUM_THREADS=1\n"
    assert d.answers(nodes, ev, {h: "same" for h in nodes}) == []


def link(to="p1", gbit=10.5, rtt=0.09, error=""):
    return {"to": to, "address": "10.0.0.2", "gbit": gbit, "rtt_ms": rtt, "error": error}


def measured(found, need_gbit=1, need_rtt=0):
    return {"p0": {"instance": "pipe", "rank": 0, "link": found,
                   "need": {"min_bandwidth_gbit": need_gbit, "max_rtt_ms": need_rtt}}}


def test_a_pipeline_link_below_what_the_pipeline_needs_names_both_members_and_figures():
    assert d.links(measured(link())) == []
    assert d.links({"p1": {"instance": "pipe", "rank": 1, "link": None, "need": {}}}) == []
    [f] = d.links(measured(link(gbit=0.095)))
    assert (f.case, f.hosts) == ("link", ["p0", "p1"])
    assert f.symptom == "pipeline pipe: the link p0 -> p1 is slower than the pipeline needs"
    assert ("link p0 -> p1 (10.0.0.2): bandwidth 0.095 Gbit/s, the pipeline needs 1 Gbit/s "
            "(fabric_preflight_min_bandwidth_gbit)") in f.evidence
    assert "tc qdisc show" in f.fix and "fabric_preflight_interface" in f.fix
    [f] = d.links(measured(link(rtt=4.0), need_gbit=0, need_rtt=0.5))
    assert "round trip 4 ms, the pipeline tolerates 0.5 ms" in f.evidence[0]
    # no need set (0): measured, not judged
    assert d.links(measured(link(gbit=0.01, rtt=50), need_gbit=0)) == []


def test_a_link_that_could_not_be_measured_says_what_to_install_or_open():
    [f] = d.links(measured(link(gbit=None, rtt=None, error="iperf3 is not installed")))
    assert f.symptom.endswith("could not be measured")
    assert "iperf3 is not installed" in f.evidence[0]
    assert "fabric_preflight_link_port" in f.fix
    data = {"inferfleet_status_nodes": {}, "inferfleet_doctor_links": measured(link(gbit=0.1))}
    assert [x.case for x in d.diagnose(data, {}, [])] == ["link"]
