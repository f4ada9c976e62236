"""A plan for people: a table and one memory bar per GPU, with rich; for several models
(``plan --models``) one row per model and, with an inventory, its check."""

from __future__ import annotations

from ansible_collections.inferfleet.fleet.plugins.module_utils.planner.fleet import (
    FleetPlan,
    ModelCheck,
    ModelPlan,
)
from ansible_collections.inferfleet.fleet.plugins.module_utils.planner.memory import GiB
from ansible_collections.inferfleet.fleet.plugins.module_utils.planner.plan import Layout, Plan
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from inferfleet.fleet import role_defaults

BAR_WIDTH = 48
_SEGMENTS = (
    ("weights", "█", "bold blue"),
    ("KV cache", "█", "green"),
    ("overhead", "█", "yellow"),
    ("free", "░", "dim"),
)
_OVER = ("over capacity", "▓", "bold red")
_DECISION = {
    "replicated": ("replicated", "bold green"),
    "pipeline": ("pipeline", "bold cyan"),
    "does_not_fit": ("does not fit", "bold red"),
}


def _gib(n: float) -> str:
    return f"{n / GiB:,.1f} GiB"


def bar(parts: list[int], total: int, width: int = BAR_WIDTH) -> Text:
    """A bar of ``width`` cells split in proportion to ``parts`` (weights, KV,
    overhead, free). When the parts exceed ``total`` the bar is scaled to the
    demand and the cells past ``total`` are drawn as red ``▓``."""
    demand = sum(parts)
    scale = max(total, demand) or 1
    cells: list[tuple[str, str]] = []
    edge = 0.0
    for part, (_, char, style) in zip(parts, _SEGMENTS, strict=False):
        start = round(edge / scale * width)
        edge += part
        cells.extend((char, style) for _ in range(round(edge / scale * width) - start))
    cells.extend(("░", "dim") for _ in range(width - len(cells)))
    if demand > total:
        limit = round(total / scale * width)
        cells[limit:] = [("▓", "bold red")] * (width - limit)
    text = Text()
    for char, style in cells:
        text.append(char, style=style)
    return text


def legend() -> Text:
    text = Text()
    for name, char, style in (*_SEGMENTS, _OVER):
        text.append(char * 2, style=style)
        text.append(f" {name}  ")
    return text


def gpu_bars(plan: Plan) -> Table:
    """One row per GPU of one instance: node (pipeline stage), GPU, bar, figures."""
    layout = plan.layout
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    table.add_column("node", no_wrap=True)
    table.add_column("GPU", justify="right", no_wrap=True)
    table.add_column("memory (one instance)", no_wrap=True, min_width=BAR_WIDTH)
    table.add_column("weights / KV / overhead / free", justify="right")
    if layout is None:
        return table
    for stage, weights in enumerate(layout.stage_weights or (layout.weights_bytes,)):
        kv = layout.stage_kv_cache[stage] if layout.stage_kv_cache else layout.kv_cache_bytes
        if plan.fits:
            parts = _parts(layout, weights, kv)
        else:  # show what it would need: the KV for the target, and the excess
            parts = [weights, layout.kv_needed_bytes, layout.overhead.total, 0]
        figures = " / ".join(_gib(p) for p in parts)
        if not plan.fits:
            figures = f"needs {_gib(sum(parts))} of {_gib(layout.total_bytes)}: " + figures
        for gpu in range(layout.tp):
            table.add_row(str(stage + 1) if gpu == 0 else "", str(gpu),
                          bar(parts, layout.total_bytes), figures if gpu == 0 else "")
    return table


def _parts(layout: Layout, weights: int, kv: int) -> list[int]:
    free = max(0, layout.total_bytes - weights - kv - layout.overhead.total)
    return [weights, kv, layout.overhead.total, free]


def network_need(plan: Plan) -> str:
    """What a pipeline's links must carry (module_utils.planner.network), in a line."""
    net = plan.network.to_dict()
    return (
        f"per link: at least {net['min_bandwidth_gbit_s']:g} Gbit/s and a round trip of at "
        f"most {net['max_rtt_ms']:g} ms ({net['bytes_per_token']:,} bytes per token per "
        f"boundary; {net['sustained_gbit_s']:g} Gbit/s at {net['prefill_tokens_per_s']:g} "
        f"prefill + {net['decode_tokens_per_s']:g} decode tokens/s; a decode step of "
        f"{net['decode_step_mib']:g} MiB in {net['network_share']:.0%} of {net['tpot_ms']:g} ms "
        "per token)"
    )


# The prompt bytes prefix routing hashes (the role's default), over about 4 bytes a token
# of English text.
PREFIX_BYTES = int(role_defaults("load_balancer")["load_balancer_prefix_bytes"])
PREFIX_ROUTING_TOKENS = PREFIX_BYTES // 4


