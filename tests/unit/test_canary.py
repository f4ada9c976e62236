"""The canary's verdict: metrics parsing, histogram percentiles, the comparison's rows,
weights for a traffic share, golden prompt files, and the CLI's refusals."""

import math

import pytest
from typer.testing import CliRunner

from inferfleet import canary as c
from inferfleet.cli import app

# The shape of a vLLM engine's /metrics (HTTP metrics from prometheus-fastapi-instrumentator).
METRICS = """\
# HELP http_requests_total Total number of requests by method, status and handler.
# TYPE http_requests_total counter
http_requests_total{handler="/v1/completions",method="POST",status="2xx"} {ok}
http_requests_total{handler="/v1/completions",method="POST",status="5xx"} {bad}
http_requests_total{handler="/v1/models",method="GET",status="2xx"} 3.0
http_requests_total{handler="/metrics",method="GET",status="2xx"} 40.0
http_request_duration_highr_seconds_bucket{le="0.5"} {b05}
http_request_duration_highr_seconds_bucket{le="1.0"} {b1}
http_request_duration_highr_seconds_bucket{le="2.0"} {b2}
http_request_duration_highr_seconds_bucket{le="+Inf"} {inf}
vllm:e2e_request_latency_seconds_bucket{le="9.0",model_name="m"} 99.0
"""


def metrics(ok, bad, b05, b1, b2, inf):
    return (
        METRICS.replace("{ok}", str(ok))
        .replace("{bad}", str(bad))
        .replace("{b05}", str(b05))
        .replace("{b1}", str(b1))
        .replace("{b2}", str(b2))
        .replace("{inf}", str(inf))
    )


def test_snapshot_counts_v1_requests_and_5xx_and_reads_the_http_histogram():
    snap = c.Snapshot.of(metrics(10, 2, 1, 4, 9, 12))
    assert snap.requests == 15  # 10 + 2 completions + 3 /v1/models; /metrics not counted
    assert snap.errors == 2
    assert snap.buckets == {0.5: 1, 1.0: 4, 2.0: 9, math.inf: 12}


def test_snapshot_falls_back_to_vllms_latency_histogram():
    text = 'vllm:e2e_request_latency_seconds_bucket{le="0.3",model_name="m"} 2.0\n'
    assert c.Snapshot.of(text).buckets == {0.3: 2.0}


def test_the_window_is_the_difference_of_two_snapshots():
    before = c.Snapshot.of(metrics(10, 0, 0, 0, 10, 10))
    after = c.Snapshot.of(metrics(30, 0, 10, 20, 30, 30))
    window = (after - before).side()
    assert window.requests == 20 and window.errors == 0
    # 20 observations: 10 under 0.5 s, 10 between 0.5 and 1 s, none slower
    assert window.p50 == pytest.approx(0.5)
    assert window.p95 == pytest.approx(0.5 + 0.5 * (19 - 10) / 10)


def test_quantile_interpolates_inside_its_bucket_and_stops_at_the_last_bound():
    assert c.quantile({1.0: 0, 2.0: 10, math.inf: 10}, 0.5) == pytest.approx(1.5)
    assert c.quantile({1.0: 1, math.inf: 10}, 0.95) == 1.0
    assert math.isnan(c.quantile({1.0: 0, math.inf: 0}, 0.5))
    assert math.isnan(c.quantile({}, 0.5))


SAME = c.Side(requests=20, errors=0, p50=0.8, p95=1.2)
LIMITS = c.Thresholds()


def failed(rows):
    return [r.check for r in rows if not r.passed]


def test_a_canary_like_the_old_release_passes():
    golden = [(c.Golden("p"), "same text", "same text")]
    rows = c.judge(SAME, c.Side(40, 0, 0.75, 1.1), golden, LIMITS)
    assert failed(rows) == []
    assert [r.check for r in rows] == [
        "requests served",
        "error rate (5xx)",
        "latency p50",
        "latency p95",
        "golden 'p'",
    ]


def test_a_wrong_canary_fails_on_its_golden_answers():
    golden = [(c.Golden("p"), "other text", "same text"), (c.Golden("q"), "x", "x")]
    assert failed(c.judge(SAME, SAME, golden, LIMITS)) == ["golden 'p'"]


