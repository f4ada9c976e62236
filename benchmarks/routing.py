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
_queries_total), that rate against `single`'s, TTFT p50/p90, requests/s and output
tokens/s (from guidellm), the skew (max/mean requests per engine, from
vllm:request_success_total) and the mean prompt in the engines' own tokens
(vllm:prompt_tokens_total per request: the workload's sizes are guidellm's counts with
the lab model's tokenizer, which a simulated engine, counting words, does not share);
with a leastconn phase, each phase's p90 TTFT gain over leastconn's (its p90 over this
one's) and tokens/s against leastconn's. When leastconn reaches 0.7 of `single` the
workload revisits too few prefixes to tell routings apart, and the run says so. A phase
with a failed request (in its warm-up too) says so and the run exits 1 without ratios.

`--rate R` compares the routings at the same offered load: a request every 1/R s
(guidellm's constant schedule) whatever they take, so a routing that makes the engines
slower shows as queueing rather than as fewer requests sent; there is no `single` phase
then (one engine cannot take a fleet's rate). `--warmup N` leaves each phase's first N
requests out of every figure: they fill the caches, and what is measured is the steady
state (the hit rates and skew are counted from when the engines have finished N).

    make bench-routing
    .venv/bin/python benchmarks/routing.py [--modes leastconn,prefix,cache_aware] [--prefixes 200]
        [--prefix-tokens 512] [--suffix-tokens 48] [--requests 400] [--concurrency 4]
        [--rate R] [--warmup N]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

from load_client import guidellm, require
from rich.console import Console

from inferfleet.commands.common import LAB_INVENTORY
from inferfleet.fleet import load
from inferfleet.runner import run_playbook
from inferfleet.verify import get, metric_sums


def counters(fleet) -> dict[str, dict[str, float]]:
    """Each serving engine's prefix-cache, request and prompt-token counters."""
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
            "prompt_tokens": sums.get("vllm:prompt_tokens_total", 0.0),
        }
    return out


def watch_warmup(fleet, before: dict, warmup: int, done: threading.Event, out: dict) -> None:
    """Put the engines' counters in `out` once they have finished `warmup` requests more
    than in `before` (polled each second until `done`)."""
    start = sum(c["requests"] for c in before.values())
    while not done.wait(1.0):
        now = counters(fleet)
        if sum(c["requests"] for c in now.values()) - start >= warmup:
            out.update(now)
            return


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
    p.add_argument("--rate", type=float, default=None,
                   help="requests a second (one every 1/R s) in every routed phase instead of "
                        "--concurrency streams; no single-engine phase")
    p.add_argument("--warmup", type=int, default=0,
                   help="requests at the start of each phase left out of its figures")
    p.add_argument("--seed", type=int, default=int(time.time()) % 100000,
                   help="the first phase's data seed (each phase its own: prefixes never seen)")
    args = p.parse_args()
    if args.rate is not None and args.rate <= 0:
        p.error("--rate must be above 0 (requests a second)")
    if not 0 <= args.warmup < args.requests:
        p.error("--warmup must be 0 or more and fewer than --requests")
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
    offered = (f"{args.rate:g} requests/s" if args.rate
               else f"concurrency {args.concurrency}")
    print(f"workload: {args.prefixes} prefixes x {args.prefix_tokens} tokens, "
          f"+{args.suffix_tokens} tokens each, {args.output_tokens} out, {args.requests} requests "
          f"at {offered}, the first {args.warmup} not measured, seed {args.seed}; "
          f"{len(fleet.serving)} engines of {fleet.model}",
          flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        phases = [] if args.rate else [("single", None)]
        phases += [(m, m) for m in args.modes.split(",")]
        try:
            for seed, (name, mode) in enumerate(phases, start=args.seed):
                if mode:
                    set_routing(lb, mode)
                target = fleet.serving[0].base if mode is None else fleet.balancers[0]
                key = fleet.engine_key if mode is None else fleet.api_key
                before = counters(fleet)
                warm, done = {}, threading.Event()
                if args.warmup:
                    watcher = threading.Thread(
                        target=watch_warmup, args=(fleet, before, args.warmup, done, warm),
                        daemon=True)
                    watcher.start()
                try:
                    row = guidellm(
                        target, key, fleet.model, streams=args.concurrency, rate=args.rate,
                        requests=args.requests, warmup=args.warmup,
                        data={"prompt_tokens": args.suffix_tokens,
                              "output_tokens": args.output_tokens,
                              "prefix_tokens": args.prefix_tokens, "prefix_count": args.prefixes},
                        seed=seed, work=work)
                finally:
                    done.set()
                after = counters(fleet)
                if args.warmup:
                    watcher.join()
                    if not warm:
                        sys.exit(f"{name}: the engines' counters were not read between the "
                                 f"{args.warmup} warm-up requests and the end: send more after "
                                 "them (--requests)")
                    before = warm
                delta = {h: {k: after[h][k] - before[h][k] for k in after[h]} for h in after}
                queries = sum(d["queries"] for d in delta.values())
                row["hit_rate"] = sum(d["hits"] for d in delta.values()) / queries if queries else 0
                served = [d["requests"] for d in delta.values()]
                row["prompt"] = (sum(d["prompt_tokens"] for d in delta.values()) / sum(served)
                                 if sum(served) else 0)
                row["served"] = served
                row["skew"] = max(served) / (sum(served) / len(served)) if sum(served) else 0
                rows.append((name, row))
                print(f"  {name}: {row}", flush=True)
        finally:
            if any(mode for _, mode in phases[: len(rows) + 1]):
                set_routing(lb, None)
    failed = [(n, r["failed"]) for n, r in rows if r["failed"]]
    by_name = dict(rows)
    single, lc = by_name.get("single"), by_name.get("leastconn")
    print(f"\n{'phase':14} {'ok':>5} {'failed':>6} {'hit rate':>9} {'x single':>9}"
          f" {'TTFT p50':>9} {'TTFT p90':>9} {'p90 gain':>9} {'req/s':>7} {'tok/s':>8}"
          f" {'x lc':>5} {'skew':>5} {'prompt':>7}  requests per engine")
    for name, r in rows:
        ratio = gain = tokens = ""
        if not failed and single and single["hit_rate"]:
            ratio = f"{r['hit_rate'] / single['hit_rate']:.2f}"
        if not failed and lc and name != "single":
            gain = f"{lc['ttft_p90'] / r['ttft_p90']:.2f}"
            tokens = f"{r['tokens_s'] / lc['tokens_s']:.2f}"
        skew = "" if name == "single" else f"{r['skew']:.2f}"
        print(f"{name:14} {r['ok']:5d} {r['failed']:6d} {r['hit_rate']:9.3f} {ratio:>9}"
              f" {r['ttft_p50']:9.3f} {r['ttft_p90']:9.3f} {gain:>9} {r['req_s']:7.2f}"
              f" {r['tokens_s']:8.1f} {tokens:>5} {skew:>5} {r['prompt']:7.0f}"
              f"  {', '.join(str(int(s)) for s in r['served'])}")
    if failed:
        print(f"\nFAILED: requests failed in {failed}; no ratios.")
        return 1
    if args.rate and any(r["req_s"] < 0.9 * args.rate for _, r in rows):
        print(f"\nA phase served under 0.9 of the offered {args.rate:g} requests/s: the fleet "
              "(or this machine) could not keep up, and its figures include the backlog.")
    if lc and single and single["hit_rate"] and lc["hit_rate"] / single["hit_rate"] >= 0.7:
        print("\nleastconn reached 0.7 of one engine's hit rate: this workload revisits too few "
              "prefixes to tell routings apart (more prefixes, fewer requests each).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
