"""Fetch a caller-given http(s) URL without letting it reach inside the deployment (SSRF).

:func:`fetch_url` resolves the host once, refuses it **before any connection** when an
address is not public (:func:`is_public_address`: loopback, private, shared/CGNAT,
link-local, multicast, reserved, unspecified, documentation, IPv4 inside IPv6 as mapped,
6to4, Teredo or NAT64 addresses judged by the IPv4 they carry) or is a cloud metadata
endpoint, then connects to exactly the address it checked: the request goes to the IP,
with the original ``Host`` header and TLS server name (``sni_hostname``), so a second DNS
answer (rebinding) is never asked for. Redirects are followed here, not by httpx, and every
hop is checked the same way (at most ``max_redirects``). The body is capped while it
streams and the whole fetch, DNS included, has one deadline. Proxies from the environment
are ignored (a proxy would connect on our behalf to whatever it resolves).

Every refusal or failure raises :class:`URLFetchError`; its text is for logs only, callers
answer their clients with one fixed message so the reason is no oracle. No FastAPI here:
the API's input references use it, and so can workers (webhook destinations).
"""

from __future__ import annotations

import ipaddress
import socket
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from typing import Literal

import httpx

from models.errors import URLFetchError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
# host, port → the addresses it resolves to (textual IPs)
Resolver = Callable[[str, int], Sequence[str]]
# ``public``: only hosts whose every address is public; ``any``: no address check (an
# operator's opt-in for trusted callers and tests).
Policy = Literal["public", "any"]

# Instance metadata services. Most are already non-public (link-local, private, CGNAT);
# they are listed so the refusal does not depend on that.
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",  # AWS, GCP, Azure, OpenStack, DigitalOcean ...
        "169.254.170.2",  # AWS ECS task metadata
        "fd00:ec2::254",  # AWS IPv6
        "100.100.100.200",  # Alibaba Cloud
        "192.0.0.192",  # Oracle Cloud
        "168.63.129.16",  # Azure wire server (a public address)
    )
)
METADATA_HOSTS = frozenset(
    {
        "metadata",
        "metadata.google.internal",
        "metadata.goog",
        "metadata.azure.internal",
        "instance-data",
        "instance-data.ec2.internal",
    }
)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_REDIRECTS = frozenset({301, 302, 303, 307, 308})


