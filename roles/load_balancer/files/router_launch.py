"""Start vllm-router (load_balancer_routing: cache_aware) from a JSON file of its settings.

The file (the only argument) holds the engines' API key, which so never reaches a
command line or the unit; only root and the router's user read it. Its keys are vllm-router's own
(vllm_router.router_args.RouterArgs: worker_urls, port, policy, api_key, ...); an
unknown key stops the start with its name.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from vllm_router.launch_router import launch_router
from vllm_router.router_args import RouterArgs


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: router_launch.py SETTINGS.json", file=sys.stderr)
        return 2
    path = Path(argv[1])
    settings = json.loads(path.read_text())
    known = {f.name for f in dataclasses.fields(RouterArgs)}
    unknown = sorted(set(settings) - known)
    if unknown:
        print(f"{path}: not vllm-router settings: {', '.join(unknown)}", file=sys.stderr)
        return 2
    launch_router(RouterArgs(**settings))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
