"""The engine role's readiness wait (roles/inference_engine/files/wait_ready.py) against a
real HTTP server playing the engine's /health, /v1/models and /v1/completions; systemd
cannot run here, so a fake `systemctl` on PATH plays the unit (its state comes from a file
the test writes)."""

import http.server
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "roles/inference_engine/files/wait_ready.py"

FAKE_SYSTEMCTL = """#!/bin/sh
echo "$@" >> "$FAKE_UNIT_STATE.calls"
[ "$1" = show ] && cat "$FAKE_UNIT_STATE"
exit 0
"""


KEY = "sk-probe-key"


@pytest.fixture
def health_server():
    """The engine: /health answers status["code"]; /v1/models lists status["models"] and
    /v1/completions answers, both only to the key KEY."""
    status = {"code": 503, "models": ["m"], "completions": 0}

    class Handler(http.server.BaseHTTPRequestHandler):
        def answer(self, code, body=None):
            self.send_response(code)
            self.end_headers()
            self.wfile.write(json.dumps(body or {}).encode())

        def do_GET(self):
            if self.path == "/health":
                return self.answer(status["code"])
            if self.headers.get("Authorization") != f"Bearer {KEY}":
                return self.answer(401)
            self.answer(200, {"data": [{"id": m} for m in status["models"]]})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.headers.get("Authorization") != f"Bearer {KEY}":
                return self.answer(401)
            status["completions"] += 1
            status["asked"] = body
            self.answer(200, {"choices": [{"text": "x"}]})

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}", status
    server.shutdown()


def run(tmp_path, url, unit_state, timeout=3, during=None, key=KEY):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "systemctl"
    fake.write_text(FAKE_SYSTEMCTL)
    fake.chmod(0o755)
    state = tmp_path / "unit"
    state.write_text(unit_state)
    proc = subprocess.Popen(
        [
            sys.executable,
            SCRIPT,
            "--url",
            url,
            "--model",
            "m",
            "--answer-timeout",
            "1",
            "--unit",
            "engine",
            "--timeout",
            str(timeout),
            "--interval",
            "0.1",
        ],
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "FAKE_UNIT_STATE": str(state),
             "INFERFLEET_PROBE_KEY": key},
        stdout=subprocess.PIPE,
        text=True,
    )
    if during:
        during(state)
    out, _ = proc.communicate(timeout=30)
    return proc.returncode, out


STARTING = "NRestarts=0\nActiveState=activating\nSubState=start\n"


def test_engine_that_lists_its_model_and_answers_is_ready(tmp_path, health_server):
    url, status = health_server
    status["code"] = 200
    rc, out = run(tmp_path, url, STARTING)
    assert rc == 0 and out.startswith("ready after"), out
    assert status["completions"] == 1
    assert status["asked"] == {"model": "m", "prompt": "Hello", "max_tokens": 1, "temperature": 0}


def test_healthy_engine_without_the_model_is_not_ready(tmp_path, health_server):
    url, status = health_server
    status["code"], status["models"] = 200, ["other"]
    rc, out = run(tmp_path, url, STARTING)
    assert rc == 3 and "/v1/models answered 200 listing ['other'], not m" in out, out
    assert status["completions"] == 0


def test_a_wrong_key_is_not_ready_and_is_not_printed(tmp_path, health_server):
    url, status = health_server
    status["code"] = 200
    rc, out = run(tmp_path, url, STARTING, key="sk-wrong")
    assert rc == 3 and "/v1/models answered 401" in out and "sk-wrong" not in out, out


def test_engine_that_systemd_restarts_fails_at_once(tmp_path, health_server):
    url, _ = health_server

    def crash(state):
        calls = Path(f"{state}.calls")
        while not calls.exists():  # the script has read the state it starts from
            time.sleep(0.01)
        state.write_text("NRestarts=1\nActiveState=activating\nSubState=auto-restart\n")

    rc, out = run(tmp_path, url, STARTING, timeout=60, during=crash)
    assert rc == 2 and "engine exited" in out and "restarts=1" in out
    # stopped, so that systemd does not start it again only for it to crash again
    assert (tmp_path / "unit.calls").read_text().splitlines()[-1] == "stop engine"


def test_engine_waiting_to_be_restarted_counts_as_exited(tmp_path, health_server):
    url, _ = health_server
    rc, out = run(
        tmp_path, url, "NRestarts=0\nActiveState=activating\nSubState=auto-restart\n", timeout=60
    )
    assert rc == 2 and "SubState=auto-restart" in out


def test_failed_unit_fails_at_once(tmp_path, health_server):
    url, _ = health_server
    rc, out = run(tmp_path, url, "NRestarts=0\nActiveState=failed\nSubState=failed\n", timeout=60)
    assert rc == 2 and "ActiveState=failed" in out


def test_slow_engine_times_out(tmp_path, health_server):
    url, _ = health_server
    rc, out = run(tmp_path, url, STARTING, timeout=1)
    assert rc == 1 and "did not answer 200 within 1 s" in out
    assert "stop" not in (tmp_path / "unit.calls").read_text()
