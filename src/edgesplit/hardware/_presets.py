"""The built-in catalog: devices, links and topologies of the reference papers, plus common
hardware from vendor spec sheets. Imported lazily by ``catalog._ensure_loaded``; registers on
import.

Units. ``peak_gops``: giga-operations per second with 1 MAC = 2 ops, keyed by native bit-width.
Memory sizes are binary (KB = 1024 B, MB = 2**20 B, GB = 2**30 B); bandwidths are decimal
(GB/s = 1e9 B/s, Mbps = 1e6 bit/s). Numbers quoted from a paper or a spec sheet are marked by
``source``; every number that is derived or assumed says so in a comment next to it.
"""

from __future__ import annotations

from edgesplit.hardware.catalog import register_device, register_link, register_topology
from edgesplit.hardware.device import AnalyticalCompute, Device
from edgesplit.hardware.link import Link
from edgesplit.hardware.topology import Topology, chain, mesh, star

__all__: list[str] = []


def _kib(n: float) -> int:
    return int(n * 1024)


def _mib(n: float) -> int:
    return int(n * 2**20)


def _gib(n: float) -> int:
    return int(n * 2**30)


# Fraction of peak reached per op class. Estimates, not measurements: dense convolutions and
# matmuls come close to peak, depthwise convolutions (low arithmetic intensity, poor fit for
# tensor cores / systolic arrays) and element-wise, norm and pooling ops reach a small fraction
# (they are memory bound anyway, which the roofline's bandwidth term captures).
_GPU_EFFICIENCY = {"conv": 0.5, "dwconv": 0.05, "matmul": 0.6, "attention": 0.4, "pool": 0.05,
                   "norm": 0.05, "elementwise": 0.03, "embedding": 0.05, "other": 0.2}
_CPU_EFFICIENCY = {"conv": 0.35, "dwconv": 0.15, "matmul": 0.45, "attention": 0.3, "pool": 0.1,
                   "norm": 0.1, "elementwise": 0.1, "embedding": 0.1, "other": 0.2}
# Systolic arrays / NPUs: near peak on dense conv and matmul, very poor on depthwise conv (one
# input channel per filter leaves most of the array idle) and on vector ops.
_ACCEL_EFFICIENCY = {"conv": 0.7, "dwconv": 0.08, "matmul": 0.75, "attention": 0.5, "pool": 0.1,
                     "norm": 0.1, "elementwise": 0.05, "embedding": 0.05, "other": 0.3}


def _device(**fields: object) -> Device:
    device = Device(**fields)
    register_device(device)
    return device


def _link(**fields: object) -> Link:
    link = Link(**fields)
    register_link(link)
    return link


# --------------------------------------------------------------------------------------------
# Devices: AUTO-SPLIT (paper 001) Table 1, simulated with SCALE-SIM.
# Both have fixed INT8 MAC units: sub-8-bit layers gain nothing in MACs (section 5.1), so the
# peak is keyed at 8 bits only. Cycle-accurate simulation has no dispatch cost: overhead 0.
# --------------------------------------------------------------------------------------------
EYERISS = _device(
    name="eyeriss",
    kind="accelerator",
    compute=AnalyticalCompute(
        # Table 1 quotes "34 GOPs": Eyeriss is 168 PEs x 200 MHz = 33.6 G MAC/s, so the paper's
        # OP is a MAC; edgesplit counts 2 ops per MAC, hence 2 x 34.
        peak_gops={8: 68.0},
        memory_bandwidth_gb_per_s=1.0,  # "1 GB/sec"
        efficiency=_ACCEL_EFFICIENCY,
        layer_overhead_ms=0.0,
    ),
    memory_bytes=_gib(4),  # off-chip 4 GB
    on_chip_memory_bytes=_kib(192),  # on-chip 192 KB
    supported_bits=(2, 4, 6, 8, 16),  # AUTO-SPLIT's bit-width set
    description="Eyeriss edge accelerator (INT8 MACs), AUTO-SPLIT's edge device",
    source="AUTO-SPLIT (paper 001) Table 1 (SCALE-SIM Eyeriss configuration), section 5.1",
)

