"""The simulated engine (roles/inference_engine/files/sim_engine.py): its latency model
against its own profile, on a clock the test advances, and its HTTP surface on loopback,
read with the parsers that verify and status use on a real vLLM."""

import dataclasses
import importlib.util
import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from inferfleet.verify import metric_sums

FILES = Path(__file__).parents[2] / "roles/inference_engine/files"
spec = importlib.util.spec_from_file_location("sim_engine", FILES / "sim_engine.py")
sim = sys.modules["sim_engine"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sim)

L4 = sim.Profile.load(str(FILES / "sim_profiles/l4-qwen2.5-0.5b.json"))


def run(scheduler, seqs, until=None):
    """Drive the scheduler on a virtual clock until every sequence is done (or `until`
    steps); returns the clock."""
    for seq in seqs:
        scheduler.add(seq)
    now, steps = 0.0, 0
    while (scheduler.waiting or scheduler.running) and (until is None or steps < until):
        seconds, stepped = scheduler.step(now)
        assert stepped, "a step with work must step someone"
        now += seconds
        scheduler.finish_step(now, stepped)
        steps += 1
    return now


def seq(tokens, max_tokens=4):
    return sim.Sequence(list(tokens), max_tokens, 0.0)


def test_the_default_profile_gives_its_published_figures():
    one = seq(range(256), max_tokens=2)
    run(sim.Scheduler(L4), [one])
    assert one.first_token == pytest.approx(0.027, rel=0.05)  # TTFT p50 27.0 ms
    assert one.token_times[1] - one.token_times[0] == pytest.approx(0.0051, rel=0.05)
    batch = [seq(range(i * 1000, i * 1000 + 256), max_tokens=128) for i in range(32)]
    scheduler = sim.Scheduler(L4)
    run(scheduler, batch, until=65)  # mid-way: 32 running, about 320 tokens of context each
    seconds, _ = scheduler.step(0.0)
    assert seconds == pytest.approx(0.0071, rel=0.05)  # ITL p50 7.1 ms at concurrency 32


PROFILES = sorted((FILES / "sim_profiles").glob("*.json"))


@pytest.mark.parametrize("path", PROFILES, ids=lambda p: p.stem)
def test_every_shipped_profile_loads_under_its_own_name_and_says_where_it_came_from(path):
    profile = sim.Profile.load(str(path))
    assert profile.name == path.stem
    assert "measured" in profile.source.lower() or "published" in profile.source.lower()


def test_the_h100_profile_gives_the_decode_steps_measured_on_the_gpu_machine():
    """docs/gpu-validation.md: measure.py on an H100 (2026-12-05), 8B shape: a decode step
    of 1 sequence at 512 tokens of context took 7.66 ms, of 128 at 2048 tokens 19.7 ms."""
    h100 = sim.Profile.load(str(FILES / "sim_profiles/h100-sxm-llama-3.1-8b.json"))
    for running, context, measured in ((1, 512, 0.00766), (128, 2048, 0.0197)):
        scheduler = sim.Scheduler(h100)
        run(scheduler, [seq(range(i * 10000, i * 10000 + context), 8) for i in range(running)], 1)
        seconds, _ = scheduler.step(0.0)  # all admitted and prefilled: a decode step alone
        assert seconds == pytest.approx(measured, rel=0.05)


def test_time_to_first_token_grows_with_uncached_prompt_tokens():
    short, long = seq(range(100)), seq(range(2000))
    run(sim.Scheduler(L4), [short])
    run(sim.Scheduler(L4), [long])
    expected = (2000 - 100) * L4.prefill_per_token_ms / 1000
    assert long.first_token - short.first_token == pytest.approx(expected, rel=0.02)


def test_a_cached_prefix_cuts_the_time_to_first_token():
    scheduler = sim.Scheduler(L4)
    first = seq(range(1000))
    run(scheduler, [first])
    again = seq([*range(1000), 5000, 5001])  # the same 1000 tokens and two more
    start = scheduler.hits
    run(scheduler, [again])
    cached = 1000 // L4.block_size * L4.block_size
    assert scheduler.hits - start == cached == again.cached_tokens
    assert again.first_token < first.first_token - (cached - 50) * L4.prefill_per_token_ms / 1000
    other = seq(range(7000, 8000))  # no shared prefix: no hit
    run(scheduler, [other])
    assert other.cached_tokens == 0


def test_the_least_recently_used_prefix_is_evicted_first():
    small = dataclasses.replace(L4, kv_blocks=10, block_size=16)
    scheduler = sim.Scheduler(small)
    a, b = seq(range(64), max_tokens=1), seq(range(100, 164), max_tokens=1)
    run(scheduler, [a])
    run(scheduler, [b])  # 4 cached blocks each: 8 of 10 used by the cache
    run(scheduler, [seq(range(64), max_tokens=1)])  # a is used again: b is now older
    c = seq(range(200, 248), max_tokens=1)  # needs 4 blocks: evicts b's, not a's
    run(scheduler, [c])
    a_again, b_again = seq(range(64), max_tokens=1), seq(range(100, 164), max_tokens=1)
    run(scheduler, [a_again])
    run(scheduler, [b_again])
    assert a_again.cached_tokens == 64
    assert b_again.cached_tokens < 64


