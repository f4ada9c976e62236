"""Where the CLI finds the inferfleet.fleet collection it runs, and where it keeps its
own records.

The collection is a Python namespace package too (`ansible_collections.inferfleet.fleet`):
a built wheel carries it in site-packages, a checkout's virtualenv links the checkout
there (scripts/setup.sh). Run records and fleet locks live beside the checkout (runs/)
or, for an installed CLI, under $XDG_STATE_HOME/inferfleet.

The lab runs on the checkout's inventories/lab. An installed CLI runs it on a copy under
the state dir, which `inferfleet lab up` makes on first use from the one the wheel carries
(LAB_INVENTORY_SHIPPED: setup.py copies inventories/lab there) and `lab down` removes.
"""

from __future__ import annotations

import os
from pathlib import Path


def _collection_dir() -> Path:
    try:
        import ansible_collections.inferfleet.fleet as collection
    except ImportError as err:
        raise SystemExit(
            f"inferfleet: the inferfleet.fleet collection is not importable ({err}): "
            "reinstall inferfleet (pip install inferfleet), or run `make setup` in a checkout"
        ) from err
    return Path(next(iter(collection.__path__)))


COLLECTION = _collection_dir()
# ansible_collections/inferfleet/fleet -> the folder to put first on the collections path
COLLECTIONS_PATH = COLLECTION.parents[2]
# A checkout is the collection plus the CLI's sources, tests and lab inventory.
CHECKOUT = COLLECTION.resolve() if (COLLECTION / "src" / "inferfleet").is_dir() else None
STATE = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "inferfleet"
RUNS_DIR = Path(os.environ.get("INFERFLEET_RUNS_DIR") or (CHECKOUT or STATE) / "runs")
LAB_INVENTORY = (CHECKOUT / "inventories" / "lab") if CHECKOUT else STATE / "lab"
LAB_INVENTORY_SHIPPED = None if CHECKOUT else Path(__file__).parent / "lab" / "inventory"
