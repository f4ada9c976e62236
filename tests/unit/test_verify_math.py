import math

from inferfleet.verify import busy_seconds, percentile, served_requests, spread_is_even


def test_nearest_rank_percentiles():
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 95) == 95.0
    assert percentile(values, 99) == 99.0
    assert percentile([3.0], 99) == 3.0
    assert math.isnan(percentile([], 50))


def test_served_requests_sums_every_finish_reason():
    text = """# HELP vllm:request_success_total Count of successfully processed requests.
vllm:request_success_total{engine="0",finished_reason="stop",model_name="tiny"} 3.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="tiny"} 12.0
vllm:request_success_created{engine="0",finished_reason="stop",model_name="tiny"} 1.7e9
"""
    assert served_requests(text) == 15.0
    assert served_requests("") == 0.0


def test_spread():
    assert spread_is_even({"a": 50, "b": 50})
    assert spread_is_even({"a": 60, "b": 40})
    assert not spread_is_even({"a": 90, "b": 10})
    assert not spread_is_even({"a": 0, "b": 0})


E2E = """vllm:e2e_request_latency_seconds_bucket{engine="0",le="0.3",model_name="tiny"} 4.0
vllm:e2e_request_latency_seconds_count{engine="0",model_name="tiny"} 9.0
vllm:e2e_request_latency_seconds_sum{engine="0",model_name="tiny"} 2.5
"""


def test_busy_seconds_is_the_http_duration_sum_where_the_balancer_sees_requests():
    text = E2E + """http_request_duration_highr_seconds_bucket{le="0.5"} 8.0
http_request_duration_highr_seconds_count 9.0
http_request_duration_highr_seconds_sum 3.75
"""
    assert busy_seconds(text) == 3.75


def test_busy_seconds_falls_back_to_the_e2e_latency_sum_not_its_buckets():
    assert busy_seconds(E2E) == 2.5
    assert busy_seconds("") == 0.0
