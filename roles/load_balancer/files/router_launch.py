"""Start vllm-router (load_balancer_routing: cache_aware) from a JSON file of its settings.

The file holds the engines' API key, so it is never on a command line or in the unit:
systemd hands it over as a credential (LoadCredential=settings:PATH, readable by this
service alone), or the path is the only argument. Its keys are vllm-router's own
(vllm_router.router_args.RouterArgs: worker_urls, port, policy, api_key, ...); an
unknown key stops the start with its name.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

from vllm_router.launch_router import launch_router
from vllm_router.router_args import RouterArgs


def settings_path(argv: list[str]) -> Path:
    if len(argv) > 1:
        return Path(argv[1])
    return Path(os.environ["CREDENTIALS_DIRECTORY"]) / "settings"


def main(argv: list[str]) -> int:
    path = settings_path(argv)
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
