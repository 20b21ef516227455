"""amaranth.sim tests of `AxiRegisterSlice`: every channel's beats arrive whole and in order under
random VALID and READY on both sides; no output depends on an input in the same cycle; a beat
per cycle when neither side waits."""
import random

import pytest
from amaranth.sim import Simulator

from tpugen.hdl.axi_slice import _CHANNELS, AxiRegisterSlice

WIDTH = 64
BEATS = 150


def _ports(dut, channel):
    """(source side, sink side, payload field names) of ``channel``."""
    fields, forward = _CHANNELS[channel]
    source, sink = ("s_axi", "m_axi") if forward else ("m_axi", "s_axi")
    return source, sink, fields


def _port(dut, side, channel, name):
    return getattr(dut, f"{side}_{channel}{name}")


def _random_payload(rng, dut, channel):
    source, _, fields = _ports(dut, channel)
    return {f: rng.getrandbits(len(_port(dut, source, channel, f))) for f in fields}


def _signals(dut):
    """(every signal driven into the slice, every signal it drives)."""
    inputs, outputs = [], []
    for channel in _CHANNELS:
        source, sink, fields = _ports(dut, channel)
        inputs += [_port(dut, source, channel, "valid"), _port(dut, sink, channel, "ready"),
                   *(_port(dut, source, channel, f) for f in fields)]
        outputs += [_port(dut, source, channel, "ready"), _port(dut, sink, channel, "valid"),
                    *(_port(dut, sink, channel, f) for f in fields)]
    return inputs, outputs


def _run(seed, valid_rate, ready_rate, check_independence=True):
    """Pass BEATS random beats on every channel; returns the cycles taken."""
    rng = random.Random(seed)
    dut = AxiRegisterSlice(WIDTH)
    sent = {c: [_random_payload(rng, dut, c) for _ in range(BEATS)] for c in _CHANNELS}
    received = {c: [] for c in _CHANNELS}
    cycles = 0

    async def bench(ctx):
        nonlocal cycles
        pending = {c: 0 for c in _CHANNELS}  # next beat to offer
        offering = {c: False for c in _CHANNELS}
        while any(len(received[c]) < BEATS for c in _CHANNELS):
            assert cycles < 20 * BEATS, "the slice stopped passing beats"
            ready = {}
            for channel in _CHANNELS:
                source, sink, fields = _ports(dut, channel)
                # AXI: once VALID is high, it and the payload hold until READY.
                if not offering[channel] and pending[channel] < BEATS:
                    offering[channel] = rng.random() < valid_rate
                ctx.set(_port(dut, source, channel, "valid"), offering[channel])
                beat = sent[channel][min(pending[channel], BEATS - 1)]
                for f in fields:
                    ctx.set(_port(dut, source, channel, f),
                            beat[f] if offering[channel] else rng.getrandbits(
                                len(_port(dut, source, channel, f))))
                ready[channel] = rng.random() < ready_rate
                ctx.set(_port(dut, sink, channel, "ready"), ready[channel])
            if check_independence:
                inputs, outputs = _signals(dut)
                before = [ctx.get(s) for s in outputs]
                saved = [(s, ctx.get(s)) for s in inputs]
                for s in inputs:
                    ctx.set(s, rng.getrandbits(len(s)))
                assert [ctx.get(s) for s in outputs] == before, \
                    "an output follows an input in the same cycle"
                for s, value in saved:
                    ctx.set(s, value)
            for channel in _CHANNELS:
                source, sink, fields = _ports(dut, channel)
                if ctx.get(_port(dut, sink, channel, "valid")) and ready[channel]:
                    received[channel].append(
                        {f: ctx.get(_port(dut, sink, channel, f)) for f in fields})
                if offering[channel] and ctx.get(_port(dut, source, channel, "ready")):
                    pending[channel] += 1
                    offering[channel] = False
            await ctx.tick()
            cycles += 1

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    for channel in _CHANNELS:
        assert len(received[channel]) == BEATS, channel
        assert received[channel] == sent[channel], f"{channel}: beats lost, changed or reordered"
    return cycles


@pytest.mark.parametrize("seed,valid_rate,ready_rate",
                         [(1, 0.5, 0.5), (2, 0.9, 0.3), (3, 0.3, 0.9), (4, 1.0, 0.7)])
def test_beats_pass_whole_and_in_order(seed, valid_rate, ready_rate):
    _run(seed, valid_rate, ready_rate)


def test_a_beat_per_cycle():
    # Every source offers a beat in every cycle and every sink takes it: one beat a cycle, and
    # a cycle of latency.
    assert _run(5, 1.0, 1.0, check_independence=False) == BEATS + 1
