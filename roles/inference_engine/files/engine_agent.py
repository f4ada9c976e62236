"""The engine's HAProxy agent (agent-check), started by inferfleet-engine-agent.socket,
which hands it the listening socket (fd 3). Each connection gets one line:

  down   the engine's unit is not active: it is stopping (its ExecStop waits
         inference_engine_stop_announce seconds before SIGTERM), stopped or restarting.
         HAProxy takes the server out at once.
  up     the unit is active and the engine's /health answers 200. HAProxy puts the
         server back only while its own health checks pass too.
  (none) active but /health does not answer yet (the model loading) or not now: HAProxy
         keeps the server as it was, so a restarted engine is not put back before it
         serves, and a slow /health is left to the health checks' `fall`.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import urllib.request


def answer(unit: str, health_url: str) -> bytes:
    if subprocess.run(["systemctl", "is-active", "--quiet", unit], check=False).returncode:
        return b"down\n"
    try:
        with urllib.request.urlopen(health_url, timeout=1) as reply:
            return b"up\n" if reply.status == 200 else b""
    except OSError:
        return b""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--unit", required=True)
    parser.add_argument("--health-url", required=True)
    args = parser.parse_args()
    listener = socket.socket(fileno=3)  # systemd's (LISTEN_FDS=1)
    while True:
        connection, _ = listener.accept()
        with connection:
            try:
                connection.sendall(answer(args.unit, args.health_url))
            except OSError:
                pass  # the load balancer hung up first


if __name__ == "__main__":
    main()