TPU = _device(
    name="tpu",
    kind="accelerator",
    compute=AnalyticalCompute(
        peak_gops={8: 96_000.0},  # "96 TOPs"
        memory_bandwidth_gb_per_s=13.0,  # "13 GB/sec"
        efficiency=_ACCEL_EFFICIENCY,
        layer_overhead_ms=0.0,
    ),
    memory_bytes=_gib(16),  # off-chip 16 GB
    on_chip_memory_bytes=_mib(28),  # on-chip 28 MB
    supported_bits=(8, 16),
    description="Tensor Processing Unit (INT8 systolic array), AUTO-SPLIT's cloud device",
    source="AUTO-SPLIT (paper 001) Table 1 (SCALE-SIM TPU configuration), section 5.1",
)

# --------------------------------------------------------------------------------------------
# Devices: SplitNets (paper 004) HMD hardware model, section 3.2 / Fig. 6 and appendix G.
# SplitNets models latency as OP / Comp (peak throughput, no per-op efficiency, no dispatch
# cost), so efficiency is 1 and overhead 0 here. Note: the #OPs column of SplitNets Table 4 is
# the MAC count (ResNet-152: 11.5G, 92.1 ms at 125 GOP/s), i.e. the paper's "GOP/s" is
# G MAC/s; the peaks below are the quoted figures doubled (edgesplit counts 2 ops per MAC).
# --------------------------------------------------------------------------------------------
HMD_SENSOR = _device(
    name="hmd-sensor",
    kind="npu",
    compute=AnalyticalCompute(
        # Comp_sen = 125 GOP/s where an OP is a MAC (see above): 2 x 125 in edgesplit's units.
        peak_gops={8: 250.0},
        # ASSUMPTION: not given in the paper (the sensor works from on-chip memory); a 16-bit
        # LPDDR4X-4266 channel, 8.5 GB/s.
        memory_bandwidth_gb_per_s=8.5,
        default_efficiency=1.0,
        layer_overhead_ms=0.0,
    ),
    memory_bytes=_mib(2),  # Mem_sen = 2 MB peak memory (weights + activations)
    on_chip_memory_bytes=_mib(2),  # the 2 MB is on-chip memory (Fig. 6)
    supported_bits=(8,),
    description="HMD smart-sensor NPU (16 nm), 2 MB on-chip memory",
    source="SplitNets (paper 004) section 3.2, Fig. 6, appendix G (Comp_sen, Mem_sen)",
)

HMD_AGGREGATOR = _device(
    name="hmd-aggregator",
    kind="npu",
    compute=AnalyticalCompute(
        peak_gops={8: 2500.0},  # Comp_agg = 1.25 TOP/s, an OP being a MAC: 2 x 1250
        # ASSUMPTION: not given in the paper; a 64-bit LPDDR5-6400 interface, 51.2 GB/s.
        memory_bandwidth_gb_per_s=51.2,
        default_efficiency=1.0,
        layer_overhead_ms=0.0,
    ),
    memory_bytes=None,  # "sufficient on-chip memory": unbounded
    supported_bits=(8,),
    description="HMD aggregator NPU (7 nm) with sufficient memory",
    source="SplitNets (paper 004) section 3.2, Fig. 6 (Comp_agg = 1.25 TOP/s)",
)

# --------------------------------------------------------------------------------------------
# Devices: JMSNAS (paper 000) section V-A machines and common edge / cloud hardware.
# Peaks from vendor spec sheets where published; others derived as cores x clock x ops/cycle.
# on_chip_memory_bytes is the last-level (L2) cache.
# --------------------------------------------------------------------------------------------
RASPBERRY_PI_4 = _device(
    name="raspberry-pi-4",
    kind="cpu",
    compute=AnalyticalCompute(
        # DERIVED: 4 cores x 1.5 GHz x 8 FP32 FLOP/cycle (one 128-bit NEON FMA per cycle)
        # = 48 GFLOP/s. ARMv8.0 has no FP16 arithmetic nor SDOT; INT8 via widening NEON MACs
        # estimated at 2x FP32. (HPL measures ~8-13 GFLOP/s, hence the low efficiencies.)
        peak_gops={8: 96.0, 32: 48.0},
        memory_bandwidth_gb_per_s=12.8,  # LPDDR4-3200, 32-bit bus (theoretical)
        efficiency=_CPU_EFFICIENCY,
        layer_overhead_ms=0.005,
    ),
    memory_bytes=_gib(4),  # ASSUMPTION: the 4 GB model (1/2/4/8 GB exist; JMSNAS does not say)
    on_chip_memory_bytes=_mib(1),  # 1 MB shared L2
    supported_bits=(8, 16, 32),
    description="Raspberry Pi 4 Model B, 4x Cortex-A72 @ 1.5 GHz (JMSNAS UE)",
    source="Raspberry Pi 4 Model B product brief (BCM2711, LPDDR4-3200); JMSNAS (paper 000) "
           "section V-A device (1)",
)