def is_public_address(ip: IPAddress) -> bool:
    """True when ``ip`` is a globally routable unicast address that is no metadata endpoint;
    IPv6 addresses that carry an IPv4 one (mapped, 6to4, Teredo, NAT64) are judged by it."""
    if ip in METADATA_ADDRESSES:
        return False
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return is_public_address(ip.ipv4_mapped)
        if ip in _NAT64:
            return is_public_address(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
        if ip.sixtofour is not None and not is_public_address(ip.sixtofour):
            return False
        if ip.teredo is not None and not all(is_public_address(a) for a in ip.teredo):
            return False
        if ip.is_site_local:
            return False
    return ip.is_global and not (
        ip.is_multicast
        or ip.is_private
        or ip.is_reserved
        or ip.is_loopback
        or ip.is_link_local
        or ip.is_unspecified
    )


def system_resolver(host: str, port: int) -> list[str]:
    """Every address ``getaddrinfo`` gives for ``host`` (TCP)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def _resolve_by(resolver: Resolver, host: str, port: int, timeout_s: float) -> list[IPAddress]:
    """Resolve in a helper thread so DNS counts against the deadline (getaddrinfo has no
    timeout of its own); a resolver still running at the deadline is abandoned."""
    result: list[Sequence[str] | BaseException] = []
    done = threading.Event()

    def run() -> None:
        try:
            result.append(resolver(host, port))
        except BaseException as exc:  # handed to the caller below
            result.append(exc)
        finally:
            done.set()

    threading.Thread(target=run, name="url-guard-resolve", daemon=True).start()
    if not done.wait(max(timeout_s, 0.0)):
        raise URLFetchError(f"resolving {host!r} timed out")
    answer = result[0]
    if isinstance(answer, BaseException):
        raise URLFetchError(f"resolving {host!r} failed: {answer!r}")
    try:
        addresses = [ipaddress.ip_address(a.split("%", 1)[0]) for a in answer]
    except ValueError as exc:
        raise URLFetchError(f"resolver gave a non-address for {host!r}: {exc}") from None
    if not addresses:
        raise URLFetchError(f"{host!r} resolves to no address")
    return addresses


def pin(
    url: httpx.URL,
    *,
    policy: Policy,
    resolver: Resolver,
    timeout_s: float,
    allow: Callable[[IPAddress], bool] = is_public_address,
) -> IPAddress:
    """The one address to connect to for ``url``, after checking every address its host
    resolves to (any refused address refuses the host: no picking the good one)."""
    if url.scheme not in ("http", "https"):
        raise URLFetchError(f"scheme {url.scheme!r} is not http(s)")
    host = url.raw_host.decode("ascii").rstrip(".").lower()  # IDNA (punycode) form
    if not host:
        raise URLFetchError("the URL has no host")
    if url.userinfo:
        raise URLFetchError("credentials in the URL are not sent")
    if policy != "any" and (
        host in METADATA_HOSTS or host == "localhost" or host.endswith(".localhost")
    ):
        raise URLFetchError(f"host {host!r} is refused")
    try:
        addresses = [ipaddress.ip_address(host)]
    except ValueError:
        port = url.port or (443 if url.scheme == "https" else 80)
        addresses = _resolve_by(resolver, host, port, timeout_s)
    if policy != "any":
        refused = [a for a in addresses if not allow(a)]
        if refused:
            raise URLFetchError(f"host {host!r} resolves to refused address {refused[0]}")
    return addresses[0]


def fetch_url(
    url: str,
    *,
    max_bytes: int,
    timeout_s: float,
    policy: Policy = "public",
    max_redirects: int = 3,
    resolver: Resolver = system_resolver,
    allow: Callable[[IPAddress], bool] = is_public_address,
    headers: dict[str, str] | None = None,
    verify: ssl.SSLContext | bool = True,
) -> bytes:
    """GET ``url`` (following at most ``max_redirects`` redirects, each re-checked) and
    return its body: status 200 only, at most ``max_bytes``, all within ``timeout_s``.
    TLS certificates are checked against the URL's host (``verify``: httpx's option)."""
    deadline = time.monotonic() + timeout_s
    try:
        current = httpx.URL(url)
    except (httpx.InvalidURL, TypeError) as exc:
        raise URLFetchError(f"invalid URL: {exc}") from None
    try:
        with httpx.Client(
            trust_env=False, follow_redirects=False, timeout=timeout_s, verify=verify
        ) as client:
            for _hop in range(max_redirects + 1):
                address = pin(
                    current,
                    policy=policy,
                    resolver=resolver,
                    allow=allow,
                    timeout_s=deadline - time.monotonic(),
                )
                location = _get(client, current, address, max_bytes, deadline, headers or {})
                if isinstance(location, bytes):
                    return location
                try:
                    current = current.join(location)
                except (httpx.InvalidURL, ValueError) as exc:
                    raise URLFetchError(f"bad redirect location: {exc}") from None
    except httpx.HTTPError as exc:
        raise URLFetchError(f"fetch failed: {exc!r}") from None
    raise URLFetchError(f"more than {max_redirects} redirects")


def pinned_request(
    client: httpx.Client,
    method: str,
    url: httpx.URL,
    address: IPAddress,
    headers: dict[str, str],
    timeout_s: float,
    content: bytes | None = None,
) -> httpx.Request:
    """A request for ``url`` that connects to ``address`` (from :func:`pin`) and nothing
    else: the original ``Host`` header and TLS server name, so no second DNS answer is
    ever asked for (the guard's check holds for the connection)."""
    return client.build_request(
        method,
        url.copy_with(host=str(address)),
        headers={**headers, "Host": url.netloc.decode("ascii")},
        content=content,
        extensions={"sni_hostname": url.raw_host.decode("ascii")},
        timeout=httpx.Timeout(timeout_s),
    )


def _get(
    client: httpx.Client,
    url: httpx.URL,
    address: IPAddress,
    max_bytes: int,
    deadline: float,
    headers: dict[str, str],
) -> bytes | str:
    """One request to ``address``: the body, or the ``Location`` of a redirect."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise URLFetchError("timed out")
    request = pinned_request(
        client, "GET", url, address, {**headers, "Accept-Encoding": "identity"}, remaining
    )
    response = client.send(request, stream=True)
    try:
        if response.status_code in _REDIRECTS and "location" in response.headers:
            return response.headers["location"]
        if response.status_code != 200:
            raise URLFetchError(f"HTTP status {response.status_code}")
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > max_bytes:
            raise URLFetchError(f"declared length {declared} is over {max_bytes} bytes")
        data = bytearray()
        for chunk in response.iter_raw():
            data += chunk
            if len(data) > max_bytes:
                raise URLFetchError(f"body is over {max_bytes} bytes")
            if time.monotonic() > deadline:
                raise URLFetchError("timed out while reading the body")
        return bytes(data)
    finally:
        response.close()