def routing_advice(plan: Plan, shared_tokens: int | None, prefixes: int) -> dict:
    """Which load_balancer_routing suits the workload (docs/load-balancer.md, "Routing"):
    where the requests' shared prefixes (`prefixes` of `shared_tokens` each) are cached
    under leastconn and under prefix routing, against an instance's KV capacity."""
    if not plan.fits or plan.layout is None:
        return {"routing": None, "why": "nothing fits"}
    if plan.instances <= 1:
        return {"routing": "leastconn",
                "why": "one instance: every request finds its prefix there"}
    if not shared_tokens:
        return {"routing": "leastconn",
                "why": f"leastconn keeps the {plan.instances} instances equally busy; if "
                       "requests share long prefixes (system prompts, documents), give "
                       "--shared-prefix-tokens and --prefixes"}
    capacity = plan.layout.capacity.tokens
    total = shared_tokens * prefixes
    spread = -(-total // plan.instances)
    held = (f"{prefixes:,} prefix(es) of {shared_tokens:,} tokens: under leastconn every "
            f"instance prefills each once and holds them all ({total:,} tokens, "
            f"{total / capacity:.0%} of its KV capacity"
            + ("; more than it holds, so they evict each other" if total > capacity else "")
            + f"); under prefix routing each is prefilled once for the fleet and an instance "
            f"holds about 1/{plan.instances} ({spread:,} tokens, {spread / capacity:.0%})")
    if shared_tokens < PREFIX_ROUTING_TOKENS:
        return {"routing": "leastconn",
                "why": f"{held}; but the shared part is shorter than the "
                       f"{PREFIX_ROUTING_TOKENS} tokens or so that prefix routing hashes "
                       f"(load_balancer_prefix_bytes: {PREFIX_BYTES}), so a tenant would spread: "
                       "lower load_balancer_prefix_bytes below it for prefix routing"}
    return {"routing": "prefix", "why": held}


def summary_table(plan: Plan, routing: dict | None = None) -> Table:
    data = plan.to_dict()
    model, weights, kv = data["model"], data["weights"], data["kv_cache"]
    table = Table(title=f"inferfleet plan: {plan.location}", show_header=False,
                  title_justify="left", title_style="bold")
    table.add_column(style="bold")
    table.add_column()
    attention = "MLA (one latent head)" if model["attention"] == "mla" else (
        f"{model['kv_heads']} KV heads x {model['head_dim']}")
    if model["sliding_window_layers"]:
        attention += f", {model['sliding_window_layers']} sliding-window layers"
    experts = f", {model['experts']} experts" if model["experts"] else ""
    table.add_row("model", f"{model['model_type']}: {model['layers']} layers, "
                           f"{attention}{experts}")
    table.add_row("weights", f"{weights['gib']:,} GiB ({weights['parameters'] / 1e9:.2f} B "
                             f"params, {weights['dtype']}, {weights['quantization']}; "
                             f"{weights['source']})")
    table.add_row("KV cache / token", f"{kv['bytes_per_token']:,} bytes ({kv['dtype']}, "
                                      "all layers, one GPU)")
    hw = plan.hardware
    table.add_row("fleet", f"{hw.nodes} node(s) x {hw.gpus_per_node} GPU(s) x "
                           f"{hw.gpu_memory_gib:g} GiB")
    table.add_row("target", f"context {plan.context:,} x {plan.concurrency} sequence(s); "
                            f"gpu_memory_utilization {plan.targets.gpu_memory_utilization}")
    label, style = _DECISION[plan.decision]
    decision = Text(label, style=style)
    layout = plan.layout
    if plan.fits and layout is not None:
        decision.append(f": TP {layout.tp} x PP {layout.pp}, {plan.instances} instance(s) "
                        f"of {plan.nodes_per_instance} node(s)")
        if plan.smallest_tp is not None:
            decision.append(f"; smallest TP that fits: {plan.smallest_tp}")
    elif layout is not None:
        decision.append(f": short by {plan.shortfall_bytes / GiB:,.1f} GiB per GPU at "
                        f"TP {layout.tp} x PP {layout.pp}")
    table.add_row("decision", decision)
    if layout is not None and plan.fits:
        cap = layout.capacity
        table.add_row("KV capacity", f"{cap.tokens:,} tokens per instance; "
                                     f"{cap.max_concurrency:,.2f} sequences at "
                                     f"{plan.context:,} tokens")
        table.add_row("fleet serves", f"{int(cap.max_concurrency) * plan.instances:,} "
                                      f"full-context sequences at once")
    if plan.network is not None:
        table.add_row("group network", network_need(plan))
    if routing and routing["routing"]:
        table.add_row("routing", f"load_balancer_routing: {routing['routing']} ({routing['why']})")
    for note in plan.notes:
        table.add_row("note", note)
    for suggestion in plan.suggestions:
        table.add_row("to fit", suggestion)
    return table


def render(plan: Plan, console: Console | None = None, routing: dict | None = None) -> None:
    """Print the table, the bars and the legend."""
    console = console or Console()
    console.print(Group(summary_table(plan, routing), Text(""), gpu_bars(plan), legend()))


def _nodes(count: int) -> str:
    return f"{count} node" if count == 1 else f"{count} nodes"


def _nodes_cell(model: ModelPlan) -> str:
    """Assigned nodes: replicas on one line, one line per pipeline instance ("a + b")."""
    if not model.nodes:
        return f"needs {model.nodes_needed}" if model.nodes_needed else "-"
    if model.plan.nodes_per_instance == 1:
        return ", ".join(members[0] for members in model.nodes)
    return "\n".join(" + ".join(members) for members in model.nodes)


def fleet_table(fleet: FleetPlan) -> Table:
    """One row per model: TP x PP, instances x nodes each, KV capacity of one instance
    (whole sequences at the model's context), target (what the instances hold), nodes."""
    hw = fleet.hardware
    table = Table(title=f"inferfleet plan: {len(fleet.models)} model(s) on {len(fleet.hosts)} "
                        f"node(s) x {hw.gpus_per_node} GPU(s) x {hw.gpu_memory_gib:g} GiB",
                  title_justify="left", title_style="bold", header_style="bold underline",
                  box=None, padding=(0, 2, 0, 0), pad_edge=False,
                  caption="KV/instance: full-context sequences one instance holds @ the "
                          "context; target: sequences the model must hold (its instances "
                          "hold)", caption_justify="left", caption_style="dim")
    table.add_column("model", no_wrap=True)
    table.add_column("TP x PP", no_wrap=True)
    table.add_column("instances", no_wrap=True)
    table.add_column("KV/instance", justify="right", no_wrap=True)
    table.add_column("target (holds)", justify="right", no_wrap=True)
    table.add_column("nodes", overflow="fold", min_width=12)
    for model in fleet.models:
        plan, layout = model.plan, model.plan.layout
        name = Text(model.name)
        if model.version:
            name.append(f"\n{model.version}", style="dim")
        if not model.fits or layout is None:
            table.add_row(name, Text("no fit", style="bold red"), "-", "-",
                          str(model.target), "-")
            continue
        label, style = _DECISION[plan.decision]
        table.add_row(
            name,
            Text(f"{layout.tp} x {layout.pp}", style=style),
            f"{model.instances} x {_nodes(plan.nodes_per_instance)}",
            f"{model.per_instance} @ {plan.context:,}",
            f"{model.target} ({model.holds})",
            _nodes_cell(model),
        )
    return table


def fleet_lines(fleet: FleetPlan) -> Text:
    """Spare nodes, the verdict, and the models' notes."""
    text = Text()
    if fleet.fits:
        text.append(f"spare: {', '.join(fleet.spare) or 'none'}\n")
        text.append("fits", style="bold green")
        text.append(f": {fleet.nodes_needed} of {len(fleet.hosts)} node(s) assigned")
    else:
        text.append("does not fit", style="bold red")
        for problem in fleet.problems:
            text.append(f"\n  {problem}")
    notes: dict[str, list[str]] = {}
    for model in fleet.models:
        for note in model.plan.notes:
            notes.setdefault(note, []).append(model.name)
    for note, names in notes.items():
        text.append(f"\nnote ({', '.join(names)}): {note}", style="dim")
    for model in fleet.models:
        if model.fits and model.plan.network is not None:
            text.append(f"\ngroup network ({model.name}): {network_need(model.plan)}")
    return text


def check_table(checks: list[ModelCheck], inventory: str | None = None) -> Table:
    """Per model: what the plan wants against what the inventory has."""
    title = f"inventory {inventory} against the plan" if inventory else "inventory check"
    table = Table(title=title, title_justify="left", title_style="bold",
                  header_style="bold underline", box=None, padding=(0, 2, 0, 0),
                  pad_edge=False)
    table.add_column("model", no_wrap=True)
    table.add_column("planned", no_wrap=True)
    table.add_column("inventory", no_wrap=True)
    table.add_column("verdict")
    for check in checks:
        planned = "-" if check.planned_instances is None else (
            f"{check.planned_instances} x {_nodes(check.nodes_per_instance or 0)}")
        have = "\n".join(" + ".join(members) for members in check.instances) or "none"
        verdict = Text("ok: " if check.fits else "", style="bold green")
        verdict.append(check.message, style=None if check.fits else "yellow")
        table.add_row(check.name, planned, have, verdict)
    return table


def render_fleet(fleet: FleetPlan, console: Console | None = None,
                 checks: list[ModelCheck] | None = None, inventory: str | None = None,
                 overrides: list[str] | None = None) -> None:
    """Print the fleet table, the verdict and, with an inventory, its check and what the
    inventory would override of the files ``--write-vars`` writes."""
    console = console or Console()
    parts = [fleet_table(fleet), fleet_lines(fleet)]
    if checks is not None:
        parts += [Text(""), check_table(checks, inventory)]
    if overrides:
        text = Text("the inventory would override the plan's files (its host variables "
                    "outrank group_vars/<group>.yml); change these in the inventory:",
                    style="yellow")
        for line in overrides:
            text.append(f"\n  {line}")
        parts.append(text)
    console.print(Group(*parts))
