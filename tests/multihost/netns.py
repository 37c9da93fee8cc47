"""Several test hosts on one machine: Linux network namespaces joined by veth pairs.

:class:`Network` makes one namespace per host plus a *switch* namespace holding a bridge, and
joins each host to the bridge with a veth pair on a private /24 it picks at random, so two runs
never share an address. The machine running the test joins the same subnet through a veth of
its own (``gateway``), which is how the test reaches the hosts' API and servers; nothing else
is routed. :meth:`Network.cut` and :meth:`Network.restore` take one host's link down and up:
the host keeps its processes and its address, it just stops hearing anyone, as when a switch
port or a cable fails.

Everything is undone by :meth:`Network.close` (and the namespaces' processes are killed), so a
failed run leaves nothing behind. Making namespaces needs root and ``ip`` (iproute2);
:func:`unavailable` says why they cannot be made here, for a clear skip.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import signal
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "uc"
ETC_NETNS = Path("/etc/netns")


def _ip(*args: str, ns: str | None = None) -> None:
    cmd = ["ip", *(["-n", ns] if ns else []), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.strip()}")


def unavailable() -> str | None:
    """Why network namespaces cannot be made on this machine; None when they can."""
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    if os.geteuid() != 0:
        return "making network namespaces needs root"
    probe = f"{PREFIX}-probe-{os.getpid()}"
    try:
        _ip("netns", "add", probe)
    except RuntimeError as exc:
        return f"cannot make a network namespace: {exc}"
    _ip("netns", "del", probe)
    return None


def sweep_stale() -> None:
    """Remove what runs killed before their clean-up (SIGKILL, a lost session) left behind."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for namespace in {line.split()[0] for line in listed.splitlines() if line.strip()}:
        match = re.fullmatch(rf"{PREFIX}(\d+)-\w+", namespace)
        if match is None or _alive(int(match.group(1)[:-1])):
            continue
        Network([], tag=match.group(1)).close_namespace(namespace)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


@dataclass
class Host:
    name: str
    namespace: str
    address: str
    link: str  # the veth end on the switch: setting it down cuts the host off


@dataclass
class Network:
    """Hosts on a private subnet; see the module doc."""

    names: list[str]
    # this process's id and one digit: sweep_stale tells a dead run's namespaces by it
    tag: str = field(default_factory=lambda: f"{os.getpid()}{random.randrange(10)}")
    hosts: dict[str, Host] = field(default_factory=dict)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.subnet = f"10.{random.randrange(64, 250)}.{random.randrange(1, 250)}"
        self.switch = f"{PREFIX}{self.tag}-sw"
        self.gateway = f"{self.subnet}.1"

    def open(self) -> Network:
        sweep_stale()
        try:
            _ip("netns", "add", self.switch)
            _ip("link", "add", "br0", "type", "bridge", ns=self.switch)
            _ip("link", "set", "br0", "up", ns=self.switch)
            self._plug(None, "gw", self.gateway)  # the test's own machine
            for index, name in enumerate(self.names, start=10):
                namespace = f"{PREFIX}{self.tag}-{name}"
                _ip("netns", "add", namespace)
                _ip("link", "set", "lo", "up", ns=namespace)
                address = f"{self.subnet}.{index}"
                link = self._plug(namespace, name, address)
                self.hosts[name] = Host(name, namespace, address, link)
                self._resolve_hostname(namespace, address)
        except BaseException:
            self.close()
            raise
        return self

    def _plug(self, namespace: str | None, name: str, address: str) -> str:
        """A veth pair from ``namespace`` (None: this machine) to the bridge; the switch end."""
        inner, outer = f"{PREFIX}{self.tag}{name}", f"{PREFIX}{self.tag}{name}s"
        _ip("link", "add", inner, "type", "veth", "peer", "name", outer)
        _ip("link", "set", outer, "netns", self.switch)
        _ip("link", "set", outer, "master", "br0", ns=self.switch)
        _ip("link", "set", outer, "up", ns=self.switch)
        if namespace is not None:
            _ip("link", "set", inner, "netns", namespace)
        _ip("addr", "add", f"{address}/24", "dev", inner, ns=namespace)
        _ip("link", "set", inner, "up", ns=namespace)
        return outer

    @staticmethod
    def _resolve_hostname(namespace: str, address: str) -> None:
        """Inside ``namespace`` the machine's host name resolves to the host's own address, as
        on a real host (``ip netns exec`` mounts /etc/netns/<ns>/hosts over /etc/hosts): gloo
        binds to what the host name resolves to, and would fall back to loopback otherwise."""
        etc = ETC_NETNS / namespace
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text(f"127.0.0.1 localhost\n{address} {socket.gethostname()}\n")

    def spawn(
        self, host: str, argv: list[str], env: dict[str, str], log: Path
    ) -> subprocess.Popen[bytes]:
        """Run ``argv`` on ``host`` (in its namespace) with its output in ``log``."""
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", self.hosts[host].namespace, *argv],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs.append(proc)
        return proc

    def cut(self, host: str) -> None:
        _ip("link", "set", self.hosts[host].link, "down", ns=self.switch)

    def restore(self, host: str) -> None:
        _ip("link", "set", self.hosts[host].link, "up", ns=self.switch)

    def pids(self, host: str) -> set[int]:
        """Every process running in ``host``'s namespace now."""
        done = subprocess.run(
            ["ip", "netns", "pids", self.hosts[host].namespace], capture_output=True, text=True
        )
        return {int(pid) for pid in done.stdout.split()}

    def close(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        for host in self.hosts.values():
            self.close_namespace(host.namespace)
        self.close_namespace(self.switch)

    def close_namespace(self, namespace: str) -> None:
        """Kill what runs in ``namespace`` and delete it (and this run's link into it)."""
        done = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True)
        for pid in map(int, done.stdout.split()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(RuntimeError):
            _ip("netns", "del", namespace)
        shutil.rmtree(ETC_NETNS / namespace, ignore_errors=True)
        with contextlib.suppress(RuntimeError):
            _ip("link", "del", f"{PREFIX}{self.tag}gw")
