"""The fabric preflight's verdict: pure functions over what each member of an instance
reported, so the role and the unit tests (tests/unit/test_gpu_fabric.py) share them."""

from __future__ import annotations

MIB = 1024 * 1024


def _mib(value):
    return None if value is None else int(value) // MIB


def _differs(members, key):
    values = {m.get(key) for m in members}
    return len(values) > 1


def _listing(members, key, unit=""):
    return ", ".join(
        f"{m['host']} {m.get(key) if m.get(key) is not None else 'unknown'}{unit}" for m in members
    )


def fabric_problems(members, settings):
    """Every problem of one instance's members, each naming the node or the link."""
    problems = []
    if len(members) < 2:
        return problems
    for m in members:
        if m.get("missing"):
            problems.append(
                f"{m['host']}: reported nothing (it failed earlier, or this play does not include"
                " it: run the preflight on every member of the instance)"
            )
    members = [m for m in members if not m.get("missing")]
    if len(members) < 2:
        return problems
    for m in members:
        if not m.get("interface_found", True):
            problems.append(
                f"{m['host']}: interface {m.get('interface') or '(default route)'} not found "
                "(set fabric_preflight_interface to the interface the members talk over)"
            )
    required = settings.get("mtu")
    if required:
        for m in members:
            if m.get("mtu") != int(required):
                problems.append(
                    f"{m['host']}: MTU of {m.get('interface')} is {m.get('mtu')}, not {required}"
                )
    elif _differs(members, "mtu"):
        problems.append(
            f"MTU differs across the instance: {_listing(members, 'mtu')} (on "
            f"{', '.join(sorted({str(m.get('interface')) for m in members}))}); make it the same"
        )
    for m in members:
        for probe in m.get("ports", []):
            if not probe.get("ok"):
                problems.append(
                    f"link {m['host']} -> {probe['to']} ({probe.get('address')}:{probe['port']}): "
                    f"cannot connect{': ' + probe['msg'] if probe.get('msg') else ''}"
                )
    if settings.get("require_clock_sync", True):
        for m in members:
            if m.get("clock_synchronized") is not True:
                state = "not synchronised" if m.get("clock_synchronized") is False else "unknown"
                source = m.get("clock_source") or "no chrony, no timedatectl"
                problems.append(f"{m['host']}: clock {state} ({source})")
    times = [m["time"] for m in members if m.get("time") is not None]
    if len(times) > 1 and max(times) - min(times) > float(settings.get("max_skew", 2.0)):
        first = min(members, key=lambda m: m.get("time") or 0)
        last = max(members, key=lambda m: m.get("time") or 0)
        problems.append(
            f"clocks differ by {max(times) - min(times):.1f} s between {first['host']} and "
            f"{last['host']} (at most {settings.get('max_skew')} s)"
        )
    shm_min = int(settings.get("shm_min_mib", 0))
    for m in members:
        shm = _mib(m.get("shm_bytes"))
        if shm is None or shm < shm_min:
            problems.append(
                f"{m['host']}: /dev/shm is {shm if shm is not None else 'missing'} MiB, "
                f"below {shm_min} MiB"
            )
    problems += link_problems(members, settings)
    keys = [("engine_version", "engine versions")]
    if settings.get("accelerator") == "nvidia":
        keys = [
            ("driver_version", "driver versions"),
            ("cuda_version", "CUDA versions"),
            ("gpu_count", "GPU counts"),
        ] + keys
    for key, what in keys:
        if _differs(members, key):
            problems.append(f"{what} differ: {_listing(members, key)}")
    return problems


def link_problems(members, settings):
    """Each measured link (a member to the next by rank) against what the pipeline needs
    (`inferfleet plan`'s group network): both figures named."""
    problems = []
    need_gbit = float(settings.get("min_bandwidth_gbit") or 0)
    need_rtt = float(settings.get("max_rtt_ms") or 0)
    for m in members:
        link = m.get("link")
        if not link:
            continue
        name = f"link {m['host']} -> {link['to']} ({link.get('address')})"
        if link.get("gbit") is None:
            problems.append(f"{name}: bandwidth not measured: {link.get('error') or 'no result'}")
        elif need_gbit and link["gbit"] < need_gbit:
            problems.append(
                f"{name}: bandwidth {link['gbit']:g} Gbit/s, the pipeline needs {need_gbit:g} "
                "Gbit/s (fabric_preflight_min_bandwidth_gbit)"
            )
        if link.get("rtt_ms") is None:
            problems.append(f"{name}: round trip not measured (ping had no answer)")
        elif need_rtt and link["rtt_ms"] > need_rtt:
            problems.append(
                f"{name}: round trip {link['rtt_ms']:g} ms, the pipeline tolerates {need_rtt:g} "
                "ms (fabric_preflight_max_rtt_ms)"
            )
    return problems


def fabric_report(members, instance):
    """One line per member: what the preflight saw."""
    lines = [f"instance {instance}:"]
    for m in members:
        if m.get("missing"):
            lines.append(f"  {m['host']}: no report")
            continue
        parts = [
            f"  rank {m.get('rank')} {m['host']}: {m.get('interface')} {m.get('address')}"
            f" mtu {m.get('mtu')}",
            f"shm {_mib(m.get('shm_bytes'))} MiB",
            f"clock {'synced' if m.get('clock_synchronized') else 'NOT synced'}"
            f" ({m.get('clock_source') or '-'})",
        ]
        if m.get("driver_version") is not None:
            parts.append(
                f"driver {m.get('driver_version')} CUDA {m.get('cuda_version')}"
                f" {m.get('gpu_count')} GPU(s)"
            )
        parts.append(f"engine {m.get('engine_version') or '-'}")
        bad = [p for p in m.get("ports", []) if not p.get("ok")]
        parts.append(
            f"ports {len(m.get('ports', [])) - len(bad)}/{len(m.get('ports', []))} reachable"
        )
        link = m.get("link")
        if link:
            gbit, rtt = link.get("gbit"), link.get("rtt_ms")
            parts.append(
                f"link to {link['to']}: {'-' if gbit is None else f'{gbit:g}'} Gbit/s, "
                f"round trip {'-' if rtt is None else f'{rtt:g}'} ms"
            )
        lines.append(", ".join(parts))
    return lines


class FilterModule:
    def filters(self):
        return {
            "fabric_preflight_problems": fabric_problems,
            "fabric_preflight_report": fabric_report,
        }
