"""Link emulation: the transport's FIFO shaper and the documented tc/netem recipe."""

from __future__ import annotations

import threading
import time

import pytest

from edgesplit.hardware import Link
from edgesplit.transport.shaping import LinkShaper, tc_commands


def test_a_send_takes_its_transfer_time_plus_half_the_rtt():
    link = Link(name="t", bandwidth_mbps=8.0, rtt_ms=20.0)
    shaper = LinkShaper(link)
    waited = shaper.send(10_000)  # 10 kB at 8 Mb/s: 10 ms, + 10 ms half RTT
    assert waited >= 0.019  # at least the link's time; sleeping longer is the machine's doing
    assert shaper.delay_s(10_000) == pytest.approx(0.020)
    assert LinkShaper(link, enabled=False).send(10_000) == 0.0


def test_concurrent_sends_queue_behind_each_other():
    shaper = LinkShaper(Link(name="t", bandwidth_mbps=8.0, rtt_ms=0.0))
    start = time.perf_counter()
    threads = [threading.Thread(target=shaper.send, args=(10_000,)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert time.perf_counter() - start >= 0.039  # four 10 ms sends share one link


def test_tc_recipe_encodes_the_link():
    link = Link(name="4g", bandwidth_mbps=10.0, down_bandwidth_mbps=40.0, rtt_ms=50.0,
                loss=0.01)
    up, _, down = tc_commands(link, "veth0")
    assert up == "tc qdisc replace dev veth0 root netem delay 25ms rate 10mbit loss 1%"
    assert down == "tc qdisc replace dev veth0-peer root netem delay 25ms rate 40mbit"
