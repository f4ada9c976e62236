"""fabric_preflight's short-lived listener: accepts (and closes) connections on the given
TCP ports so the other members can probe them before the engine runs. Ports already in
use are left to whatever listens there. Exits when its pid file is removed, or after
the given number of seconds at most."""

import os
import selectors
import socket
import sys
import time

pid_file, lifetime, ports = sys.argv[1], float(sys.argv[2]), [int(p) for p in sys.argv[3:]]
selector = selectors.DefaultSelector()
for port in ports:
    try:
        sock = socket.create_server(("", port), reuse_port=False)
    except OSError:
        continue
    sock.setblocking(False)
    selector.register(sock, selectors.EVENT_READ)
with open(pid_file, "w") as handle:
    handle.write(str(os.getpid()))
deadline = time.monotonic() + lifetime
while time.monotonic() < deadline and os.path.exists(pid_file):
    for key, _ in selector.select(timeout=0.2):
        try:
            conn, _ = key.fileobj.accept()
            conn.close()
        except OSError:
            pass
