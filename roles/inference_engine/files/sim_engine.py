"""A SIMULATED inference engine: a stand-in for a GPU-backed vLLM where no GPU exists
(scale, routing and fault-timing tests; never a functional scenario's engine).

It serves vLLM's OpenAI surface (completions and chat, streaming with usage, /health,
/v1/models, /version, the API key; with --enable-scale-out, as vLLM, the render
endpoints a router reads token ids from) and the /metrics names our roles read, and answers
with the timing of a latency model instead of a model's arithmetic:
- a request is admitted when a sequence slot and the KV-cache blocks for its prompt are
  free, else it waits (vllm:num_requests_waiting);
- its prompt's full blocks are looked up in a per-replica prefix cache (chained block
  hashes, least recently used blocks evicted first); only the uncached tokens cost
  prefill time;
- every step decodes one token for each running sequence and lasts
  decode_base_ms + decode_per_seq_ms x running + decode_per_1k_context_ms x (context
  tokens / 1000), plus the prefill of the sequences admitted in it;
- a sequence that needs a block when none is free preempts the newest running one
  (vLLM's recompute preemption: it goes back to the front of the queue).
The profile (those figures, the cache size, the sequence limit) is JSON data (--profile);
its source is in the file. The answer to a prompt is words drawn from a hash of the
model and the prompt, so every replica of one model answers alike. Standard library only.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import queue
import sys
import threading
import time
import uuid
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

WORDS = "the a fleet node model token cache prefix route replica engine answer".split()


@dataclass(frozen=True)
class Profile:
    name: str
    source: str
    block_size: int  # tokens per KV-cache block
    kv_blocks: int  # blocks in the KV cache
    max_num_seqs: int
    prefill_overhead_ms: float  # once per step that prefills
    prefill_per_token_ms: float  # per uncached prompt token
    decode_base_ms: float
    decode_per_seq_ms: float
    decode_per_1k_context_ms: float

    @classmethod
    def load(cls, path: str) -> Profile:
        with open(path, encoding="utf-8") as handle:
            return cls(**json.load(handle))


def tokens_of(text: str) -> list[int]:
    """A stable stand-in tokenizer: one token per word (prefix caching needs stable ids)."""
    return [
        int.from_bytes(hashlib.blake2b(w.encode(), digest_size=4).digest(), "big")
        for w in text.split()
    ]


def block_hashes(tokens: list[int], block_size: int) -> list[int]:
    """Chained hashes of the prompt's full blocks: equal hashes mean equal prefixes."""
    hashes, previous = [], 0
    for start in range(0, len(tokens) - block_size + 1, block_size):
        previous = hash((previous, *tokens[start : start + block_size]))
        hashes.append(previous)
    return hashes


@dataclass
class Sequence:
    prompt: list[int]
    max_tokens: int
    arrived: float
    hashes: list[int] = field(default_factory=list)
    blocks: int = 0  # blocks held (prompt and generated tokens)
    shared: list[int] = field(default_factory=list)  # prefix-cache hashes it references
    generated: int = 0
    cached_tokens: int = 0
    first_token: float | None = None
    token_times: list[float] = field(default_factory=list)
    done: bool = False
    outbox: queue.Queue = field(default_factory=queue.Queue)

    @property
    def context(self) -> int:
        return len(self.prompt) + self.generated


