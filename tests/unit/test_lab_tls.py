"""The lab's TLS: a CA of its own signs a certificate for the load balancers that a
client trusting that CA (and only it) accepts, by name and by address; the secrets file
keeps it while the lab lives and names them all, issues it again when a load balancer is
added, and drops it when TLS is off."""

import json
import socket
import ssl
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from inferfleet.lab import fleet, tls


def _handshake(issued: dict, tmp_path, server_hostname: str, cadata: str) -> None:
    """A TLS server with the certificate on a local socket, and one client handshake."""
    (tmp_path / "server.pem").write_text(issued["certificate"] + issued["key"])
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(tmp_path / "server.pem")
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve():
        conn, _ = listener.accept()
        try:
            with server.wrap_socket(conn, server_side=True):
                pass
        except (ssl.SSLError, OSError):
            pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    client = ssl.create_default_context(cadata=cadata)
    try:
        with socket.create_connection(("127.0.0.1", port)) as sock:
            with client.wrap_socket(sock, server_hostname=server_hostname):
                pass
    finally:
        thread.join(5)
        listener.close()


@pytest.mark.parametrize(
    "name", ["inferfleet-lab-lb", "127.0.0.1", "inferfleet-lab-nginx", "127.0.0.2"]
)
def test_a_client_trusting_the_lab_ca_accepts_every_name_and_address(tmp_path, name):
    issued = tls.issue({"inferfleet-lab-lb": "127.0.0.1", "inferfleet-lab-nginx": "127.0.0.2"})
    _handshake(issued, tmp_path, name, issued["ca"])


def test_another_ca_or_another_name_is_refused(tmp_path):
    issued = tls.issue({"inferfleet-lab-lb": "127.0.0.1"})
    other = tls.issue({"inferfleet-lab-lb": "127.0.0.1"})
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(issued, tmp_path, "inferfleet-lab-lb", other["ca"])
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(issued, tmp_path, "elsewhere", issued["ca"])


def test_the_secrets_keep_the_certificate_while_tls_is_on_and_drop_it_after(tmp_path):
    inventory = tmp_path / "lab"
    (inventory / "group_vars" / "all").mkdir(parents=True)
    (inventory / "hosts.yml").write_text("all:\n  hosts:\n    lb: {}\n    node1: {}\n")
    addresses = {"lb": "10.0.0.5", "node1": "10.0.0.6"}
    secrets_file = inventory / "group_vars" / "all" / "secrets.yml"
    first = fleet.write_state(inventory, addresses, tls_hosts=["lb"])
    assert secrets_file.stat().st_mode & 0o777 == 0o600
    assert fleet.ca_file(inventory).read_text() == first["inferfleet_lab_tls_ca"]
    # Ansible reads the inventory directory and nothing in it but the inventory.
    listed = subprocess.run(
        [Path(sys.executable).parent / "ansible-inventory", "-i", inventory, "--list"],
        capture_output=True, text=True, check=True,
    )
    assert "Unable to parse" not in listed.stderr, listed.stderr
    assert json.loads(listed.stdout)["_meta"]["hostvars"]["lb"]["inferfleet_address"] == "10.0.0.5"
    again = fleet.write_state(inventory, addresses, tls_hosts=["lb"])
    assert again == first  # the same keys and certificate while the lab lives
    # A second load balancer: a certificate (and CA) for both, the keys kept.
    both = fleet.write_state(inventory, addresses | {"lb2": "10.0.0.7"}, tls_hosts=["lb", "lb2"])
    assert tls.names(both["inferfleet_lab_tls_certificate"]) == {
        "lb", "10.0.0.5", "lb2", "10.0.0.7"}
    assert both["inferfleet_lab_tls_ca"] != first["inferfleet_lab_tls_ca"]
    assert fleet.ca_file(inventory).read_text() == both["inferfleet_lab_tls_ca"]
    assert both["inferfleet_lab_api_key"] == first["inferfleet_lab_api_key"]
    assert fleet.write_state(inventory, addresses | {"lb2": "10.0.0.7"}, ["lb", "lb2"]) == both
    plain = fleet.write_state(inventory, addresses)
    assert not [k for k in plain if k.startswith("inferfleet_lab_tls_")]
    assert plain["inferfleet_lab_api_key"] == first["inferfleet_lab_api_key"]
    assert not fleet.ca_file(inventory).exists()
    assert yaml.safe_load(secrets_file.read_text()) == plain
    fleet.write_state(inventory, addresses, tls_hosts=["lb"])
    fleet.remove_state(inventory)
    assert not secrets_file.exists() and not fleet.ca_file(inventory).exists()


def test_the_cli_asks_a_tls_load_balancer_over_https_trusting_the_fleets_ca(tmp_path):
    from inferfleet import fleet as fleet_mod

    issued = tls.issue({"lb": "10.0.0.5"})

    def inventory(name: str, group_vars: dict) -> fleet_mod.Fleet:
        inv = tmp_path / name
        (inv / "group_vars").mkdir(parents=True)
        (inv / "group_vars" / "all.yml").write_text(yaml.safe_dump(group_vars))
        lb = {"inferfleet_address": "10.0.0.5"}
        (inv / "hosts.yml").write_text(
            yaml.safe_dump(
                {
                    "all": {
                        "children": {
                            "inference": {"hosts": {"n1": None}},
                            "loadbalancers": {"hosts": {"lb": lb}},
                        }
                    }
                }
            )
        )
        return fleet_mod.load(inv)

    plain = inventory("plain", {})
    assert plain.balancers == ["http://10.0.0.5:80"] and plain.ca == ""
    on = inventory(
        "tls",
        {
            "load_balancer_tls_certificate": issued["certificate"],
            "load_balancer_tls_key": issued["key"],
            "load_balancer_tls_ca_certificate": issued["ca"],
        },
    )
    assert on.balancers == ["https://10.0.0.5:80"] and on.ca == issued["ca"]
