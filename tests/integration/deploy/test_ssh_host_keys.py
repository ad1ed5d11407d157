"""SSH host keys against real sshd hosts: unknown keys refused unless opted in (then recorded),
changed keys always refused, each as one line naming the host and the key's fingerprint."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.cli import Cli
from tests.support.netns import Cluster
from tests.support.topology import mixed_sim, node_lines

pytestmark = [pytest.mark.slow, pytest.mark.root]


def topology(tmp: Path, hosts: Cluster, name: str) -> Path:
    path = tmp / f"{name}.yaml"
    path.write_text(mixed_sim(name, node_lines(hosts, ["h1"]), "h1", 8400))
    return path


def user_cli(tmp: Path, hosts: Cluster, known_hosts: Path) -> Cli:
    """A user whose SSH config names the hosts but whose known_hosts is `known_hosts`."""
    text = hosts.ssh_config.read_text().replace(str(hosts.known_hosts), str(known_hosts))
    assert text != hosts.ssh_config.read_text()
    config = tmp / "ssh_config"
    config.write_text(text)
    return Cli(tmp / "home", config)


def host_key(hosts: Cluster, name: str) -> tuple[str, str, str]:
    """(key type, base64, SHA256 fingerprint by ssh-keygen) of a host's SSH key."""
    pub = hosts.base / name / "host_key.pub"
    kind, b64 = pub.read_text().split()[:2]
    listed = subprocess.run(["ssh-keygen", "-lf", str(pub)], capture_output=True, text=True, check=True)
    return kind, b64, listed.stdout.split()[1]


def test_an_unknown_host_key_is_refused(tmp_path: Path, hosts: Cluster) -> None:
    known = tmp_path / "ssh" / "known_hosts"
    cli = user_cli(tmp_path, hosts, known)
    up = cli("up", str(topology(tmp_path, hosts, "t-hk-new")))
    assert up.returncode == 3, up.stderr
    address = hosts.host("h1").address
    kind, _, fp = host_key(hosts, "h1")
    problem = [line for line in up.stderr.splitlines() if "host key" in line]
    assert len(problem) == 1, up.stderr
    assert f"node h1 ({address}): unknown SSH host key for {address} ({kind} {fp})" in problem[0]
    assert "--accept-new-host-keys" in problem[0]
    assert not known.exists()  # nothing recorded without the opt-in
    assert hosts.processes_of("t-hk-new") == []


def test_an_opted_in_new_key_is_recorded_then_checked(tmp_path: Path, hosts: Cluster) -> None:
    known = tmp_path / "ssh" / "known_hosts"
    known.parent.mkdir()
    known.write_text("# mine\nother.example ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA2rsHm")  # no newline at end
    cli = user_cli(tmp_path, hosts, known)
    up = cli("up", str(topology(tmp_path, hosts, "t-hk-accept")), "--accept-new-host-keys")
    assert up.returncode == 0, up.stderr
    address = hosts.host("h1").address
    kind, b64, _ = host_key(hosts, "h1")
    assert known.read_text().splitlines() == [
        "# mine",
        "other.example ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA2rsHm",
        f"{address} {kind} {b64}",
    ]
    # recorded: every later command checks against it, without the option
    assert cli("status", "t-hk-accept").returncode == 0
    assert cli("down", "t-hk-accept").returncode == 0
    assert hosts.processes_of("t-hk-accept") == []
    assert len(known.read_text().splitlines()) == 3  # recorded once


def test_a_changed_host_key_is_refused_even_when_opted_in(tmp_path: Path, hosts: Cluster) -> None:
    known = tmp_path / "known_hosts"
    address = hosts.host("h1").address
    kind, b64, old_fp = host_key(hosts, "h2")  # what known_hosts says h1 is: another machine's key
    known.write_text(f"{address} {kind} {b64}\n")
    cli = user_cli(tmp_path, hosts, known)
    up = cli("up", str(topology(tmp_path, hosts, "t-hk-changed")), "--accept-new-host-keys")
    assert up.returncode == 3, up.stderr
    _, _, new_fp = host_key(hosts, "h1")
    problem = [line for line in up.stderr.splitlines() if "host key" in line]
    assert len(problem) == 1, up.stderr
    assert f"node h1 ({address}): SSH host key of {address} changed: it offers {kind} {new_fp}" in problem[0]
    assert f"known_hosts has {old_fp}" in problem[0] and f"ssh-keygen -R {address}" in problem[0]
    assert known.read_text() == f"{address} {kind} {b64}\n"  # never rewritten
    assert hosts.processes_of("t-hk-changed") == []
