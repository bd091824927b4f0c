"""The cluster's network: one namespace per host, one veth link per (host, service).

The services host holds one address per service on its loopback (``SERVICE_IPS``);
every other host reaches each service through its own point-to-point link, routed to
that address only, so a fault can take down one link (a worker's link to the broker)
and leave the others up. Clients run in the root namespace, which has the same three
service links (what the checks read) and one link to each host (the API, the metrics).

A partition is a link taken down at its services end: the host's side loses carrier and
its packets are dropped silently, as on a cut cable; TCP connections are not reset, so
whoever waits on them waits for a timeout (the kernel here has no ``netem``). Everything
is done with ``ip`` (iproute2) and torn down by :meth:`Network.destroy`, which also
removes whatever a crashed earlier run with the same tag left.
"""

from __future__ import annotations

import logging
import subprocess
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

SERVICES = ("redis", "postgres", "s3")
SERVICE_IPS = {"redis": "10.99.0.1", "postgres": "10.99.0.2", "s3": "10.99.0.3"}
SERVICES_HOST = "services"
ROOT = "root"  # the clients' namespace (the test process's own)


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``ip args``; a failure raises with ip's own message."""
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {proc.stderr.strip()}")
    return proc


def _subnet(index: int, slot: int) -> tuple[str, str]:
    """The two ends of link ``slot`` of host ``index``: (services/root end, host end)."""
    base = f"10.{100 + index}.{slot}"
    return f"{base}.1", f"{base}.2"


@dataclass
class Link:
    """One veth pair: ``far`` in the services host (or the root, for a client link),
    ``near`` in the host. Down means the far end down."""

    host: str
    peer: str  # a service name, or "client"
    near: str
    far: str
    far_ns: str | None  # None: the root namespace
    up: bool = True


@dataclass
class Network:
    tag: str
    hosts: list[str]  # in order; index i uses the 10.(101 + i).x.x subnets
    api_hosts: list[str]
    links: dict[tuple[str, str], Link] = field(default_factory=dict)
    addresses: dict[str, str] = field(default_factory=dict)  # host → its client address

    def ns(self, host: str) -> str | None:
        return None if host == ROOT else f"oq-{self.tag}-{host}"

    def create(self) -> None:
        self.destroy()  # a crashed run's leftovers with the same tag
        svc = self.ns(SERVICES_HOST)
        assert svc is not None
        ip("netns", "add", svc)
        ip("-n", svc, "link", "set", "lo", "up")
        for name in SERVICES:
            ip("-n", svc, "addr", "add", f"{SERVICE_IPS[name]}/32", "dev", "lo")
        for index, host in enumerate([ROOT, *self.hosts]):
            ns = self.ns(host)
            if ns is not None:
                ip("netns", "add", ns)
                ip("-n", ns, "link", "set", "lo", "up")
            for slot, service in enumerate(SERVICES):
                self._link(index, slot, host, service, svc)
            if ns is not None:  # clients reach APIs, and scrape every host's metrics
                self._link(index, 9, host, "client", None)

    def _link(self, index: int, slot: int, host: str, peer: str, far_ns: str | None) -> None:
        near_name, far_name = f"q{self.tag}{index}{slot}n", f"q{self.tag}{index}{slot}f"
        ip("link", "add", near_name, "type", "veth", "peer", "name", far_name)
        far_ip, near_ip = _subnet(index, slot)
        near_ns = self.ns(host)
        if near_ns is not None:
            ip("link", "set", near_name, "netns", near_ns)
        if far_ns is not None:
            ip("link", "set", far_name, "netns", far_ns)
        near = ["-n", near_ns] if near_ns else []
        far = ["-n", far_ns] if far_ns else []
        ip(*near, "addr", "add", f"{near_ip}/30", "dev", near_name)
        ip(*far, "addr", "add", f"{far_ip}/30", "dev", far_name)
        ip(*near, "link", "set", near_name, "up")
        ip(*far, "link", "set", far_name, "up")
        if peer == "client":
            self.addresses[host] = near_ip
        else:  # the host reaches the service's address through this link only
            ip(*near, "route", "add", f"{SERVICE_IPS[peer]}/32", "via", far_ip)
        self.links[(host, peer)] = Link(host, peer, near_name, far_name, far_ns)

    # ---- faults --------------------------------------------------------------------------

    def set_link(self, host: str, peer: str, up: bool) -> None:
        link = self.links[(host, peer)]
        far = ["-n", link.far_ns] if link.far_ns else []
        ip(*far, "link", "set", link.far, "up" if up else "down")
        link.up = up

    def isolate(self, host: str) -> None:
        """Every link of ``host`` down: nothing in or out."""
        for (h, peer), _ in self.links.items():
            if h == host:
                self.set_link(host, peer, False)

    def heal(self, host: str | None = None) -> None:
        """Every link (of ``host``) up again."""
        for (h, peer), link in self.links.items():
            if (host is None or h == host) and not link.up:
                self.set_link(h, peer, True)

    # ---- teardown ------------------------------------------------------------------------

    def destroy(self) -> None:
        """Delete every namespace of this tag (their links go with them) and any root
        end of a link left behind."""
        listed = ip("netns", "list", check=False).stdout.split()
        for name in listed:
            if name.startswith(f"oq-{self.tag}-"):
                ip("netns", "del", name, check=False)
        for line in ip("-o", "link", "show", check=False).stdout.splitlines():
            name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
            if name.startswith(f"q{self.tag}"):
                ip("link", "del", name, check=False)