class Scheduler:
    """The latency model, on a clock the caller advances (unit tests drive it directly)."""

    def __init__(self, profile: Profile, prefix_caching: bool = True):
        self.p, self.prefix_caching = profile, prefix_caching
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.cache: OrderedDict[int, int] = OrderedDict()  # block hash -> references, LRU order
        self.used = 0  # blocks held by sequences (own blocks) plus cached blocks
        self.queries = self.hits = self.preemptions = 0

    def add(self, seq: Sequence) -> None:
        if self.prefix_caching:
            seq.hashes = block_hashes(seq.prompt, self.p.block_size)
        self.waiting.append(seq)

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.p.block_size)

    def _free(self, needed: int) -> bool:
        """Make `needed` blocks free, evicting unreferenced cached blocks, oldest first."""
        while self.p.kv_blocks - self.used < needed:
            victim = next((h for h, refs in self.cache.items() if refs == 0), None)
            if victim is None:
                return False
            del self.cache[victim]
            self.used -= 1
        return True

    def _admit(self, seq: Sequence) -> bool:
        hit = 0
        for h in seq.hashes:
            if h not in self.cache:
                break
            hit += 1
        own = self._blocks_for(seq.context + 1) - hit
        for h in seq.hashes[:hit]:  # pin the hits before evicting for the rest
            self.cache[h] += 1
            self.cache.move_to_end(h)
        if not self._free(own):
            for h in seq.hashes[:hit]:
                self.cache[h] -= 1
            return False
        if self.prefix_caching:
            self.queries += len(seq.prompt)
        self.hits += hit * self.p.block_size
        seq.cached_tokens = hit * self.p.block_size
        seq.shared = seq.hashes[:hit]
        seq.blocks = own
        self.used += own
        return True

    def _release(self, seq: Sequence, keep_prompt: bool) -> None:
        for h in seq.shared:
            self.cache[h] -= 1
        self.used -= seq.blocks
        if keep_prompt:  # the prompt's full blocks stay cached, unreferenced
            for h in seq.hashes[len(seq.shared) :]:
                if h not in self.cache and self._free(1):
                    self.cache[h] = 0
                    self.used += 1
        seq.shared, seq.blocks = [], 0

    def step(self, now: float) -> tuple[float, list[Sequence]]:
        """Plan one step starting at `now`: returns its duration in seconds and the
        sequences that get a token at its end (call finish_step with them)."""
        prefill_tokens = 0
        while self.waiting and len(self.running) < self.p.max_num_seqs:
            seq = self.waiting[0]
            if not self._admit(seq):
                break
            self.waiting.popleft()
            prefill_tokens += seq.context - seq.cached_tokens  # a preempted one recomputes
            self.running.append(seq)
        for seq in list(self.running):  # the next token may need one more block
            if (
                seq not in self.running
                or self._blocks_for(seq.context + 1) <= len(seq.shared) + seq.blocks
            ):
                continue
            while not self._free(1):
                victim = self.running.pop()  # the newest goes back to the queue's front
                self._release(victim, keep_prompt=False)
                self.waiting.appendleft(victim)
                self.preemptions += 1
                if victim is seq:
                    break
            else:
                seq.blocks += 1
                self.used += 1
        if not self.running:
            return 0.0, []
        context = sum(s.context for s in self.running)
        ms = (
            self.p.decode_base_ms
            + self.p.decode_per_seq_ms * len(self.running)
            + self.p.decode_per_1k_context_ms * context / 1000
        )
        if prefill_tokens:
            ms += self.p.prefill_overhead_ms + self.p.prefill_per_token_ms * prefill_tokens
        return ms / 1000, list(self.running)

    def finish_step(self, end: float, stepped: list[Sequence]) -> list[Sequence]:
        """Each stepped sequence got a token at `end`; returns those that finished."""
        finished = []
        for seq in stepped:
            if seq not in self.running:
                continue
            seq.generated += 1
            seq.token_times.append(end)
            if seq.first_token is None:
                seq.first_token = end
            if seq.generated >= seq.max_tokens:
                seq.done = True
                self.running.remove(seq)
                self._release(seq, keep_prompt=True)
                finished.append(seq)
        return finished

    def kv_usage(self) -> float:
        return (self.used - sum(1 for refs in self.cache.values() if refs == 0)) / self.p.kv_blocks


# Histogram buckets as vLLM exports them (seconds).
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
E2E_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
)


class Histogram:
    def __init__(self, buckets: tuple[float, ...]):
        self.buckets, self.counts, self.sum, self.count = buckets, [0] * len(buckets), 0.0, 0

    def observe(self, value: float) -> None:
        self.sum += value
        self.count += 1
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1

    def lines(self, name: str, labels: str = "") -> list[str]:
        pre = f"{labels}," if labels else ""
        out = [f"# TYPE {name} histogram"]
        out += [
            f'{name}_bucket{{{pre}le="{b}"}} {c}'
            for b, c in zip(self.buckets, self.counts, strict=True)
        ]
        out += [f'{name}_bucket{{{pre}le="+Inf"}} {self.count}']
        tail = f"{{{labels}}}" if labels else ""
        return out + [f"{name}_sum{tail} {self.sum}", f"{name}_count{tail} {self.count}"]


