"""`inferfleet status --utilization`: figures from vLLM's /metrics text (the format its
Prometheus endpoint writes) and the advice on the fleet's size."""

import pytest

from inferfleet import utilization as u

METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="m"}} {running}
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="m"}} {waiting}
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} {kv}
# TYPE vllm:request_success_total counter
vllm:request_success_total{{engine="0",finished_reason="length",model_name="m"}} {served}
vllm:request_success_total{{engine="0",finished_reason="stop",model_name="m"}} 0.0
# TYPE http_request_duration_highr_seconds histogram
http_request_duration_highr_seconds_sum {busy}
"""


def text(running=0, waiting=0, kv=0.0, served=0, busy=0.0):
    return METRICS.format(running=running, waiting=waiting, kv=kv, served=served, busy=busy)


class Clock:
    """A clock that moves only when the code under test sleeps."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def test_samples_read_the_gauges_and_counters():
    s = u.Sample.of(text(running=3, waiting=1, kv=0.42, served=17, busy=12.5))
    assert (s.running, s.waiting, s.kv, s.served, s.busy) == (3, 1, 0.42, 17, 12.5)


def test_measure_rounds_peaks_and_averages():
    clock = Clock()
    # Instance a: 2 then 4 then 1 running; b: 1 running throughout.
    script = {
        "a": iter(
            [text(2, served=10, busy=0), text(4, kv=0.3, served=20), text(1, served=30, busy=6)]
        ),
        "b": iter([text(1, served=5, busy=0), text(1, served=6), text(1, served=7, busy=2)]),
    }
    usages, peak, seconds = u.measure(
        lambda n: next(script[n]), ["a", "b"], 2.0, clock=clock, sleep=clock.sleep
    )
    assert seconds == 2.0
    a, b = usages
    assert (a.requests, a.in_flight, a.peak_running, a.peak_kv) == (20, 3.0, 4, 0.3)
    assert (b.requests, b.in_flight) == (2, 1.0)
    assert peak == 5  # round two: 4 + 1


def use(name, requests=10, waiting=0, kv=0.1):
    return u.Usage(name, requests, 1.0, 1, waiting, kv)


@pytest.mark.parametrize(
    ("usages", "peak", "words"),
    [
        ([use("a", waiting=2), use("b")], 10, "under-provisioned: requests waited or the KV cache"),
        ([use("a"), use("b", kv=0.95)], 3, "over 90% on b; add an instance"),
        ([use("a"), use("b"), use("c")], 5, "fits on 1 instance(s) at 70% of max_num_seqs 8"),
        ([use("a"), use("b")], 11, "sized for the peak seen (11 requests in flight)"),
        ([use("a", requests=0), use("b", requests=0)], 0, "no traffic in the window"),
    ],
    ids=["waiting", "kv full", "over", "right", "idle"],
)
def test_advice(usages, peak, words):
    assert words in u.advice(usages, peak, max_num_seqs=8)


def test_over_provisioned_says_how_many_could_go():
    advice = u.advice([use("a"), use("b"), use("c"), use("d")], 11, max_num_seqs=8)
    assert "fits on 2 instance(s)" in advice and "could take out 2" in advice


def test_a_window_too_short_is_refused_before_any_request(tmp_path):
    from typer.testing import CliRunner

    from inferfleet.cli import app

    (tmp_path / "hosts.yml").write_text(
        "all:\n  children:\n    inference:\n      hosts:\n        n1:\n"
    )
    result = CliRunner().invoke(
        app, ["status", "-i", str(tmp_path / "hosts.yml"), "--utilization", "--window", "1"]
    )
    assert result.exit_code == 1
    assert "--window 1: measure over 2 seconds or more" in result.output
