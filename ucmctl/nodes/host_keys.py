"""SSH host keys, checked the way OpenSSH checks them.

A node's key must be in the user's known_hosts (`UserKnownHostsFile` from the SSH config, else
~/.ssh/known_hosts, plus the system's /etc/ssh/ssh_known_hosts). An unknown key is refused,
naming the host and the key's SHA256 fingerprint, unless the user opted in: with
`--accept-new-host-keys` (or `StrictHostKeyChecking accept-new` / `no` for that host in the SSH
config) it is accepted and recorded in the user's known_hosts, as `accept-new` does. A key that
differs from the recorded one is always refused.
"""

from __future__ import annotations

import base64
import hashlib
import os
import threading
from pathlib import Path
from typing import Any

import paramiko

SYSTEM_KNOWN_HOSTS = Path("/etc/ssh/ssh_known_hosts")
_APPEND_LOCK = threading.Lock()  # nodes connect in parallel threads, and may record at once


def fingerprint(key: paramiko.PKey) -> str:
    """`SHA256:...`, as `ssh-keygen -lf` and OpenSSH's prompts print it."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


class UnknownHostKey(paramiko.SSHException):
    def __init__(self, hostname: str, key: paramiko.PKey) -> None:
        super().__init__(hostname, key)
        self.hostname = hostname
        self.key = key


class _Policy(paramiko.MissingHostKeyPolicy):
    def __init__(self, accept_new: bool, record_in: Path) -> None:
        self.accept_new = accept_new
        self.record_in = record_in

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        if not self.accept_new:
            raise UnknownHostKey(hostname, key)
        client.get_host_keys().add(hostname, key.get_name(), key)
        record(self.record_in, hostname, key)


def known_hosts_files(ssh_config: dict[str, Any]) -> list[Path]:
    """The user's known_hosts files for a host, by its SSH config; the first is written to."""
    given = ssh_config.get("userknownhostsfile")
    names = given.split() if isinstance(given, str) else list(given or [])
    return [Path(os.path.expanduser(n)) for n in names] or [Path.home() / ".ssh" / "known_hosts"]


def configure(client: paramiko.SSHClient, ssh_config: dict[str, Any], *, accept_new: bool) -> None:
    """Load the known keys into `client` and set what happens to an unknown one."""
    files = known_hosts_files(ssh_config)
    for path in [*files, SYSTEM_KNOWN_HOSTS]:
        _load(client.get_host_keys(), path)
    strict = str(ssh_config.get("stricthostkeychecking", "")).lower()
    opted_in = accept_new or strict in ("accept-new", "no", "off")
    client.set_missing_host_key_policy(_Policy(opted_in, files[0]))


def _load(keys: paramiko.HostKeys, path: Path) -> None:
    """Every valid line of a known_hosts file; like OpenSSH, skip lines it cannot read (a
    marker such as @cert-authority, a key type paramiko lacks, a damaged line)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:  # absent or unreadable: nothing known from it
        return
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith(("#", "@")):
            continue
        try:
            entry = paramiko.hostkeys.HostKeyEntry.from_line(line, number)
        except (paramiko.hostkeys.InvalidHostKey, paramiko.SSHException, ValueError):
            continue
        if entry is not None and entry.key is not None:
            for name in entry.hostnames:
                keys.add(name, entry.key.get_name(), entry.key)


def record(path: Path, hostname: str, key: paramiko.PKey) -> None:
    """Append `hostname keytype base64` to a known_hosts file (created 0600, folder 0700)."""
    line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
    with _APPEND_LOCK:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                line = "\n" + line  # never glue our line onto a last line without a newline
            os.write(fd, line.encode())
        finally:
            os.close(fd)


def describe(exc: BaseException, host: str, port: int) -> str | None:
    """One line for a host-key refusal, with what to do; None for any other error."""
    keyscan = (
        f"ssh-keyscan -p {port} {host} >> ~/.ssh/known_hosts"
        if port != 22
        else f"ssh-keyscan {host} >> ~/.ssh/known_hosts"
    )
    if isinstance(exc, UnknownHostKey):
        return (
            f"unknown SSH host key for {exc.hostname} ({exc.key.get_name()} {fingerprint(exc.key)}); "
            f"check the fingerprint, then rerun with --accept-new-host-keys or add it (`{keyscan}`)"
        )
    if isinstance(exc, paramiko.BadHostKeyException):
        return (
            f"SSH host key of {host} changed: it offers {exc.key.get_name()} {fingerprint(exc.key)}, "
            f"known_hosts has {fingerprint(exc.expected_key)}; if the node was reinstalled, remove "
            f"the old key (`ssh-keygen -R {host}`), else someone may be intercepting the connection"
        )
    return None
