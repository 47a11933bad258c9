"""Devices, links, topologies; measured profiles and latency estimators."""

from edgesplit.hardware.catalog import (
    get_device,
    get_link,
    get_topology,
    list_devices,
    list_links,
    list_topologies,
    register_device,
    register_link,
    register_topology,
    resolve_device,
    resolve_link,
    resolve_topology,
)
from edgesplit.hardware.device import (
    AnalyticalCompute,
    Device,
    MeasuredCompute,
    MemoryTier,
    WireCodec,
    serialize_ms,
)
from edgesplit.hardware.estimators import (
    ESTIMATORS,
    LatencyEstimator,
    ProfileEstimator,
    RegressionEstimator,
    RooflineEstimator,
    estimator_for,
    register_estimator,
)
from edgesplit.hardware.link import Link
from edgesplit.hardware.topology import Topology, TopologyLink, chain, mesh, star
from edgesplit.hardware.work import LayerWork

__all__ = [
    "ESTIMATORS",
    "AnalyticalCompute",
    "Device",
    "LatencyEstimator",
    "LayerWork",
    "Link",
    "MeasuredCompute",
    "MemoryTier",
    "ProfileEstimator",
    "RegressionEstimator",
    "RooflineEstimator",
    "Topology",
    "TopologyLink",
    "WireCodec",
    "chain",
    "estimator_for",
    "get_device",
    "get_link",
    "get_topology",
    "list_devices",
    "list_links",
    "list_topologies",
    "mesh",
    "register_device",
    "register_estimator",
    "register_link",
    "register_topology",
    "resolve_device",
    "resolve_link",
    "resolve_topology",
    "serialize_ms",
    "star",
]
