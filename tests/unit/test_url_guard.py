"""storage/url_guard.py: what it refuses before connecting, that it connects to the address
it checked, and the redirect, size and time bounds, against real local HTTP servers."""

from __future__ import annotations

import ipaddress
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import trustme

from storage.url_guard import IPAddress, URLFetchError, fetch_url, is_public_address

BODY = b"\x89PNG\r\n\x1a\n" + b"x" * 1000


class _Server:
    """A ThreadingHTTPServer whose routes are ``path → (status, headers, body)``."""

    def __init__(self, host: str = "127.0.0.1", tls: ssl.SSLContext | None = None) -> None:
        self.routes: dict[str, tuple[int, dict[str, str], bytes]] = {}
        self.requests: list[tuple[str, str]] = []  # (path, Host header)
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.requests.append((self.path, self.headers.get("Host", "")))
                if self.path == "/slow":
                    self.send_response(200)
                    self.end_headers()
                    for _ in range(40):
                        self.wfile.write(b"x")
                        self.wfile.flush()
                        time.sleep(0.1)
                    return
                status, headers, body = server.routes.get(self.path, (404, {}, b"no"))
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer((host, 0), Handler)
        self.httpd.daemon_threads = True
        if tls is not None:
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True)
        self.port = int(self.httpd.server_address[1])
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[_Server]:
    srv = _Server()
    srv.routes["/img.png"] = (200, {"Content-Type": "image/png"}, BODY)
    yield srv
    srv.close()


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A listening socket that should never see a connection."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        sock.settimeout(0.3)
        yield sock


def _no_connection(sock: socket.socket) -> bool:
    try:
        conn, _ = sock.accept()
    except TimeoutError:
        return True
    conn.close()
    return False


def _resolver(table: dict[str, list[str]], calls: list[str]) -> Callable[[str, int], list[str]]:
    def resolve(host: str, port: int) -> list[str]:
        calls.append(host)
        return table[host]

    return resolve


def _fetch(url: str, **kw: object) -> bytes:
    args: dict[str, object] = {"max_bytes": 10_000, "timeout_s": 5.0, **kw}
    return fetch_url(url, **args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "127.8.9.10",
        "::1",
        "0.0.0.0",
        "::",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "100.64.0.1",
        "169.254.169.254",
        "169.254.1.1",
        "fe80::1",
        "fd00:ec2::254",
        "fc00::1",
        "100.100.100.200",
        "224.0.0.1",
        "ff02::1",
        "240.0.0.1",
        "255.255.255.255",
        "192.0.2.1",
        "198.18.0.1",
        "::ffff:127.0.0.1",
        "::ffff:10.0.0.1",
        "::ffff:169.254.169.254",
        "2002:7f00:1::1",
        "2002:a00:1::1",
        "64:ff9b::7f00:1",
        "64:ff9b::a9fe:a9fe",
        "2001:0:4136:e378:8000:63bf:80ff:fffe",
        "fec0::1",
        "168.63.129.16",
        "192.0.0.192",
    ],
)
def test_non_public_addresses_are_refused(address: str) -> None:
    assert not is_public_address(ipaddress.ip_address(address))


@pytest.mark.parametrize(
    "address", ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "::ffff:8.8.8.8", "64:ff9b::808:808"]
)
def test_public_addresses_are_allowed(address: str) -> None:
    assert is_public_address(ipaddress.ip_address(address))


