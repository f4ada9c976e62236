"""The monitoring role's small host files, rendered from its templates with its defaults:
the exporters' command lines, the DCGM exporter's unit (GPU nodes, which the lab has none
of), and the log forwarding snippets."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import jinja2
import yaml

ROLE = Path(__file__).resolve().parents[2] / "roles" / "monitoring"


def _vars(**overrides) -> dict:
    # the role's defaults over those of its dependency, roles/fleet_defaults
    values = yaml.safe_load((ROLE.parent / "fleet_defaults" / "defaults" / "main.yml").read_text())
    values.update(yaml.safe_load((ROLE / "defaults" / "main.yml").read_text()))
    values.update(
        ansible_managed="Ansible managed",
        monitoring_engine_service="inferfleet-engine.service",
        _monitoring_node_exporter_web_listen="0.0.0.0:9100",
        _monitoring_dcgm_unit="inferfleet-dcgm-exporter",
    )
    values["monitoring_node_exporter_systemd_units"][0] = "inferfleet-engine.service"
    values.update(overrides)
    return values


def _render(name: str, **overrides) -> str:
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    env.filters["to_json"] = json.dumps
    return env.from_string((ROLE / "templates" / name).read_text()).render(**_vars(**overrides))


def _args(text: str) -> list[str]:
    line = next(ln for ln in text.splitlines() if ln.startswith("ARGS="))
    return shlex.split(shlex.split(line.removeprefix("ARGS="))[0])


def test_node_exporter_exports_the_engine_unit_and_the_textfile_folder():
    args = _args(_render("prometheus-node-exporter.default.j2"))
    assert "--web.listen-address=0.0.0.0:9100" in args
    assert "--collector.systemd" in args
    assert "--collector.systemd.enable-restarts-metrics" in args
    include = next(a for a in args if a.startswith("--collector.systemd.unit-include="))
    assert include.split("=", 1)[1].startswith("(inferfleet-engine.service|haproxy.service|")
    assert "--collector.textfile.directory=/var/lib/prometheus/node-exporter" in args


def test_dcgm_exporter_runs_nvidias_image_with_the_gpus():
    unit = _render("dcgm-exporter.service.j2")
    start = next(ln for ln in unit.splitlines() if ln.startswith("ExecStart="))
    argv = shlex.split(start.removeprefix("ExecStart="))
    assert argv[:2] == ["/usr/bin/docker", "run"]
    assert argv[argv.index("--gpus") + 1] == "all"
    assert argv[argv.index("--publish") + 1] == "0.0.0.0:9400:9400"
    assert argv[-1].startswith("nvcr.io/nvidia/k8s/dcgm-exporter:")
    assert "Requires=docker.service" in unit


def test_syslog_forwarding_sends_only_the_fleet_identifiers():
    conf = _render("rsyslog-forward.conf.j2", monitoring_log_syslog_target="logs.example")
    assert ('if $programname == ["inferfleet-engine", "ansible-inferfleet.fleet.model_sync", '
            '"haproxy", "nginx"]' in conf)
    assert 'target="logs.example" port="514"' in conf
    assert 'protocol="tcp"' in conf


def test_journal_upload_points_at_the_server():
    conf = _render("journal-upload.conf.j2",
                   monitoring_log_journal_remote_url="https://logs.example:19532")
    assert "[Upload]\nURL=https://logs.example:19532\n" in conf
