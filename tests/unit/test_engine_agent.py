"""The engine's HAProxy agent (roles/inference_engine/files/engine_agent.py), run as systemd
runs it (its listening socket as fd 3) against a real HTTP /health; systemd cannot run
here, so a fake `systemctl` on PATH plays the engine's unit (its exit code from a file)."""

import http.server
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "roles/inference_engine/files/engine_agent.py"
HAND_OVER = ("import os, sys; os.dup2(int(sys.argv[1]), 3); "
             "os.execv(sys.executable, [sys.executable, *sys.argv[2:]])")
FAKE_SYSTEMCTL = '#!/bin/sh\n[ "$*" = "is-active --quiet inferfleet-engine.service" ] || exit 9\n' \
                 'exit "$(cat "$FAKE_UNIT_RC")"\n'


@pytest.fixture
def agent(tmp_path):
    """(ask, unit_rc file, health status cell): ask() connects as HAProxy does."""
    status = {"code": 200}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (the standard library's name)
            self.send_response(status["code"] if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    health = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=health.serve_forever, daemon=True).start()
    (tmp_path / "systemctl").write_text(FAKE_SYSTEMCTL)
    (tmp_path / "systemctl").chmod(0o755)
    unit_rc = tmp_path / "unit_rc"
    unit_rc.write_text("0")
    listener = socket.create_server(("127.0.0.1", 0))
    fd = listener.fileno()
    proc = subprocess.Popen(  # the socket as fd 3, as systemd hands it over
        [sys.executable, "-c", HAND_OVER, str(fd), str(SCRIPT),
         "--unit", "inferfleet-engine.service",
         "--health-url", f"http://127.0.0.1:{health.server_port}/health"],
        pass_fds=(fd,),
        env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}",
             "FAKE_UNIT_RC": str(unit_rc)})

    def ask() -> str:
        with socket.create_connection(listener.getsockname(), timeout=10) as conn:
            return b"".join(iter(lambda: conn.recv(100), b"")).decode()

    yield ask, unit_rc, status, health
    proc.kill()
    proc.wait()
    listener.close()


def test_the_agent_says_down_as_soon_as_the_unit_is_not_active(agent):
    ask, unit_rc, status, _ = agent
    assert ask() == "up\n"
    unit_rc.write_text("3")  # deactivating, inactive, activating: is-active exits 3
    assert ask() == "down\n"
    status["code"] = 503
    assert ask() == "down\n"


def test_the_agent_says_nothing_while_an_active_engine_does_not_answer(agent):
    ask, unit_rc, status, health = agent
    status["code"] = 503  # loading
    assert ask() == ""
    status["code"] = 200
    assert ask() == "up\n"
    health.shutdown()
    health.server_close()  # its port now refuses
    assert ask() == ""