JETSON_NANO = _device(
    name="jetson-nano",
    kind="gpu",
    compute=AnalyticalCompute(
        # 472 GFLOPS FP16 (spec sheet); FP32 is half (128 Maxwell cores x 921.6 MHz x 2).
        # Maxwell has no INT8 dot-product instructions.
        peak_gops={16: 472.0, 32: 236.0},
        memory_bandwidth_gb_per_s=25.6,  # 4 GB 64-bit LPDDR4
        efficiency=_GPU_EFFICIENCY,
        layer_overhead_ms=0.02,
    ),
    memory_bytes=_gib(4),
    on_chip_memory_bytes=_kib(256),  # GPU L2
    supported_bits=(16, 32),
    description="NVIDIA Jetson Nano (128-core Maxwell GPU, 4 GB)",
    source="NVIDIA Jetson Nano module data sheet (472 GFLOPS FP16, 25.6 GB/s)",
)

JETSON_TX2 = _device(
    name="jetson-tx2",
    kind="gpu",
    compute=AnalyticalCompute(
        # 1.33 TFLOPS FP16 (spec sheet); FP32 is half (256 Pascal cores x 1.3 GHz x 2).
        peak_gops={16: 1330.0, 32: 665.0},
        memory_bandwidth_gb_per_s=59.7,  # 8 GB 128-bit LPDDR4
        efficiency=_GPU_EFFICIENCY,
        layer_overhead_ms=0.02,
    ),
    memory_bytes=_gib(8),
    on_chip_memory_bytes=_kib(512),  # GPU L2
    supported_bits=(16, 32),
    description="NVIDIA Jetson TX2 (256-core Pascal GPU, 8 GB)",
    source="NVIDIA Jetson TX2 module data sheet (1.33 TFLOPS FP16, 59.7 GB/s); L2S (paper "
           "002) section V-A end device",
)

JETSON_AGX_XAVIER = _device(
    name="jetson-agx-xavier",
    kind="gpu",
    compute=AnalyticalCompute(
        # GPU only (the two DLAs add ~10 TOPS INT8, not modelled): 22 TOPS INT8 and 11 TFLOPS
        # FP16 on the 64 tensor cores (spec sheet); FP32 DERIVED: 512 cores x 1.377 GHz x 2.
        peak_gops={8: 22_000.0, 16: 11_000.0, 32: 1_410.0},
        memory_bandwidth_gb_per_s=136.5,  # 32 GB 256-bit LPDDR4x
        efficiency=_GPU_EFFICIENCY,
        layer_overhead_ms=0.015,
    ),
    memory_bytes=_gib(32),
    on_chip_memory_bytes=_kib(512),  # GPU L2 (plus a 4 MB system cache, not counted)
    supported_bits=(8, 16, 32),
    description="NVIDIA Jetson AGX Xavier, 512-core Volta GPU with 64 tensor cores "
                "(JMSNAS MBS with MEC server)",
    source="NVIDIA Jetson AGX Xavier data sheet (GPU 11 TFLOPS FP16 / 22 TOPS INT8, "
           "136.5 GB/s); JMSNAS (paper 000) section V-A device (3)",
)

