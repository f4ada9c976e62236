"""guidellm (0.8.1, in .venv-bench: `make .venv-bench/bin/guidellm`) as the benchmarks'
load client: one run of `streams` requests in flight (or, given `rate`, one request every
1/rate s, guidellm's constant schedule: the same offered load whatever the answers take)
until `requests` are done, on synthetic prompts counted with the lab model's own
tokenizer; its figures, without the first `warmup` requests. Not guidellm's poisson
schedule: in 0.8.1 its workers do not see the start time, and it sent every request at
once here (its report's targeted start delays were the Unix epoch's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from inferfleet.commands.lab import CACHE

REPO = Path(__file__).resolve().parents[1]
GUIDELLM = REPO / ".venv-bench" / "bin" / "guidellm"


def require() -> None:
    if not GUIDELLM.exists():
        sys.exit(f"{GUIDELLM} is missing: `make .venv-bench/bin/guidellm` installs it")


def tokenizer(model: str) -> Path:
    """The lab's copy of the model's files (tokenizer.json): guidellm counts tokens with it."""
    found = sorted((CACHE / model).glob("*/tokenizer.json"))
    if not found:
        sys.exit(f"no tokenizer for {model} under {CACHE}: run `inferfleet lab up` first")
    return found[0].parent


def guidellm(target: str, key: str, model: str, *, streams: int, requests: int, data: dict,
             seed: int, work: Path, rate: float | None = None, warmup: int = 0) -> dict:
    """One guidellm run against `target` (data: guidellm's synthetic_text settings); its
    figures. The scenario file holds the key: 0600, removed after."""
    scenario = work / f"scenario-{seed}.json"
    report = work / f"report-{seed}.json"
    profile = ({"kind": "constant", "rate": [rate]} if rate
               else {"kind": "concurrent", "streams": [streams]})
    if warmup:
        profile["warmup"] = {"value": warmup, "mode": "requests"}
    spec = {
        "backend": {"kind": "openai_http", "target": target, "model": model, "api_key": key,
                    "request_format": "/v1/completions", "validate_backend": False},
        "profile": profile,
        "data": [{"kind": "synthetic_text", **data}],
        "constraints": [{"kind": "max_requests", "count": requests}],
        "tokenizer": {"kind": "huggingface_auto", "model": str(tokenizer(model))},
        "seed": {"kind": "static", "value": seed},
        "outputs": [{"kind": "json", "path": str(report)}],
    }
    fd = os.open(scenario, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"spec": spec}, f)
    try:
        run = subprocess.run(
            [str(GUIDELLM), "run", "--scenario", str(scenario), "--disable-console-interactive"],
            capture_output=True, text=True, timeout=3600)
    finally:
        scenario.unlink()
    if run.returncode != 0 or not report.exists():
        sys.exit(f"guidellm failed ({run.returncode}):\n{(run.stdout + run.stderr)[-3000:]}")
    return figures(json.loads(report.read_text()))


def figures(report: dict) -> dict:
    """Requests measured, failures (the warm-up's too), requests/s, latency p50/p99 (s),
    TTFT p50/p90 (s) and output tokens/s from guidellm's report."""
    metrics = report["benchmarks"][0]["metrics"]
    totals = metrics["request_totals"]
    # what the scheduler made, the warm-up's requests too: a failure there is a failure
    made = report["benchmarks"][0]["scheduler_metrics"]["requests_made"]
    ttft = metrics["time_to_first_token_ms"]["successful"]["percentiles"]
    latency = metrics["request_latency"]["successful"]["percentiles"]
    return {
        "ok": totals["successful"],
        "failed": max(totals["errored"] + totals["incomplete"],
                      made["errored"] + made["incomplete"]),
        "req_s": metrics["requests_per_second"]["successful"]["mean"],
        "p50": latency["p50"],
        "p99": latency["p99"],
        "ttft_p50": ttft["p50"] / 1000,
        "ttft_p90": ttft["p90"] / 1000,
        "tokens_s": metrics["output_tokens_per_second"]["successful"]["mean"],
    }
