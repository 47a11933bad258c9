"""Pack + unpack throughput of the wire format's dense sub-8-bit packing, as a ratio to a plain
memory copy of the same bytes in the same run, at realistic activation sizes.

AUTO-SPLIT Table 6 reports 10 ms to pack 288 KB (about 29 MB/s). Writes
benchmarks/results/wire.md and wire.json.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from edgesplit.hardware.profile import time_call
from edgesplit.quant import decode_tensor, encode_tensor, pack_bits, unpack_bits

RESULTS = Path(__file__).parent / "results"
SIZES = {"AUTO-SPLIT Table 6 (288 KB of 8-bit values)": 288 * 1024,
         "ResNet-50 layer4 output (2048x7x7)": 100_352,
         "ResNet-50 stage-1 output (256x56x56)": 802_816}


def _best_ms(fn, repeats: int = 15) -> float:
    return time_call(fn, warmup=1, repeats=repeats)["median"]


def main() -> None:
    rows = []
    rng = np.random.default_rng(0)
    for label, count in SIZES.items():
        source = rng.random(count, dtype=np.float32)
        copy_ms = _best_ms(lambda: source.copy())  # a plain copy of the float32 activation
        for bits in (2, 4, 6, 8):
            values = rng.integers(0, 1 << bits, count, dtype=np.uint8)
            packed = pack_bits(values, bits)
            pack_ms = _best_ms(lambda: pack_bits(values, bits))
            unpack_ms = _best_ms(lambda: unpack_bits(packed, bits, count))
            tensor = torch.from_numpy(source)
            message = encode_tensor(tensor, bits)
            encode_ms = _best_ms(lambda: encode_tensor(tensor, bits))
            decode_ms = _best_ms(lambda: decode_tensor(message))
            float_mb = count * 4 / 1e6
            rows.append({
                "activation": label, "elements": count, "bits": bits,
                "pack_ms": pack_ms, "unpack_ms": unpack_ms, "copy_ms": copy_ms,
                "pack_unpack_gb_per_s": float_mb / 1e3 / ((pack_ms + unpack_ms) / 1e3),
                "copy_gb_per_s": float_mb / 1e3 / (copy_ms / 1e3),
                "encode_ms": encode_ms, "decode_ms": decode_ms,
                "vs_copy": (pack_ms + unpack_ms) / copy_ms,
                "speedup_vs_autosplit_packer": (10.0 * count / (288 * 1024)) / pack_ms,
            })
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "wire.json").write_text(json.dumps({"version": 1, "results": rows}, indent=2)
                                       + "\n")
    lines = ["# Wire format: packing throughput", "",
             "Throughput counts the float32 activation the values stand for (4 bytes per value), "
             "as AUTO-SPLIT's packer does; `x copy` is (pack + unpack) time over a plain copy of "
             "that activation in the same run. `vs paper` compares packing time with AUTO-SPLIT "
             "Table 6 (10 ms per 288 K values).", "",
             "| activation | bits | pack ms | unpack ms | pack+unpack GB/s | copy GB/s | x copy | "
             "encode ms | decode ms | vs paper |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['activation']} | {r['bits']} | {r['pack_ms']:.3f} | "
                     f"{r['unpack_ms']:.3f} | {r['pack_unpack_gb_per_s']:.2f} | "
                     f"{r['copy_gb_per_s']:.2f} | {r['vs_copy']:.1f} | {r['encode_ms']:.3f} | "
                     f"{r['decode_ms']:.3f} | {r['speedup_vs_autosplit_packer']:.0f}x |")
    (RESULTS / "wire.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