RTX3050_LAPTOP = _device(
    name="rtx3050-laptop",
    kind="gpu",
    compute=AnalyticalCompute(
        # DERIVED: 2048 CUDA cores; the boost clock depends on the laptop's TGP (1057-1740 MHz),
        # ASSUMED ~1.5 GHz for an XPS 15: FP32 = 2048 x 2 x 1.5 GHz = 6.1 TFLOPS; 3rd-gen tensor
        # cores (GeForce rates, dense): FP16 with FP32 accumulate 2x FP32, INT8 8x FP32.
        peak_gops={8: 49_000.0, 16: 12_300.0, 32: 6_100.0},
        memory_bandwidth_gb_per_s=192.0,  # 4 GB GDDR6, 128-bit @ 12 Gbps
        efficiency=_GPU_EFFICIENCY,
        layer_overhead_ms=0.015,
    ),
    memory_bytes=_gib(4),
    on_chip_memory_bytes=_mib(2),  # GA107 L2
    supported_bits=(8, 16, 32),
    description="NVIDIA GeForce RTX 3050 Laptop GPU in an XPS 15 with i7-11800H (JMSNAS SBS; "
                "the GPU is modelled)",
    source="NVIDIA GeForce RTX 3050 Laptop GPU spec page (2048 CUDA cores, 1057-1740 MHz boost, "
           "4 GB GDDR6 128-bit); NVIDIA Ampere GA10x whitepaper (tensor rates); JMSNAS (paper "
           "000) section V-A device (2)",
)

GTX1080TI_SERVER = _device(
    name="gtx1080ti-server",
    kind="gpu",
    compute=AnalyticalCompute(
        # 11.3 TFLOPS FP32 (spec sheet). FP16 runs at 1/64 rate on GP102, so 16-bit layers use
        # the FP32 peak; INT8 via DP4A DERIVED as 4x FP32.
        peak_gops={8: 45_200.0, 32: 11_300.0},
        memory_bandwidth_gb_per_s=484.0,  # 11 GB GDDR5X, 352-bit @ 11 Gbps
        efficiency=_GPU_EFFICIENCY,
        layer_overhead_ms=0.01,
    ),
    memory_bytes=_gib(11),
    on_chip_memory_bytes=_kib(2816),  # GP102 L2 (2.75 MB)
    supported_bits=(8, 16, 32),
    description="Server with an NVIDIA GeForce GTX 1080 Ti (Pascal, 3584 cores)",
    source="NVIDIA GeForce GTX 1080 Ti spec page (11.3 TFLOPS FP32, 11 GB GDDR5X, 484 GB/s); "
           "L2S (paper 002) section V-A edge server",
)

V100_SERVER = _device(
    name="v100-server",
    kind="gpu",
    compute=AnalyticalCompute(
        # Tesla V100 PCIe: 14 TFLOPS FP32, 112 TFLOPS FP16 tensor (spec sheet). INT8 on V100 is
        # DP4A at ~4x FP32 (~56 TOPS), slower than the FP16 tensor cores, so no 8-bit key:
        # 8-bit layers are modelled as running on the tensor cores at the FP16 peak.
        peak_gops={16: 112_000.0, 32: 14_000.0},
        memory_bandwidth_gb_per_s=900.0,  # HBM2
        efficiency=_GPU_EFFICIENCY,
        layer_overhead_ms=0.01,
    ),
    memory_bytes=_gib(16),  # ASSUMPTION: 16 GB board (32 GB exists; JMSNAS does not say)
    on_chip_memory_bytes=_mib(6),  # GV100 L2
    supported_bits=(8, 16, 32),
    description="Cloud server: 2x Intel Xeon Platinum 8280 + NVIDIA Tesla V100 (the GPU is "
                "modelled; JMSNAS cloud)",
    source="NVIDIA Tesla V100 PCIe data sheet (14 TFLOPS FP32, 112 TFLOPS tensor, 900 GB/s); "
           "JMSNAS (paper 000) section V-A device (4)",
)

PHONE_2022 = _device(
    name="phone-2022",
    kind="npu",
    compute=AnalyticalCompute(
        # ESTIMATE: Qualcomm publishes no TOPS figure for the Snapdragon 8 Gen 1 Hexagon NPU
        # (only "up to 4x the AI performance of the 888"); we use the 26 TOPS quoted for the
        # Snapdragon 888's whole AI Engine as a conservative INT8 figure, FP16 at half rate.
        peak_gops={8: 26_000.0, 16: 13_000.0},
        memory_bandwidth_gb_per_s=51.2,  # LPDDR5-6400 (3200 MHz), 4 x 16-bit channels
        efficiency=_ACCEL_EFFICIENCY,
        layer_overhead_ms=0.02,  # NNAPI / QNN per-op dispatch, ESTIMATE
    ),
    memory_bytes=_gib(8),  # ASSUMPTION: an 8 GB phone (e.g. Galaxy S22); up to 16 GB supported
    supported_bits=(8, 16),
    description="2022 flagship phone NPU: Qualcomm Snapdragon 8 Gen 1 Hexagon (7th-gen AI "
                "Engine)",
    source="Qualcomm Snapdragon 8 Gen 1 product brief (LPDDR5 3200 MHz, up to 16 GB); "
           "Snapdragon 888 product brief (26 TOPS AI Engine)",
)