class Engine:
    """The scheduler on the wall clock: one thread runs its steps, sleeping their time."""

    def __init__(self, profile: Profile, model: str, prefix_caching: bool = True):
        self.scheduler, self.model = Scheduler(profile, prefix_caching), model
        self.lock = threading.Condition()
        self.success: dict[str, int] = {"stop": 0, "length": 0}
        self.prompt_tokens = self.generation_tokens = 0
        self.ttft, self.itl = Histogram(TTFT_BUCKETS), Histogram(ITL_BUCKETS)
        self.e2e, self.queue_time, self.http = (
            Histogram(E2E_BUCKETS),
            Histogram(E2E_BUCKETS),
            Histogram(E2E_BUCKETS),
        )
        threading.Thread(target=self._run, daemon=True).start()

    def submit(self, prompt: str, max_tokens: int) -> Sequence:
        seq = Sequence(tokens_of(prompt), max(1, max_tokens), time.monotonic())
        with self.lock:
            self.scheduler.add(seq)
            self.lock.notify()
        return seq

    def _run(self) -> None:
        while True:
            with self.lock:
                while not (self.scheduler.waiting or self.scheduler.running):
                    self.lock.wait()
                seconds, stepped = self.scheduler.step(time.monotonic())
            time.sleep(seconds)
            with self.lock:
                end = time.monotonic()
                finished = self.scheduler.finish_step(end, stepped)
                for seq in stepped:
                    if len(seq.token_times) == 1 and seq.generated == 1:
                        self.ttft.observe(end - seq.arrived)
                    elif len(seq.token_times) > 1:
                        self.itl.observe(seq.token_times[-1] - seq.token_times[-2])
                    seq.outbox.put(seq.generated)
                for seq in finished:
                    self.success["length"] += 1
                    self.prompt_tokens += len(seq.prompt)
                    self.generation_tokens += seq.generated
                    self.e2e.observe(end - seq.arrived)
                    self.queue_time.observe(seq.token_times[0] - seq.arrived)
                    seq.outbox.put(None)
            if not seconds:
                time.sleep(0.001)  # nothing admitted (the cache is full): let requests finish

    def metrics(self) -> str:
        labels = f'engine="0",model_name="{self.model}"'
        s = self.scheduler
        with self.lock:
            lines = [
                "# TYPE vllm:num_requests_running gauge",
                f"vllm:num_requests_running{{{labels}}} {len(s.running)}",
                "# TYPE vllm:num_requests_waiting gauge",
                f"vllm:num_requests_waiting{{{labels}}} {len(s.waiting)}",
                "# TYPE vllm:kv_cache_usage_perc gauge",
                f"vllm:kv_cache_usage_perc{{{labels}}} {s.kv_usage()}",
                "# TYPE vllm:prefix_cache_queries_total counter",
                f"vllm:prefix_cache_queries_total{{{labels}}} {s.queries}",
                "# TYPE vllm:prefix_cache_hits_total counter",
                f"vllm:prefix_cache_hits_total{{{labels}}} {s.hits}",
                "# TYPE vllm:num_preemptions_total counter",
                f"vllm:num_preemptions_total{{{labels}}} {s.preemptions}",
                "# TYPE vllm:prompt_tokens_total counter",
                f"vllm:prompt_tokens_total{{{labels}}} {self.prompt_tokens}",
                "# TYPE vllm:generation_tokens_total counter",
                f"vllm:generation_tokens_total{{{labels}}} {self.generation_tokens}",
                "# TYPE vllm:request_success_total counter",
            ]
            lines += [
                f'vllm:request_success_total{{{labels},finished_reason="{r}"}} {n}'
                for r, n in self.success.items()
            ]
            lines += self.ttft.lines("vllm:time_to_first_token_seconds", labels)
            lines += self.itl.lines("vllm:inter_token_latency_seconds", labels)
            lines += self.e2e.lines("vllm:e2e_request_latency_seconds", labels)
            lines += self.queue_time.lines("vllm:request_queue_time_seconds", labels)
            lines += self.http.lines("http_request_duration_highr_seconds")
        return "\n".join(lines) + "\n"