def test_a_slower_canary_fails_on_latency():
    slow = c.Side(20, 0, 0.8 * 1.6, 1.2 * 1.4)
    assert failed(c.judge(slow, SAME, [], LIMITS)) == ["latency p50"]


def test_a_failing_canary_fails_on_its_error_rate():
    assert failed(c.judge(c.Side(20, 1, 0.8, 1.2), SAME, [], LIMITS)) == ["error rate (5xx)"]
    # within the allowed increase
    lenient = c.Thresholds(max_error_rate_increase=0.05)
    assert failed(c.judge(c.Side(20, 1, 0.8, 1.2), SAME, [], lenient)) == []


def test_too_little_traffic_or_no_old_figures_is_no_pass():
    rows = c.judge(c.Side(2, 0, 0.8, 1.2), c.Side(0, 0, math.nan, math.nan), [], LIMITS)
    assert failed(rows) == ["requests served", "latency p50", "latency p95"]


def test_too_little_traffic_says_what_to_change():
    from inferfleet.commands.rollout import _too_few

    rows = c.judge(c.Side(0, 0, math.nan, math.nan), c.Side(0, 0, math.nan, math.nan), [], LIMITS)
    said = _too_few(rows, LIMITS, 60, load=0)
    assert "served 0 requests in 60 s" in said and "--canary-load N" in said
    assert "--canary-share" in _too_few(rows, LIMITS, 60, load=2)
    # enough requests: a regression is a regression, no advice about traffic
    assert _too_few(c.judge(c.Side(20, 0, 9.0, 9.0), SAME, [], LIMITS), LIMITS, 60, 0) == ""


def test_golden_answers_may_change_for_a_new_model_but_not_against_an_expectation():
    limits = c.Thresholds(golden_may_change=True)
    golden = [(c.Golden("p"), "new", "old"), (c.Golden("q", expect="want"), "got", "old")]
    rows = c.judge(SAME, SAME, golden, limits)
    assert failed(rows) == ["golden 'q'"]
    assert rows[-1].old == "expect 'want'"


def test_a_new_instance_short_of_its_kv_plan_fails_and_one_at_or_above_it_passes():
    figures = {
        "n1": {"logged": 524288, "planned": 524288, "tolerance_pct": 3.0},
        "n2": {"logged": 510000, "planned": 524288, "tolerance_pct": 3.0},  # -2.7 %
        "n3": {"logged": 262144, "planned": 524288, "tolerance_pct": 3.0},  # half
        "n4": {"logged": 1048576, "planned": 524288, "tolerance_pct": 3.0},  # more
        "n5": {"logged": None, "planned": 524288, "tolerance_pct": 3.0},
    }
    rows = c.kv_rows([(h.replace("n", "i"), h) for h in figures], figures)
    assert [r.passed for r in rows] == [True, True, False, True, False]
    assert rows[2].check == "KV cache of i3"
    assert (rows[2].canary, rows[2].old, rows[2].limit) == (
        "262144 tokens",
        "plan 524288 tokens",
        ">= plan - 3 %",
    )
    assert rows[4].canary == "not logged"


def test_no_kv_plan_no_kv_row():
    # a GPU engine without the preflight's plan, or a host the run did not start
    figures = {"gpu": {"logged": 90000, "planned": None, "tolerance_pct": 3.0}}
    assert c.kv_rows([("a", "gpu"), ("b", "elsewhere")], figures) == []


@pytest.mark.parametrize(
    "share, others, weight, expected",
    [
        (0.5, 1, 100, 100),
        (0.1, 9, 100, 100),
        (0.1, 1, 100, 11),
        (0.5, 9, 100, 256),
        (0.01, 1, 1, 1),
    ],
)
def test_weight_for_share(share, others, weight, expected):
    assert c.weight_for_share(share, others, weight) == expected


def test_weight_for_share_refuses_a_share_outside_0_and_1():
    with pytest.raises(ValueError, match="between 0 and 1"):
        c.weight_for_share(1.0, 1, 100)


def test_golden_prompts_from_a_file(tmp_path):
    path = tmp_path / "golden.yml"
    path.write_text("- Hello\n- {prompt: 'Two plus two is', expect: ' four'}\n")
    assert c.load_golden(path) == [c.Golden("Hello"), c.Golden("Two plus two is", " four")]
    assert len(c.load_golden(None)) == 3


