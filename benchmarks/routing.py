"""What routing does to the engines' prefix caches: one shared-prefix workload, measured
straight to one engine and through the lab's HAProxy under each routing mode.

Needs the lab (`inferfleet lab up`, its engines with prefix caching, vLLM's default) and
guidellm in its own environment (`make bench-routing` creates .venv-bench from
benchmarks/requirements.txt). The load is guidellm's (0.8.1): synthetic prompts of
`--prefix-tokens` drawn at random from `--prefixes` distinct prefixes (think tenants'
system prompts or documents) followed by `--suffix-tokens` of their own, `--concurrency`
streams, `--requests` requests per phase. Every phase draws new prefixes (its own seed),
so no phase finds another's in the caches.

Phases: `single` sends the workload straight to the first engine (the best any routing
can do for the hit rate: one cache sees every prefix); then, for each `--modes` entry,
site.yml sets `load_balancer_routing` on the lab's load balancer (`prefix/200` sets
load_balancer_prefix_balance_factor 200 as well, `prefix` leaves the inventory's;
`cache_aware/8` sets load_balancer_router_balance_abs_threshold 8) and
the workload goes through it. The inventory's own setting is put back at the end.
`cache_aware` (vllm-router beside HAProxy) needs a lab made with `lab up --routing
cache_aware`: its engines serve the render endpoints the router reads token ids from,
and its load balancer has the router's wheels.

Per phase: the fleet's token hit rate (the engines' vllm:prefix_cache_hits_total over
_queries_total), that rate against `single`'s, TTFT p50/p90 and output tokens/s (from
guidellm), and the skew (max/mean requests per engine, from vllm:request_success_total).
When leastconn reaches 0.7 of `single` the workload revisits too few prefixes to tell
routings apart, and the run says so. A phase with a failed request says so and the run
exits 1 without ratios.

    make bench-routing
    .venv/bin/python benchmarks/routing.py [--modes leastconn,prefix,cache_aware] [--prefixes 200]
        [--prefix-tokens 512] [--suffix-tokens 48] [--requests 400] [--concurrency 4]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from load_client import guidellm, require
from rich.console import Console

from inferfleet.commands.common import LAB_INVENTORY
from inferfleet.fleet import load
from inferfleet.runner import run_playbook
from inferfleet.verify import get, metric_sums


def counters(fleet) -> dict[str, dict[str, float]]:
    """Each serving engine's prefix-cache and request counters."""
    out = {}
    for node in fleet.serving:
        status, text = get(f"{node.base}/metrics", fleet.engine_key)
        if status != 200:
            sys.exit(f"{node.host}'s /metrics answered {status}: is the lab up?")
        sums = metric_sums(text.splitlines())
        out[node.host] = {
            "queries": sums.get("vllm:prefix_cache_queries_total", 0.0),
            "hits": sums.get("vllm:prefix_cache_hits_total", 0.0),
            "requests": sums.get("vllm:request_success_total", 0.0),
        }
    return out


