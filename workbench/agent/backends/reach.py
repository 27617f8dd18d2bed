"""Whether a model API can be reached at all, asked before a session is made, for every transport.

A refused connection, a name that does not resolve and an unreachable network are known in milliseconds and will not
fix themselves while a new session waits: they are one line naming the URL, and exit 2. A connection that neither
opens nor fails within the timeout is only a warning (a slow link may still work). Where the environment routes the
URL through a proxy (HTTPS_PROXY, ALL_PROXY, NO_PROXY, as the HTTP clients read them) the proxy is what must answer.
"""

from __future__ import annotations

import errno
import socket
import urllib.parse
import urllib.request

from workbench.agent.backends.transport import BackendError

TIMEOUT_S = 5.0
"""How long the connection may take to open."""
_UNREACHABLE = {errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EADDRNOTAVAIL}


def _endpoint(url: str) -> tuple[str, int]:
    parts = urllib.parse.urlsplit(url)
    if not parts.hostname:
        raise BackendError(f"the model API URL {url!r} names no host")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise BackendError(f"the model API URL {url!r} has an invalid port") from None
    return parts.hostname, port


def _proxy(url: str) -> str | None:
    """The proxy the environment routes `url` through, or None."""
    parts = urllib.parse.urlsplit(url)
    if not parts.hostname or urllib.request.proxy_bypass_environment(parts.hostname):
        return None
    proxies = urllib.request.getproxies_environment()
    return proxies.get(parts.scheme) or proxies.get("all")


def check(url: str, timeout: float = TIMEOUT_S) -> str | None:
    """Open (and close) a TCP connection to the model API's host, or to the proxy in its way.

    Returns:
        None when it opened; a warning when it did not within `timeout`.

    Raises:
        BackendError: the name does not resolve, the connection is refused, or the network is unreachable.
    """
    proxy = _proxy(url)
    target = proxy or url
    what = f"the proxy {proxy} for the model API at {url}" if proxy else f"the model API at {url}"
    host, port = _endpoint(target)
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise BackendError(f"cannot reach {what}: the name {host!r} does not resolve ({exc.strerror})") from None
    last: OSError | None = None
    for family, kind, proto, _, address in addresses:
        try:
            with socket.socket(family, kind, proto) as sock:
                sock.settimeout(timeout)
                sock.connect(address)
            return None
        except socket.timeout:
            return f"{what} did not accept a connection within {timeout:g} s; starting anyway"
        except OSError as exc:
            last = exc
    if isinstance(last, ConnectionRefusedError):
        raise BackendError(f"cannot reach {what}: connection refused ({host}:{port})")
    if last is not None and last.errno in _UNREACHABLE:
        raise BackendError(f"cannot reach {what}: {last.strerror} ({host}:{port})")
    return f"could not connect to {what} ({last.strerror if last else 'no address'}); starting anyway"