def answer(model: str, prompt: str, n: int) -> list[str]:
    """n words that depend only on the model and the prompt (greedy: every replica alike)."""
    digest = hashlib.sha256(f"{model}\0{prompt}".encode()).digest()
    return [WORDS[digest[i % len(digest)] % len(WORDS)] for i in range(n)]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    engine: Engine
    api_key: str | None
    version: str
    max_model_len: int
    scale_out: bool = False

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass

    def _send(self, status: int, body: dict | str, kind: str = "application/json") -> None:
        data = (body if isinstance(body, str) else json.dumps(body)).encode()
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str, kind: str) -> None:
        self._send(status, {"error": {"message": message, "type": kind, "code": status}})

    def _authorized(self) -> bool:
        if not self.api_key or not self.path.startswith("/v1"):
            return True
        if self.headers.get("Authorization", "") == f"Bearer {self.api_key}":
            return True
        self._send(401, {"error": "Unauthorized"})
        return False

    def do_GET(self):  # noqa: N802 - http.server's name
        if not self._authorized():
            return
        model = self.engine.model
        if self.path == "/health":
            self._send(200, "", "text/plain")
        elif self.path == "/version":
            self._send(200, {"version": self.version})
        elif self.path == "/metrics":
            self._send(200, self.engine.metrics(), "text/plain; version=0.0.4")
        elif self.path == "/v1/models":
            card = {
                "id": model,
                "object": "model",
                "owned_by": "vllm",
                "root": model,
                "max_model_len": self.max_model_len,
            }
            self._send(200, {"object": "list", "data": [card]})
        else:
            self._send(404, {"detail": "Not Found"})

    def _body(self) -> bytes:
        """The request's body, sent with a length or in chunks (as routers and proxies
        stream it), read whole whatever the answer: what is left unread on a kept
        connection would be taken for the next request."""
        if "chunked" not in self.headers.get("Transfer-Encoding", "").lower():
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))
        parts = []
        while size := int(self.rfile.readline().split(b";")[0].strip(), 16):
            parts.append(self.rfile.read(size))
            self.rfile.readline()  # the CRLF that ends a chunk
        while self.rfile.readline().strip():  # trailers, up to the empty line
            pass
        return b"".join(parts)

    def do_POST(self):  # noqa: N802 - http.server's name
        started = time.monotonic()
        try:
            raw = self._body()
        except ValueError:
            self.close_connection = True  # where the next request starts is unknown
            self._error(400, "bad request: a malformed chunked body", "BadRequestError")
            return
        if not self._authorized():
            return
        path = self.path.removesuffix("/render")
        chat = path == "/v1/chat/completions"
        if path not in ("/v1/completions", "/v1/chat/completions"):
            self._send(404, {"detail": "Not Found"})
            return
        if path != self.path and not self.scale_out:
            self._error(
                403,
                "Scale-out endpoints are disabled. Restart vllm serve with --enable-scale-out "
                "to enable them.",
                "PermissionDeniedError",
            )
            return
        try:
            body = json.loads(raw or b"{}")
            if chat:
                prompt = "\n".join(str(m.get("content", "")) for m in body["messages"])
            else:
                prompt = (
                    body["prompt"]
                    if isinstance(body["prompt"], str)
                    else " ".join(map(str, body["prompt"]))
                )
            max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            self._error(400, f"bad request: {err!r}", "BadRequestError")
            return
        if body.get("model", self.engine.model) != self.engine.model:
            self._error(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError")
            return
        if len(tokens_of(prompt)) + max_tokens > self.max_model_len:
            self._error(
                400,
                f"this model's maximum context length is {self.max_model_len} tokens",
                "BadRequestError",
            )
            return
        if path != self.path:
            # vLLM's render endpoints: the request as token ids (what a router such as
            # vllm-router's cache_aware matches against what it sent each engine before);
            # a list for completions, one object for chat.
            rendered = {"request_id": uuid.uuid4().hex, "token_ids": tokens_of(prompt)}
            self._send(200, rendered if chat else [rendered])
            return
        seq = self.engine.submit(prompt, max_tokens)
        words = answer(self.engine.model, prompt, seq.max_tokens)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{id(seq):x}"
        usage = {
            "prompt_tokens": len(seq.prompt),
            "completion_tokens": seq.max_tokens,
            "total_tokens": len(seq.prompt) + seq.max_tokens,
        }
        if body.get("stream"):
            self._stream(
                seq,
                words,
                rid,
                chat,
                usage,
                bool((body.get("stream_options") or {}).get("include_usage")),
            )
        else:
            while seq.outbox.get() is not None:
                pass
            text = " ".join(words)
            choice = {"index": 0, "finish_reason": "length"}
            choice.update(
                {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
            )
            kind = "chat.completion" if chat else "text_completion"
            self._send(
                200,
                {
                    "id": rid,
                    "object": kind,
                    "model": self.engine.model,
                    "choices": [choice],
                    "usage": usage,
                },
            )
        with self.engine.lock:
            self.engine.http.observe(time.monotonic() - started)

    def _stream(self, seq, words, rid, chat, usage, include_usage) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        kind = "chat.completion.chunk" if chat else "text_completion"

        def event(payload) -> None:
            data = (
                f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n".encode()
            )
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        sent = 0
        while (count := seq.outbox.get()) is not None:
            for i in range(sent, count):
                piece = ("" if i == 0 else " ") + words[i]
                last = i == seq.max_tokens - 1
                choice = {"index": 0, "finish_reason": "length" if last else None}
                choice.update({"delta": {"content": piece}} if chat else {"text": piece})
                event({"id": rid, "object": kind, "model": self.engine.model, "choices": [choice]})
            sent = count
        if include_usage:
            event(
                {
                    "id": rid,
                    "object": kind,
                    "model": self.engine.model,
                    "choices": [],
                    "usage": usage,
                }
            )
        event("[DONE]")
        self.wfile.write(b"0\r\n\r\n")


def main() -> None:
    # Called like `vllm serve` (the role renders the same arguments): the flags that shape
    # the simulation are read, the others (parallel sizes, dtype, memory) are what the
    # profile stands for, and are named on stderr as ignored.
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default="", help="the model folder (not read)")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", default="", help="else the model argument")
    parser.add_argument("--profile", required=True, help="a JSON file of Profile's fields")
    parser.add_argument(
        "--api-key", default=None, help="else the VLLM_API_KEY environment variable"
    )
    parser.add_argument("--version", default="0.0.0+sim", help="what /version reports")
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--max-num-seqs", type=int, default=None, help="else the profile's")
    parser.add_argument(
        "--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True
    )
    parser.add_argument(
        "--start-delay", type=float, default=0.0, help="seconds before listening (a slow start)"
    )
    parser.add_argument(
        "--enable-scale-out", action="store_true", help="serve the render endpoints, as vLLM"
    )
    args, ignored = parser.parse_known_args()
    name = args.served_model_name or args.model
    if not name:
        parser.error("give the model's name: --served-model-name NAME (or the model argument)")
    try:
        profile = Profile.load(args.profile)
    except (OSError, ValueError, TypeError) as err:
        parser.error(f"--profile {args.profile}: {err}")
    if args.max_num_seqs is not None:
        if args.max_num_seqs < 1:
            parser.error("--max-num-seqs must be 1 or more")
        profile = dataclasses.replace(profile, max_num_seqs=args.max_num_seqs)
    capacity = profile.kv_blocks * profile.block_size
    if args.max_model_len > capacity:  # vLLM refuses to start in this case too
        parser.error(
            f"--max-model-len {args.max_model_len} does not fit the KV cache of profile "
            f"{profile.name} ({capacity} tokens): lower it, or use a profile with more kv_blocks"
        )
    if ignored:
        print(f"SIMULATED engine: not modelled, ignored: {' '.join(ignored)}", file=sys.stderr)
    # the line vLLM logs at start, which the role's capacity check reads
    print(
        f"SIMULATED engine, profile {profile.name}: GPU KV cache size: {capacity:,} tokens, "
        f"Maximum concurrency for {args.max_model_len:,} tokens per request: "
        f"{capacity / args.max_model_len:.2f}x",
        file=sys.stderr,
        flush=True,
    )
    Handler.engine = Engine(profile, name, args.enable_prefix_caching)
    Handler.api_key = args.api_key or os.environ.get("VLLM_API_KEY") or None
    Handler.version, Handler.max_model_len = args.version, args.max_model_len
    Handler.scale_out = args.enable_scale_out
    time.sleep(args.start_delay)
    server = Server((args.host, args.port), Handler)
    server.serve_forever()


class Server(ThreadingHTTPServer):
    # vLLM's server (uvicorn) listens with a backlog of 2048: a burst of connections
    # queues for the engine instead of being reset (the stdlib's default is 5).
    request_queue_size = 2048
    daemon_threads = True


if __name__ == "__main__":
    main()
