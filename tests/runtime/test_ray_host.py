"""``serve --engine ray --host H`` starts its Ray cluster listening on H, not on every interface.

Ray listens on its node address; given a loopback one it would substitute the machine's
external address (so other nodes could join) unless its clusters are switched off for that
call. These tests check what the engine asks of Ray with a stand-in for it (no cluster is
started); the listening sockets themselves were checked by hand with ``ss -ltnp``.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from edgesplit.runtime.ray_engine import RayEngine, RayOptions, cluster_options


@pytest.mark.parametrize(("host", "node"), [
    ("127.0.0.1", "127.0.0.1"), ("localhost", "127.0.0.1"), ("127.0.0.2", "127.0.0.1"),
    ("10.1.2.3", "10.1.2.3"), ("::1", "127.0.0.1")])
def test_a_cluster_started_here_takes_the_ingress_host_as_its_address(host, node):
    init = cluster_options(RayOptions(host=host))
    assert init["_node_ip_address"] == node and init["dashboard_host"] == node
    assert init["address"] is None and init["include_dashboard"] is False


@pytest.mark.parametrize("options", [RayOptions(), RayOptions(host="0.0.0.0"),
                                     RayOptions(host="::"),
                                     RayOptions(host="127.0.0.1", address="10.0.0.9:6379")])
def test_every_interface_or_a_joined_cluster_keeps_rays_defaults(options):
    init = cluster_options(options)
    assert "_node_ip_address" not in init and "dashboard_host" not in init


class _FakeRay:
    """Records what ``ray.init`` and ``serve.start`` were called with, and whether Ray's
    clusters were switched off during ``init`` (what keeps a loopback address loopback)."""

    def __init__(self) -> None:
        self._private = SimpleNamespace(ray_constants=SimpleNamespace(ENABLE_RAY_CLUSTER=True))
        self.init_kwargs: dict = {}
        self.clusters_during_init: bool | None = None
        self.serve = SimpleNamespace(start=self._start)
        self.start_kwargs: dict = {}

    def is_initialized(self) -> bool:
        return False

    def init(self, **kwargs) -> None:
        self.init_kwargs = kwargs
        self.clusters_during_init = self._private.ray_constants.ENABLE_RAY_CLUSTER

    def _start(self, **kwargs) -> None:
        self.start_kwargs = kwargs


def _start(options: RayOptions) -> _FakeRay:
    fake = _FakeRay()
    engine = RayEngine.__new__(RayEngine)  # the cluster step alone, without a deployment
    engine.ray, engine.serve, engine.options = fake, fake.serve, options
    engine._start_cluster()
    return fake


def test_the_engine_starts_ray_on_the_loopback_host_it_serves():
    fake = _start(RayOptions(host="127.0.0.1"))
    assert fake.init_kwargs["_node_ip_address"] == "127.0.0.1"
    assert fake.clusters_during_init is False  # else Ray swaps in the external address
    assert fake._private.ray_constants.ENABLE_RAY_CLUSTER is True  # restored after
    assert fake.start_kwargs == {"proxy_location": "Disabled",
                                 "http_options": {"host": "127.0.0.1"}}
    other = _start(RayOptions(host="10.1.2.3"))
    assert other.init_kwargs["_node_ip_address"] == "10.1.2.3"
    assert other.clusters_during_init is True  # only a loopback address needs it