def test_any_fetches_a_local_server(server: _Server) -> None:
    assert _fetch(f"http://127.0.0.1:{server.port}/img.png", policy="any") == BODY
    assert server.requests == [("/img.png", f"127.0.0.1:{server.port}")]


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1",
        "localhost",
        "[::1]",
        "10.0.0.1",
        "169.254.169.254",
        "[::ffff:127.0.0.1]",
        "metadata.google.internal",
        "LOCALHOST.",
        "[fd00:ec2::254]",
        "2130706433",
    ],
)
def test_public_refuses_before_connecting(host: str, listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    calls: list[str] = []
    resolver = _resolver({"2130706433": ["127.0.0.1"]}, calls)
    with pytest.raises(URLFetchError):
        _fetch(f"http://{host}:{port}/x.png", resolver=resolver)
    assert _no_connection(listener)


@pytest.mark.parametrize(
    "answer", [["10.0.0.7"], ["8.8.8.8", "127.0.0.1"], ["::ffff:127.0.0.1"], ["fe80::1%eth0"]]
)
def test_a_name_resolving_to_any_refused_address_is_refused(
    answer: list[str], listener: socket.socket
) -> None:
    calls: list[str] = []
    port = listener.getsockname()[1]
    with pytest.raises(URLFetchError, match="refused address"):
        resolver = _resolver({"images.example": answer}, calls)
        _fetch(f"http://images.example:{port}/a.png", resolver=resolver)
    assert calls == ["images.example"] and _no_connection(listener)


def _only(allowed: str) -> Callable[[IPAddress], bool]:
    """Public addresses plus one loopback address standing in for a public host."""
    return lambda ip: ip == ipaddress.ip_address(allowed) or is_public_address(ip)


@pytest.fixture
def second_loopback() -> Iterator[_Server]:
    try:
        srv = _Server("127.0.0.2")
    except OSError:
        pytest.fail("127.0.0.2 is not routable to loopback on this machine")
    yield srv
    srv.close()


def test_connects_to_the_address_it_checked(second_loopback: _Server) -> None:
    """Resolved once per hop, connected to that very address with the original Host:
    a resolver that would answer loopback the second time (rebinding) is never asked."""
    srv = second_loopback
    srv.routes["/img.png"] = (200, {}, BODY)
    answers = iter([["127.0.0.2"], ["127.0.0.1"]])
    calls: list[str] = []

    def rebinding(host: str, port: int) -> list[str]:
        calls.append(host)
        return next(answers)

    url = f"http://pictures.example:{srv.port}/img.png"
    assert _fetch(url, resolver=rebinding, allow=_only("127.0.0.2")) == BODY
    assert calls == ["pictures.example"]
    assert srv.requests == [("/img.png", f"pictures.example:{srv.port}")]


@pytest.mark.parametrize("cert_host", ["pictures.example", "elsewhere.example"])
def test_tls_to_the_pinned_address_verifies_the_original_host(cert_host: str) -> None:
    """Connecting to the IP does not weaken TLS: the server name sent and the name the
    certificate must carry are the URL's host."""
    ca = trustme.CA()
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(cert_host).configure_cert(server_ctx)
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)
    try:
        srv = _Server("127.0.0.2", tls=server_ctx)
    except OSError:
        pytest.fail("127.0.0.2 is not routable to loopback on this machine")
    srv.routes["/img.png"] = (200, {}, BODY)
    calls: list[str] = []
    resolver = _resolver({"pictures.example": ["127.0.0.2"]}, calls)
    url = f"https://pictures.example:{srv.port}/img.png"
    try:
        if cert_host == "pictures.example":
            body = _fetch(url, resolver=resolver, allow=_only("127.0.0.2"), verify=client_ctx)
            assert body == BODY
            assert srv.requests == [("/img.png", f"pictures.example:{srv.port}")]
        else:
            with pytest.raises(URLFetchError, match=r"CERTIFICATE_VERIFY_FAILED|certificate"):
                _fetch(url, resolver=resolver, allow=_only("127.0.0.2"), verify=client_ctx)
            assert srv.requests == []
    finally:
        srv.close()


def test_a_redirect_to_loopback_is_refused(
    second_loopback: _Server, listener: socket.socket
) -> None:
    srv = second_loopback
    target = f"http://127.0.0.1:{listener.getsockname()[1]}/secret"
    srv.routes["/go"] = (302, {"Location": target}, b"")
    calls: list[str] = []
    resolver = _resolver({"pictures.example": ["127.0.0.2"]}, calls)
    with pytest.raises(URLFetchError, match="refused address"):
        url = f"http://pictures.example:{srv.port}/go"
        _fetch(url, resolver=resolver, allow=_only("127.0.0.2"))
    assert [p for p, _ in srv.requests] == ["/go"]
    assert _no_connection(listener)


def test_redirects_are_followed_and_bounded(server: _Server) -> None:
    base = f"http://127.0.0.1:{server.port}"
    for i in range(5):
        server.routes[f"/r{i}"] = (302, {"Location": f"/r{i + 1}"}, b"")
    server.routes["/r5"] = (200, {}, BODY)
    assert _fetch(f"{base}/r2", policy="any") == BODY  # three hops
    with pytest.raises(URLFetchError, match="redirects"):
        _fetch(f"{base}/r1", policy="any")  # four hops
    server.routes["/ftp"] = (302, {"Location": "ftp://example.com/x"}, b"")
    with pytest.raises(URLFetchError, match="scheme"):
        _fetch(f"{base}/ftp", policy="any")
    server.routes["/broken"] = (302, {"Location": "http://[::1"}, b"")
    with pytest.raises(URLFetchError, match=r"(?i)location"):
        _fetch(f"{base}/broken", policy="any")


def test_status_size_and_time_bounds(server: _Server) -> None:
    base = f"http://127.0.0.1:{server.port}"
    with pytest.raises(URLFetchError, match="HTTP status 404"):
        _fetch(f"{base}/missing", policy="any")
    server.routes["/big"] = (200, {}, b"y" * 20_000)
    with pytest.raises(URLFetchError, match="over 10000"):
        _fetch(f"{base}/big", policy="any")
    started = time.monotonic()
    with pytest.raises(URLFetchError, match=r"timed out|Timeout"):
        _fetch(f"{base}/slow", policy="any", timeout_s=0.5)
    assert time.monotonic() - started < 3  # bounded by the deadline, not the 4 s body


def test_unresolvable_and_malformed_urls_fail_cleanly() -> None:
    def broken(host: str, port: int) -> list[str]:
        raise socket.gaierror("no such host")

    with pytest.raises(URLFetchError, match="resolving"):
        _fetch("http://nowhere.example/a.png", resolver=broken)

    def hanging(host: str, port: int) -> list[str]:
        time.sleep(2)
        return ["8.8.8.8"]

    with pytest.raises(URLFetchError, match=r"resolving .* timed out"):
        _fetch("http://slow-dns.example/a.png", resolver=hanging, timeout_s=0.2)
    for url in ("http://", "file:///etc/passwd", "http://user:pw@8.8.8.8/", "http://[::1"):
        with pytest.raises(URLFetchError):
            _fetch(url)