# --------------------------------------------------------------------------------------------
# Links: typical figures (not from one measurement: order-of-magnitude values for planning).
# --------------------------------------------------------------------------------------------
_link(name="ble", bandwidth_mbps=1.4, rtt_ms=15.0, medium="wireless",
      # 2 Mbps LE 2M PHY gives ~1.4 Mbps of application (GATT) throughput; RTT ~ two 7.5 ms
      # connection intervals. Typical values.
      description="Bluetooth Low Energy, 2M PHY (application throughput)",
      source="Bluetooth Core Specification 5.0 (LE 2M PHY); typical application throughput")
_link(name="3g", bandwidth_mbps=1.1, down_bandwidth_mbps=2.0, rtt_ms=150.0, medium="wireless",
      description="3G (HSPA) cellular, typical values",
      source="typical values; uplink as measured in Neurosurgeon (Kang et al., ASPLOS 2017)")
_link(name="4g", bandwidth_mbps=10.0, down_bandwidth_mbps=30.0, rtt_ms=50.0, medium="wireless",
      description="4G LTE cellular, typical values",
      source="typical values (Ookla Speedtest Global Index mobile medians); uplink of "
             "the order measured in Neurosurgeon (Kang et al., ASPLOS 2017)")
_link(name="5g", bandwidth_mbps=30.0, down_bandwidth_mbps=200.0, rtt_ms=20.0, medium="wireless",
      description="5G sub-6 GHz cellular, typical values",
      source="typical values (Ookla 5G reports 2022 medians; ITU-R M.2410 targets are higher)")
WIFI = _link(name="wifi", bandwidth_mbps=50.0, down_bandwidth_mbps=100.0, rtt_ms=5.0,
      medium="wireless",
      description="Wi-Fi 5 (802.11ac) home/office link, typical values",
      source="typical values (Ookla Speedtest Global Index fixed-broadband medians)")

# Links of the papers. The papers give capacities only and model transfer as size / capacity,
# so the RTT is 0 and the downlink equals the uplink unless stated.
JMSNAS_UE_SBS = _link(
    name="jmsnas-ue-sbs", bandwidth_mbps=25.0, medium="wireless",
    description="JMSNAS UE -> small base station", source="JMSNAS (paper 000) Table I")
JMSNAS_SBS_MBS = _link(
    name="jmsnas-sbs-mbs", bandwidth_mbps=50.0, medium="wireless",
    description="JMSNAS small -> macro base station", source="JMSNAS (paper 000) Table I")
JMSNAS_MBS_CLOUD = _link(
    name="jmsnas-mbs-cloud", bandwidth_mbps=200.0, medium="wired",
    description="JMSNAS macro base station -> cloud", source="JMSNAS (paper 000) Table I")

AUTOSPLIT_3MBPS = _link(
    name="autosplit-3mbps", bandwidth_mbps=3.0, medium="wireless",
    description="AUTO-SPLIT edge -> cloud uplink", source="AUTO-SPLIT (paper 001) Table 1")

_DADS = "DADS (Hu et al., Dynamic Adaptive DNN Surgery, INFOCOM 2019) evaluation, uplink rate"
_link(name="dads-cat1", bandwidth_mbps=0.13, medium="wireless",
      description="LTE Cat-1 (IoT) uplink", source=_DADS)
_link(name="dads-3g", bandwidth_mbps=1.1, medium="wireless", description="3G uplink",
      source=_DADS)
_link(name="dads-4g", bandwidth_mbps=5.85, medium="wireless", description="4G uplink",
      source=_DADS)
_link(name="dads-wifi", bandwidth_mbps=18.88, medium="wireless", description="Wi-Fi uplink",
      source=_DADS)

_link(name="l2s-wifi-60", bandwidth_mbps=60.0, medium="wireless",
      description="L2S low-speed Wi-Fi (split training, both directions)",
      source="L2S (paper 002) section V-A testbed (point-to-point Wi-Fi limited with "
             "NetLimiter) and V-B (Figs. 10, 13: low speed network 60 Mbps)")