def set_routing(lb: str, mode: str | None) -> None:
    """site.yml on the load balancer alone: `mode` (None: the inventory's own)."""
    extra = {}
    if mode:
        routing, _, number = mode.partition("/")
        extra = {"load_balancer_routing": routing}
        if number:
            setting = ("load_balancer_router_balance_abs_threshold" if routing == "cache_aware"
                       else "load_balancer_prefix_balance_factor")
            extra[setting] = int(number)
    quiet = Console(quiet=True)
    result = run_playbook("bench-routing", "site.yml", LAB_INVENTORY, extra_vars=extra, limit=lb,
                          console=quiet)
    if result.rc != 0:
        sys.exit(f"site.yml for routing {mode or 'as inventoried'} failed (rc {result.rc}); "
                 f"{'; '.join(result.failures)} (record: {result.record})")
    # The reload hands the listeners over; the old process finishes what it holds.
    time.sleep(5)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--modes", default=None,
                   help="routings to compare (default leastconn,prefix, and cache_aware on a "
                        "lab made with `lab up --routing cache_aware`)")
    p.add_argument("--prefixes", type=int, default=200)
    p.add_argument("--prefix-tokens", type=int, default=512)
    p.add_argument("--suffix-tokens", type=int, default=48)
    p.add_argument("--output-tokens", type=int, default=16)
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--seed", type=int, default=int(time.time()) % 100000,
                   help="the first phase's data seed (each phase its own: prefixes never seen)")
    args = p.parse_args()
    require()
    fleet = load(LAB_INVENTORY)
    if len(fleet.serving) < 2 or not fleet.balancers:
        sys.exit("the lab needs two engines and a load balancer: `inferfleet lab up`")
    lb = "inferfleet-lab-lb"
    if args.modes is None:
        args.modes = "leastconn,prefix" + (",cache_aware" if fleet.routing == "cache_aware" else "")
    if any(m.startswith("cache_aware") for m in args.modes.split(",")) and (
            fleet.routing != "cache_aware"):
        sys.exit("mode cache_aware needs a lab made for it: `inferfleet lab up --routing "
                 "cache_aware` (its engines serve the render endpoints its router reads)")
    rows: list[tuple[str, dict]] = []
    print(f"workload: {args.prefixes} prefixes x {args.prefix_tokens} tokens, "
          f"+{args.suffix_tokens} tokens each, {args.output_tokens} out, {args.requests} requests "
          f"at concurrency {args.concurrency}, seed {args.seed}; {len(fleet.serving)} engines of "
          f"{fleet.model}",
          flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        phases = [("single", None)] + [(m, m) for m in args.modes.split(",")]
        try:
            for seed, (name, mode) in enumerate(phases, start=args.seed):
                if mode:
                    set_routing(lb, mode)
                target = fleet.serving[0].base if mode is None else fleet.balancers[0]
                key = fleet.engine_key if mode is None else fleet.api_key
                before = counters(fleet)
                row = guidellm(
                    target, key, fleet.model, streams=args.concurrency, requests=args.requests,
                    data={"prompt_tokens": args.suffix_tokens, "output_tokens": args.output_tokens,
                          "prefix_tokens": args.prefix_tokens, "prefix_count": args.prefixes},
                    seed=seed, work=work)
                after = counters(fleet)
                delta = {h: {k: after[h][k] - before[h][k] for k in after[h]} for h in after}
                queries = sum(d["queries"] for d in delta.values())
                row["hit_rate"] = sum(d["hits"] for d in delta.values()) / queries if queries else 0
                served = [d["requests"] for d in delta.values()]
                row["served"] = served
                row["skew"] = max(served) / (sum(served) / len(served)) if sum(served) else 0
                rows.append((name, row))
                print(f"  {name}: {row}", flush=True)
        finally:
            if any(mode for _, mode in phases[: len(rows) + 1]):
                set_routing(lb, None)
    failed = [(n, r["failed"]) for n, r in rows if r["failed"]]
    print(f"\n{'phase':14} {'ok':>5} {'failed':>6} {'hit rate':>9} {'x single':>9}"
          f" {'TTFT p50':>9} {'TTFT p90':>9} {'tok/s':>8} {'skew':>5}  requests per engine")
    single = rows[0][1]["hit_rate"]
    for name, r in rows:
        ratio = "" if failed or not single else f"{r['hit_rate'] / single:.2f}"
        skew = "" if name == "single" else f"{r['skew']:.2f}"
        print(f"{name:14} {r['ok']:5d} {r['failed']:6d} {r['hit_rate']:9.3f} {ratio:>9}"
              f" {r['ttft_p50']:9.3f} {r['ttft_p90']:9.3f} {r['tokens_s']:8.1f} {skew:>5}"
              f"  {', '.join(str(int(s)) for s in r['served'])}")
    if failed:
        print(f"\nFAILED: requests failed in {failed}; no ratios.")
        return 1
    lc = dict(rows).get("leastconn")
    if lc and single and lc["hit_rate"] / single >= 0.7:
        print("\nleastconn reached 0.7 of one engine's hit rate: this workload revisits too few "
              "prefixes to tell routings apart (more prefixes, fewer requests each).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