def test_a_full_kv_cache_queues_the_next_request():
    small = dataclasses.replace(L4, kv_blocks=10, block_size=16)  # 160 tokens in all
    scheduler = sim.Scheduler(small)
    first, second = seq(range(100), max_tokens=8), seq(range(500, 600), max_tokens=8)
    run(scheduler, [first, second], until=1)
    assert scheduler.running == [first] and list(scheduler.waiting) == [second]
    assert scheduler.kv_usage() == pytest.approx(7 / 10)
    run(scheduler, [])
    assert second.first_token > first.token_times[-1]  # it started once the first ended


def test_a_sequence_slot_limit_queues_too_and_the_decode_step_grows_with_the_batch():
    scheduler = sim.Scheduler(dataclasses.replace(L4, max_num_seqs=2))
    three = [seq(range(i * 100, i * 100 + 32), max_tokens=4) for i in range(3)]
    run(scheduler, three, until=1)
    assert len(scheduler.running) == 2 and len(scheduler.waiting) == 1
    one_running = sim.Scheduler(L4)
    run(one_running, [seq(range(32), max_tokens=4)], until=1)
    assert scheduler.step(0.0)[0] > one_running.step(0.0)[0]


def test_a_sequence_that_outgrows_the_cache_preempts_the_newest():
    small = dataclasses.replace(L4, kv_blocks=4, block_size=16)  # 64 tokens in all
    scheduler = sim.Scheduler(small)
    old, new = seq(range(30), max_tokens=20), seq(range(100, 130), max_tokens=20)
    run(scheduler, [old, new])
    assert scheduler.preemptions >= 1
    assert old.generated == new.generated == 20
    # the newer one started beside the old one, was put back, and resumed once it ended
    assert new.token_times[0] == old.token_times[0]
    assert new.token_times[-1] > old.token_times[-1]
    old_end = old.token_times[-1]
    pairs = zip(new.token_times, new.token_times[1:], strict=False)
    assert any(a < old_end < b for a, b in pairs), (old.token_times, new.token_times)


