"""The built-in catalog against the papers' tables (AUTO-SPLIT Table 1, SplitNets section 3.2,
JMSNAS Table I and section V-A, DADS, L2S)."""

from __future__ import annotations

import pytest

from edgesplit.hardware.catalog import (
    get_device,
    get_link,
    get_topology,
    list_devices,
    list_links,
    list_topologies,
)
from edgesplit.hardware.device import OP_CLASSES, AnalyticalCompute

KB, MB, GB = 1024, 2**20, 2**30

PRESET_DEVICES = [
    "eyeriss", "tpu", "hmd-sensor", "hmd-aggregator", "raspberry-pi-4", "jetson-nano",
    "jetson-tx2", "jetson-agx-xavier", "rtx3050-laptop", "gtx1080ti-server", "v100-server",
    "phone-2022",
]
PRESET_LINKS = [
    "ble", "3g", "4g", "5g", "wifi", "jmsnas-ue-sbs", "jmsnas-sbs-mbs", "jmsnas-mbs-cloud",
    "autosplit-3mbps", "dads-cat1", "dads-3g", "dads-4g", "dads-wifi", "l2s-wifi-60",
    "l2s-wifi-100", "hmd-bus",
]
PRESET_TOPOLOGIES = ["jmsnas-chain", "jmsnas-mesh", "autosplit-edge-cloud", "hmd-star"]


def analytical(name: str) -> AnalyticalCompute:
    compute = get_device(name).compute
    assert isinstance(compute, AnalyticalCompute)
    return compute


def test_every_preset_is_registered() -> None:
    assert set(PRESET_DEVICES) <= set(list_devices())
    assert set(PRESET_LINKS) <= set(list_links())
    assert set(PRESET_TOPOLOGIES) <= set(list_topologies())


# --- AUTO-SPLIT (paper 001) Table 1 -----------------------------------------------------------

def test_eyeriss_matches_autosplit_table1() -> None:
    eyeriss = get_device("eyeriss")
    compute = analytical("eyeriss")
    assert compute.peak_gops == {8: 2 * 34.0}  # 34 G MAC/s ("GOPs"), INT8 MACs only
    assert compute.memory_bandwidth_gb_per_s == 1.0  # 1 GB/sec
    assert eyeriss.on_chip_memory_bytes == 192 * KB
    assert eyeriss.memory_bytes == 4 * GB
    assert eyeriss.supported_bits == (2, 4, 6, 8, 16)


def test_tpu_matches_autosplit_table1() -> None:
    tpu = get_device("tpu")
    compute = analytical("tpu")
    assert compute.peak_gops == {8: 96_000.0}  # 96 TOPs
    assert compute.memory_bandwidth_gb_per_s == 13.0  # 13 GB/sec
    assert tpu.on_chip_memory_bytes == 28 * MB
    assert tpu.memory_bytes == 16 * GB


def test_sub8_bit_layers_run_at_the_int8_peak() -> None:
    # AUTO-SPLIT section 5.1: fixed INT8 MAC units, sub-8-bit does not speed up MACs.
    compute = analytical("eyeriss")
    assert {compute.compute_bits(b) for b in (2, 4, 6, 8)} == {8}


def test_autosplit_uplink() -> None:
    assert get_link("autosplit-3mbps").bandwidth_mbps == 3.0


# --- SplitNets (paper 004) ---------------------------------------------------------------------

def test_hmd_sensor_matches_splitnets() -> None:
    assert analytical("hmd-sensor").peak_gops == {8: 2 * 125.0}  # 125 G MAC/s
    assert get_device("hmd-sensor").memory_bytes == 2 * MB  # 2 MB peak memory


def test_hmd_aggregator_matches_splitnets() -> None:
    assert analytical("hmd-aggregator").peak_gops == {8: 2 * 1250.0}  # 1.25 T MAC/s
    assert get_device("hmd-aggregator").memory_bytes is None  # "sufficient on-chip memory"


def test_hmd_bus_is_shared_1200_mbps() -> None:
    bus = get_link("hmd-bus")
    assert bus.bandwidth_mbps == 1200.0
    assert bus.shared
    assert bus.medium == "bus"
    # SplitNets Table 4: 4 sensors share the bus at 37.5 MB/s each; 3x224x224 bytes -> 4.01 ms.
    assert bus.transfer_ms(3 * 224 * 224, senders=4) == pytest.approx(4.01, abs=0.01)


# --- JMSNAS (paper 000) Table I, DADS, L2S ---------------------------------------------------

@pytest.mark.parametrize(("name", "mbps", "medium"), [
    ("jmsnas-ue-sbs", 25.0, "wireless"),
    ("jmsnas-sbs-mbs", 50.0, "wireless"),
    ("jmsnas-mbs-cloud", 200.0, "wired"),
])
def test_jmsnas_table1_links(name: str, mbps: float, medium: str) -> None:
    link = get_link(name)
    assert link.bandwidth_mbps == mbps
    assert link.medium == medium