_link(name="l2s-wifi-100", bandwidth_mbps=100.0, medium="wireless",
      description="L2S high-speed Wi-Fi (split training, both directions)",
      source="L2S (paper 002) Fig. 1, section V-A testbed and V-B (Figs. 10, 13: high "
             "speed network 100 Mbps)")

HMD_BUS = _link(
    name="hmd-bus", bandwidth_mbps=1200.0, medium="bus", shared=True,
    description="HMD sensor -> aggregator bus, shared by all sensors (4 sensors: 37.5 MB/s "
                "each, as in SplitNets Table 4)",
    source="SplitNets (paper 004) section 3.2, Fig. 6 (BW_comm = 1.2 Gb/s, shared)")


# --------------------------------------------------------------------------------------------
# Topologies
# --------------------------------------------------------------------------------------------
def _named(device: Device, name: str) -> Device:
    return device.model_copy(update={"name": name})


def _jmsnas_chain() -> Topology:
    return chain(
        "jmsnas-chain",
        [_named(RASPBERRY_PI_4, "ue"), _named(RTX3050_LAPTOP, "sbs"),
         _named(JETSON_AGX_XAVIER, "mbs"), _named(V100_SERVER, "cloud")],
        [JMSNAS_UE_SBS, JMSNAS_SBS_MBS, JMSNAS_MBS_CLOUD],
        description="JMSNAS chain network: UE -> SBS -> MBS -> cloud",
        source="JMSNAS (paper 000) Fig. 2(a) and eq. 1 (chain network), section V-A devices, "
               "Table I links",
    )


def _jmsnas_mesh() -> Topology:
    return mesh(
        "jmsnas-mesh",
        prefix=[_named(RASPBERRY_PI_4, "ue")],
        prefix_links=[JMSNAS_UE_SBS],
        root=_named(RTX3050_LAPTOP, "sbs"),
        branches=[_named(JETSON_AGX_XAVIER, f"mbs{i}") for i in (1, 2, 3)],
        branch_link=JMSNAS_SBS_MBS,
        aggregator=_named(V100_SERVER, "cloud"),
        join_link=JMSNAS_MBS_CLOUD,
        description="JMSNAS mesh network: UE -> SBS broadcasting to three MBSs -> cloud "
                    "aggregating (latency eq. 2)",
        source="JMSNAS (paper 000) Fig. 2(b) and eq. 2 (mesh network), section V-A devices, "
               "Table I links",
    )


def _autosplit_edge_cloud() -> Topology:
    return chain(
        "autosplit-edge-cloud",
        [_named(EYERISS, "edge"), _named(TPU, "cloud")],
        [AUTOSPLIT_3MBPS],
        description="AUTO-SPLIT: Eyeriss edge -> TPU cloud over a 3 Mbps uplink",
        source="AUTO-SPLIT (paper 001) Table 1",
    )


def _hmd_star() -> Topology:
    return star(
        "hmd-star",
        [_named(HMD_SENSOR, f"sensor{i}") for i in range(4)],
        _named(HMD_AGGREGATOR, "aggregator"),
        HMD_BUS,
        description="SplitNets head-mounted system: 4 smart sensors -> aggregator on a shared "
                    "1.2 Gb/s bus",
        source="SplitNets (paper 004) section 3.2, Fig. 6, Table 4 (37.5 MB/s per sensor = "
               "1.2 Gb/s / 4)",
    )


def _home_wifi() -> Topology:
    return chain(
        "home-wifi",
        [_named(PHONE_2022, "phone"), _named(RTX3050_LAPTOP, "laptop"),
         _named(JETSON_TX2, "jetson")],
        [WIFI, WIFI],
        description="A home LLM cluster: phone -> laptop GPU -> Jetson TX2 over Wi-Fi (20 GiB "
                    "in all, no device holding an 8B model in float16 alone; the setting of "
                    "exo issues #489 and #957)",
        source="device presets' data sheets; Wi-Fi typical values",
    )


register_topology("jmsnas-chain", _jmsnas_chain)
register_topology("jmsnas-mesh", _jmsnas_mesh)
register_topology("autosplit-edge-cloud", _autosplit_edge_cloud)
register_topology("hmd-star", _hmd_star)
register_topology("home-wifi", _home_wifi)