def test_a_profile_that_cannot_hold_one_request_is_refused_at_start(tmp_path):
    small = tmp_path / "small.json"
    small.write_text(json.dumps({**dataclasses.asdict(L4), "kv_blocks": 10}))
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"name": "x"}))
    script = str(FILES / "sim_engine.py")
    for profile, expected in ((small, "does not fit the KV cache"), (broken, "--profile")):
        done = subprocess.run(
            [sys.executable, script, "--served-model-name", "m", "--profile", str(profile)],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 2 and expected in done.stderr, done.stderr


@pytest.fixture
def engine_url():
    fast = dataclasses.replace(L4, prefill_overhead_ms=0.0, decode_base_ms=1.0)
    handler = type("H", (sim.Handler,), {})
    handler.engine = sim.Engine(fast, "sim-model")
    handler.api_key, handler.version, handler.max_model_len = "sk-sim", "0.0.0+sim", 512
    server = sim.Server(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def call(url, body=None, key="sk-sim"):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
    except OSError as err:  # refused or reset: no HTTP status
        return 0, str(err)


def test_the_openai_surface(engine_url):
    status, body = call(f"{engine_url}/v1/models")
    assert status == 200 and [m["id"] for m in json.loads(body)["data"]] == ["sim-model"]
    assert call(f"{engine_url}/v1/models", key=None)[0] == 401
    assert call(f"{engine_url}/v1/models", key="wrong")[0] == 401
    assert call(f"{engine_url}/health", key=None)[0] == 200
    assert json.loads(call(f"{engine_url}/version", key=None)[1]) == {"version": "0.0.0+sim"}

    ask = {"model": "sim-model", "prompt": "one two three", "max_tokens": 5}
    status, body = call(f"{engine_url}/v1/completions", ask)
    done = json.loads(body)
    assert status == 200 and len(done["choices"][0]["text"].split()) == 5
    assert done["usage"] == {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
    assert json.loads(call(f"{engine_url}/v1/completions", ask)[1])["choices"] == done["choices"]

    status, body = call(f"{engine_url}/v1/completions", {**ask, "model": "other"})
    assert status == 404 and "other" in json.loads(body)["error"]["message"]
    assert call(f"{engine_url}/v1/completions", {"model": "sim-model"})[0] == 400
    assert call(f"{engine_url}/v1/completions", {**ask, "max_tokens": 600})[0] == 400

    chat = {"model": "sim-model", "messages": [{"role": "user", "content": "one two three"}]}
    streamed = {**chat, "max_tokens": 4, "stream": True, "stream_options": {"include_usage": True}}
    status, body = call(f"{engine_url}/v1/chat/completions", streamed)
    events = [line[6:] for line in body.splitlines() if line.startswith("data: ")]
    assert status == 200 and events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"]["content"] for c in chunks if c["choices"])
    assert len(text.split()) == 4 and chunks[-1]["usage"]["completion_tokens"] == 4


def test_bodies_in_chunks_and_refused_bodies_leave_a_kept_connection_clean(engine_url):
    """A router may stream a request's body in chunks (vllm-router does); a refused
    request's body is read all the same: the next request on the connection is whole."""
    import http.client

    body = json.dumps({"model": "sim-model", "prompt": "one two three", "max_tokens": 3})
    connection = http.client.HTTPConnection(engine_url.removeprefix("http://"), timeout=10)

    def post(key: str, chunked: bool) -> int:
        headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        parts = iter([body[:7].encode(), body[7:].encode()])  # http.client chunks an iterable
        connection.request("POST", "/v1/completions", parts if chunked else body, headers,
                           encode_chunked=chunked)
        answer = connection.getresponse()
        text = answer.read()
        assert answer.status != 200 or len(json.loads(text)["choices"][0]["text"].split()) == 3
        return answer.status

    assert [post("sk-sim", True), post("wrong", True), post("wrong", False),
            post("sk-sim", True), post("sk-sim", False)] == [200, 401, 401, 200, 200]
    connection.close()


def test_render_endpoints_answer_token_ids_only_when_scale_out_is_enabled(engine_url):
    """vllm-router's cache_aware asks an engine to render a request into token ids
    (vLLM: /v1/completions/render, /v1/chat/completions/render, with --enable-scale-out;
    403 without). Equal prefixes render to equal leading ids."""
    ask = {"model": "sim-model", "prompt": "shared system prompt then question one"}
    status, body = call(f"{engine_url}/v1/completions/render", ask)
    assert status == 403 and "--enable-scale-out" in json.loads(body)["error"]["message"]
    sim.Handler.scale_out = True  # the fixture's handler class inherits it
    try:
        status, body = call(f"{engine_url}/v1/completions/render", ask)
        first = json.loads(body)
        assert status == 200 and isinstance(first, list) and len(first[0]["token_ids"]) == 6
        other = json.loads(call(f"{engine_url}/v1/completions/render",
                                {**ask, "prompt": "shared system prompt then question two"})[1])
        assert first[0]["token_ids"][:5] == other[0]["token_ids"][:5]
        assert first[0]["token_ids"][5] != other[0]["token_ids"][5]
        chat = {"model": "sim-model", "messages": [{"role": "user", "content": "one two"}]}
        status, body = call(f"{engine_url}/v1/chat/completions/render", chat)
        assert status == 200 and len(json.loads(body)["token_ids"]) == 2
        assert call(f"{engine_url}/v1/completions/render", ask, key="wrong")[0] == 401
    finally:
        sim.Handler.scale_out = False


def test_a_burst_of_connections_waits_for_the_engine_instead_of_being_reset(engine_url):
    ask = {"model": "sim-model", "prompt": "one two", "max_tokens": 20}
    with ThreadPoolExecutor(max_workers=200) as pool:
        answers = list(pool.map(lambda _: call(f"{engine_url}/v1/completions", ask), range(200)))
    assert [status for status, _ in answers] == [200] * 200


def test_metrics_carry_the_names_our_roles_read(engine_url):
    for _ in range(3):
        call(f"{engine_url}/v1/completions", {"prompt": "a b c", "max_tokens": 3})
    # The HTTP duration of a request is recorded once its answer is sent (as vLLM's
    # instrumentator does), so the last one may land a moment after the client has it.
    deadline = time.monotonic() + 2
    while True:
        status, text = call(f"{engine_url}/metrics", key=None)
        sums = metric_sums(text.splitlines())
        recorded = sums.get("http_request_duration_highr_seconds_count")
        if recorded == 3 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert status == 200
    assert sums["vllm:request_success_total"] == 3
    assert sums["vllm:generation_tokens_total"] == 9
    assert sums["vllm:prompt_tokens_total"] == 9
    assert sums["vllm:prefix_cache_queries_total"] == 9
    assert sums["vllm:num_requests_running"] == 0 and sums["vllm:num_requests_waiting"] == 0
    assert sums["vllm:time_to_first_token_seconds_count"] == 3
    assert sums["vllm:inter_token_latency_seconds_count"] == 6
    assert sums["vllm:e2e_request_latency_seconds_count"] == 3
    assert sums["http_request_duration_highr_seconds_count"] == 3
    assert 'vllm:kv_cache_usage_perc{engine="0",model_name="sim-model"} 0.0' in text