@pytest.mark.parametrize(
    "text, words",
    [
        ("{}", "must hold a non-empty list"),
        ("- {expect: x}", "item 1 must be a prompt or {prompt, expect}"),
        ("- {prompt: a, expect: 3}", "item 1's expect must be a string"),
        ("- [unclosed", "is not YAML or JSON"),
    ],
)
def test_bad_golden_files_say_what_is_wrong(tmp_path, text, words):
    path = tmp_path / "golden.yml"
    path.write_text(text)
    with pytest.raises(ValueError, match=words.replace("{", r"\{").replace("[", r"\[")):
        c.load_golden(path)


@pytest.mark.parametrize(
    "args, words",
    [
        (["--canary-share", "100"], "give a percentage above 0 and below 100"),
        (["--canary-seconds", "0"], "--canary-seconds must be above 0"),
        (["--max-latency-ratio", "0.5"], "--max-latency-ratio must be 1 or more"),
        (["--golden", "/nonexistent.yml"], "golden prompts file /nonexistent.yml does not exist"),
    ],
)
def test_bad_canary_options_are_one_line_before_any_run(tmp_path, args, words):
    inv = tmp_path / "inv"
    inv.mkdir()
    (inv / "hosts.yml").write_text("all: {}\n")
    result = CliRunner().invoke(app, ["rollout", "--canary", *args, "-i", str(inv)])
    assert result.exit_code == 1 and words in result.output, result.output
    assert "Traceback" not in result.output


def test_a_canary_needs_two_instances(tmp_path):
    inv = tmp_path / "inv"
    inv.mkdir()
    (inv / "hosts.yml").write_text(
        "all:\n  children:\n    inference:\n      hosts: {n1: {}}\n    loadbalancers:\n"
        "      hosts: {lb: {}}\n"
    )
    result = CliRunner().invoke(app, ["rollout", "--canary", "-i", str(inv)])
    assert result.exit_code == 1 and "--canary needs two instances or more" in result.output


def test_the_canary_answers_its_golden_prompts_before_it_takes_a_share(tmp_path, monkeypatch):
    """_canary with its playbooks, the watch and the engines stood in for (molecule's
    replicated scenario runs them for real): the golden prompts go to the canary and the
    old instance before the canary's weight is set, so a just-started engine's first,
    slow answers fall outside the latency window; the weight goes back after the watch."""
    from types import SimpleNamespace

    from inferfleet.commands import rollout as cmd

    inv = tmp_path / "inv"
    inv.mkdir()
    (inv / "hosts.yml").write_text(
        "all:\n  vars: {inferfleet_model_name: tiny, inferfleet_model_version: v1}\n"
        "  children:\n    inference:\n      hosts: {n1: {}, n2: {}}\n    loadbalancers:\n"
        "      hosts: {lb: {}}\n"
    )
    events = []

    def run_playbook(name, playbook, inventory, extra_vars=None, limit=None, console=None):
        events.append((name, (extra_vars or {}).get("rollout_weights")))
        return SimpleNamespace(rc=0, record=str(tmp_path / "record.json"), failures=[])

    def complete(base, model, key, prompt):
        events.append(("golden", prompt))
        return SimpleNamespace(text="the same answer")

    good = c.Side(requests=10, errors=0, p50=0.1, p95=0.2)
    monkeypatch.setattr(cmd, "run_playbook", run_playbook)
    monkeypatch.setattr(cmd.v, "complete", complete)
    monkeypatch.setattr(cmd, "watch", lambda *a: events.append(("watch", None)) or (good, good))
    monkeypatch.setattr(cmd, "add_to_record", lambda *a, **k: None)
    monkeypatch.setattr(cmd, "print_summary", lambda *a: None)
    cmd._canary(inv, "tiny", {}, c.Thresholds(), [c.Golden("q")], 0.1, 1.0, 0, 0)
    assert [name for name, _ in events] == [
        "rollout canary", "golden", "golden", "canary weight", "watch", "canary weight",
        "rollout"]
    assert events[5] == ("canary weight", {"n1": "100%"})
