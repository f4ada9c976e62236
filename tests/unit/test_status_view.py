"""`inferfleet status` reads at 80 columns: one line per instance, nothing cut short;
`--wide` keeps every node and field."""

from rich.console import Console

from inferfleet.commands.status import edge_line, edge_view, router_lines, status_table


def node(instance, rank, host, healthy=True, version="v1", lb="inferfleet-lab-lb: UP"):
    return {
        "instance": instance, "rank": rank, "host": host, "unit": "active",
        "healthy": healthy, "model_version": version,
        "manifest_digest": "sha256:aa1c6312e58b81f7bb6819de8c61a3358f0318fd73b807474ce0",
        "engine_version": "0.32.0", "running": 3.0, "waiting": 1.0, "served": 1765.0,
        "lb": lb if rank == 0 else "", "requests_per_s": 4.2, "ttft_p95_s": 0.091,
        "kv_cache_use": 0.12,
    }


ROWS = [
    node("inferfleet-lab-node1", 0, "inferfleet-lab-node1",
         lb="inferfleet-replicated-lb: UP, inferfleet-replicated-nginx: passive"),
    node("inferfleet-lab-node2", 0, "inferfleet-lab-node2", healthy=False, version="v2"),
    node("pp", 0, "inferfleet-pipeline-node1"),
    node("pp", 1, "inferfleet-pipeline-node2", version="v2"),
]


def rendered(wide: bool, prometheus: bool = True, width: int = 80) -> list[str]:
    console = Console(width=width, record=True, color_system=None)
    console.print(status_table(ROWS, prometheus, wide))
    return console.export_text().splitlines()


def test_one_line_per_instance_fits_80_columns_uncut():
    lines = rendered(wide=False)
    text = "\n".join(lines)
    assert max(len(line) for line in lines) <= 80
    assert "…" not in text
    assert [line.split() for line in lines if line.startswith((" pp", "pp"))] == [
        ["pp", "2/2", "mixed", "3/1", "1765", "UP", "4.20"]  # members disagree on the model
    ]
    node1, node2 = (line.split() for line in lines if "inferfleet-lab-node" in line)
    assert node1 == ["inferfleet-lab-node1", "1/1", "v1", "3/1", "1765", "UP", "passive", "4.20"]
    assert node2[:3] == ["inferfleet-lab-node2", "0/1", "v2"]
    assert "vLLM 0.32.0 on every node" in text


def test_a_vllm_column_only_where_the_nodes_differ():
    ROWS[1]["engine_version"] = "0.33.0"
    try:
        lines = rendered(wide=False, prometheus=False)
    finally:
        ROWS[1]["engine_version"] = "0.32.0"
    assert max(len(line) for line in lines) <= 80
    assert "vLLM" in lines[1] and "on every node" not in "\n".join(lines)
    node2 = next(line for line in lines if "inferfleet-lab-node2" in line)
    assert node2.split()[:4] == ["inferfleet-lab-node2", "0/1", "v2", "0.33.0"]


def test_wide_shows_every_node_and_field():
    text = "\n".join(rendered(wide=True, width=250))
    for host in ("inferfleet-pipeline-node1", "inferfleet-pipeline-node2"):
        assert host in text
    assert "sha256:aa1c6312e58b" in text and "0.091 s" in text and "12%" in text


def test_the_floating_address_shows_who_holds_it():
    balancers = {
        "lb2": {"kind": "haproxy", "virtual_ip": "10.0.0.100", "holds_virtual_ip": True},
        "lb1": {"kind": "haproxy", "virtual_ip": "10.0.0.100", "holds_virtual_ip": False},
        "nginx": {"kind": "nginx", "virtual_ip": "", "holds_virtual_ip": False},
    }
    edges = edge_view(balancers)
    assert edges == [{"virtual_ip": "10.0.0.100", "peers": ["lb1", "lb2"], "held_by": ["lb2"]}]
    assert edge_line(edges[0]) == "floating address 10.0.0.100 (lb1, lb2): held by lb2"
    balancers["lb2"]["holds_virtual_ip"] = False
    assert edge_line(edge_view(balancers)[0]).endswith("held by NO load balancer")
    balancers["lb1"]["holds_virtual_ip"] = balancers["lb2"]["holds_virtual_ip"] = True
    assert edge_line(edge_view(balancers)[0]).endswith("held by 2 load balancers at once: lb1, lb2")
    assert edge_view({"lb": {"kind": "haproxy"}}) == []  # one load balancer, no address


def test_each_router_says_how_it_routed():
    """cache_aware: one line per load balancer and backend, with the share routed to the
    engine holding the prefix; load balancers without routers say nothing."""
    balancers = {
        "lb2": {"kind": "haproxy", "routers": {"inferfleet_engines": {"prefix_hit": 30.0,
                                                                      "prefix_miss": 10.0}}},
        "lb1": {"kind": "haproxy", "routers": {"inferfleet_engines": {}}},
        "nginx": {"kind": "nginx"},
    }
    assert router_lines(balancers) == [
        "router lb1/inferfleet_engines: 0 requests routed, 0 to the engine holding their "
        "prefix, 0 to the least busy",
        "router lb2/inferfleet_engines: 40 requests routed, 30 (75%) to the engine holding "
        "their prefix, 10 to the least busy",
    ]
