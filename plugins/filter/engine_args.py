"""Filters the inference_engine role renders its unit and environment with: thin
wrappers over module_utils.engine_args.FILTERS (pure functions, unit-tested there; the
role's whole render is tested through Ansible, tests/unit/engine_render.py).

    ExecStart={{ ([venv ~ '/bin/vllm', 'serve'] + (settings | inferfleet.fleet.vllm_serve_args))
                 | inferfleet.fleet.systemd_quote }}
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ansible.errors import AnsibleFilterError


def _engine_filters() -> dict[str, Callable[..., Any]]:
    try:
        from ansible_collections.inferfleet.fleet.plugins.module_utils.engine_args import FILTERS
    except ImportError as err:
        raise AnsibleFilterError(
            "the inferfleet package is not importable by the controller's Python "
            f"({err}); install it there with `pip install -e .`."
        ) from err
    return FILTERS


def _wrap(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(func)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except (KeyError, TypeError, ValueError) as err:
            raise AnsibleFilterError(f"{name}: {err}") from err

    return call


class FilterModule:
    def filters(self) -> dict[str, Callable[..., Any]]:
        return {name: _wrap(name, func) for name, func in _engine_filters().items()}
