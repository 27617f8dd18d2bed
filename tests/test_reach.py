"""The reachability check a model API gets before a session is made (backends.reach), against real local sockets."""

from __future__ import annotations

import socket

import pytest

from workbench.agent.backends import reach
from workbench.agent.backends.transport import BackendError


@pytest.fixture
def listening():
    """A port that accepts connections (nothing is ever said on them)."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield server.getsockname()[1]


@pytest.fixture
def refused():
    """A port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def no_proxies(monkeypatch):
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "all_proxy",
                 "no_proxy"):
        monkeypatch.delenv(name, raising=False)


def test_an_open_port_passes_and_a_closed_one_is_a_one_line_error(monkeypatch, listening, refused):
    no_proxies(monkeypatch)
    assert reach.check(f"http://127.0.0.1:{listening}/v1") is None
    with pytest.raises(BackendError, match=rf"cannot reach the model API at http://127.0.0.1:{refused}: connection "
                                           rf"refused \(127.0.0.1:{refused}\)"):
        reach.check(f"http://127.0.0.1:{refused}")
    with pytest.raises(BackendError, match=r"the name 'nowhere.invalid' does not resolve"):
        reach.check("https://nowhere.invalid")


def test_through_a_proxy_the_proxy_is_what_must_answer(monkeypatch, listening, refused):
    no_proxies(monkeypatch)
    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{refused}")
    with pytest.raises(BackendError, match=rf"the proxy http://127.0.0.1:{refused} for the model API at "
                                           r"https://nowhere.invalid"):
        reach.check("https://nowhere.invalid")  # the host itself is the proxy's to resolve
    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{listening}")
    assert reach.check("https://nowhere.invalid") is None
    monkeypatch.setenv("NO_PROXY", "nowhere.invalid")
    with pytest.raises(BackendError, match="does not resolve"):
        reach.check("https://nowhere.invalid")