@pytest.mark.parametrize(("name", "mbps"), [
    ("dads-cat1", 0.13), ("dads-3g", 1.1), ("dads-4g", 5.85), ("dads-wifi", 18.88),
    ("l2s-wifi-60", 60.0), ("l2s-wifi-100", 100.0),
])
def test_paper_uplinks(name: str, mbps: float) -> None:
    assert get_link(name).bandwidth_mbps == mbps


def test_jmsnas_section_va_devices_present() -> None:
    # (1) Raspberry Pi 4, (2) XPS15 with RTX3050, (3) Jetson AGX Xavier, (4) V100 server.
    devices = set(list_devices())
    for name in ("raspberry-pi-4", "rtx3050-laptop", "jetson-agx-xavier", "v100-server"):
        assert name in devices


# --- topologies -------------------------------------------------------------------------------

def test_jmsnas_chain() -> None:
    topo = get_topology("jmsnas-chain")
    assert topo.chain_order() == ["ue", "sbs", "mbs", "cloud"]
    assert topo.link("ue", "sbs").bandwidth_mbps == 25.0
    assert topo.link("sbs", "mbs").bandwidth_mbps == 50.0
    assert topo.link("mbs", "cloud").bandwidth_mbps == 200.0
    cloud = topo.device("cloud").compute
    assert cloud == get_device("v100-server").compute


def test_jmsnas_mesh_has_root_three_branches_and_aggregator() -> None:
    topo = get_topology("jmsnas-mesh")
    g = topo.graph()
    assert not topo.is_chain
    roots = [n for n in g if g.out_degree(n) == 3]
    aggregators = [n for n in g if g.in_degree(n) == 3]
    assert roots == ["sbs"]
    assert aggregators == ["cloud"]
    branches = sorted(g.successors("sbs"))
    assert branches == ["mbs1", "mbs2", "mbs3"]
    for b in branches:
        assert list(g.successors(b)) == ["cloud"]
        assert topo.link("sbs", b).bandwidth_mbps == 50.0
        assert topo.link(b, "cloud").bandwidth_mbps == 200.0
    assert list(g.predecessors("sbs")) == ["ue"]
    assert topo.link("ue", "sbs").bandwidth_mbps == 25.0


def test_autosplit_edge_cloud() -> None:
    topo = get_topology("autosplit-edge-cloud")
    assert topo.chain_order() == ["edge", "cloud"]
    assert topo.link("edge", "cloud").bandwidth_mbps == 3.0
    assert topo.device("edge").on_chip_memory_bytes == 192 * KB


def test_hmd_star_has_four_sensors_on_a_shared_bus() -> None:
    topo = get_topology("hmd-star")
    g = topo.graph()
    sensors = sorted(n for n in g if g.out_degree(n) == 1 and g.in_degree(n) == 0)
    assert sensors == ["sensor0", "sensor1", "sensor2", "sensor3"]
    assert g.in_degree("aggregator") == 4
    for s in sensors:
        assert topo.link(s, "aggregator").shared
        assert topo.device(s).memory_bytes == 2 * MB


# --- hygiene of every preset -----------------------------------------------------------------

@pytest.mark.parametrize("name", PRESET_DEVICES)
def test_device_presets_are_documented_and_sane(name: str) -> None:
    device = get_device(name)
    assert device.name == name
    assert device.source.strip()
    assert device.description.strip()
    compute = analytical(name)
    assert set(compute.efficiency) <= set(OP_CLASSES)
    assert compute.peak_gops
    # depthwise conv and element-wise ops never beat dense conv
    for cls in ("dwconv", "elementwise"):
        assert compute.efficiency.get(cls, compute.default_efficiency) <= \
            compute.efficiency.get("conv", compute.default_efficiency)


@pytest.mark.parametrize("name", PRESET_LINKS)
def test_link_presets_are_documented(name: str) -> None:
    link = get_link(name)
    assert link.name == name
    assert link.source.strip()
    assert link.description.strip()


@pytest.mark.parametrize("name", PRESET_TOPOLOGIES)
def test_topology_presets_are_documented(name: str) -> None:
    topo = get_topology(name)
    assert topo.name == name
    assert topo.source.strip()
    assert topo.description.strip()
    for device in topo.devices:
        assert device.source.strip()


def test_splitnets_table4_sensor_latency_is_ops_over_peak():
    """SplitNets Table 4: ResNet-152 on the sensor, 11.5 G OPs (MACs) in 92.1 ms."""
    from edgesplit.hardware import RooflineEstimator
    from edgesplit.hardware.work import LayerWork

    sensor = get_device("hmd-sensor")
    work = LayerWork("resnet152", "conv", int(11.5e9), int(23e9), 0, 0, 0, 0, bits=8)
    assert RooflineEstimator().layer_ms(work, sensor) == pytest.approx(92.0, abs=0.1)
