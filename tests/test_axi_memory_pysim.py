"""amaranth.sim tests of the on-chip board memory: random AXI4 bursts and host accesses against a
Python model, bit-exact; DECERR/SLVERR; throughput; parameters; yosys mapping to DP16KD / SPRAM."""
import random
from collections import Counter, deque
from dataclasses import dataclass, field

import pytest
from amaranth.sim import Simulator

from tpugen.fpga.synth import synth_component_cells
from tpugen.hdl.axi import AXI_BURST_INCR, AXI_RESP_DECERR, AXI_RESP_OKAY, AXI_RESP_SLVERR
from tpugen.hdl.axi_memory import AxiMemory
from tpugen.sim.testbench import run_testbench

OKAY, SLVERR, DECERR = AXI_RESP_OKAY, AXI_RESP_SLVERR, AXI_RESP_DECERR
FIXED, WRAP = 0b00, 0b10
MAX_CYCLES = 30_000


@dataclass
class Burst:
    """One AXI4 transaction; ``data``/``strobes`` per beat for writes."""
    write: bool
    addr: int
    len: int
    size: int
    burst: int = AXI_BURST_INCR
    id: int = 0
    data: list = field(default_factory=list)
    strobes: list = field(default_factory=list)

    def plan(self, beat_bytes, size_bytes):
        """(memory word or None, response) per beat, as AXI4 INCR addressing says."""
        step = 1 << self.size
        addresses = [self.addr] + [(self.addr & -step) + n * step for n in range(1, self.len + 1)]
        unsupported = self.burst != AXI_BURST_INCR or step > beat_bytes
        return [(None, SLVERR) if unsupported else (None, DECERR) if a >= size_bytes
                else (a // beat_bytes, OKAY) for a in addresses]


class Model:
    """Memory words as Python ints, plus the words that in-flight AXI bursts and host accesses
    touch: a burst starts only when nothing in flight makes its result depend on timing."""

    def __init__(self, dut):
        self.beat_bytes, self.size_bytes = dut.data_width // 8, dut.size_bytes
        self.words = [0] * (dut.size_bytes // self.beat_bytes)
        self.reading, self.writing, self.host_busy = Counter(), Counter(), set()

    def plan(self, burst):
        return burst.plan(self.beat_bytes, self.size_bytes)

    def touched(self, burst):
        return {word for word, _ in self.plan(burst) if word is not None}

    def free(self, words, *busy):
        return not any(word in b for b in busy for word in words)

    def write(self, word, data, strobes):
        if word is None:
            return
        for lane in range(self.beat_bytes):
            if strobes >> lane & 1:
                mask = 0xFF << 8 * lane
                self.words[word] = self.words[word] & ~mask | data & mask


def random_burst(rng, dut):
    beat_bytes = dut.data_width // 8
    full_size = beat_bytes.bit_length() - 1
    size = full_size if rng.random() < 0.8 else rng.randrange(full_size + 2)  # narrow, too wide
    length = 255 if rng.random() < 0.01 else rng.choice([0, 0, 1, 3, 7, 15, rng.randrange(32)])
    where = rng.random()
    if where < 0.8:
        addr = rng.randrange(dut.size_bytes)
    elif where < 0.9:
        addr = dut.size_bytes - rng.randrange(1, 4 * beat_bytes)   # straddles the end
    else:
        addr = rng.choice([dut.size_bytes, 2 * dut.size_bytes, (1 << 32) - rng.randrange(1, 64)])
    if rng.random() < 0.7:
        addr &= -(1 << size)
    burst = rng.choices([AXI_BURST_INCR, FIXED, WRAP], [0.9, 0.05, 0.05])[0]
    write = rng.random() < 0.5
    beats = length + 1
    return Burst(write, addr, length, size, burst, rng.randrange(16),
                 [rng.getrandbits(dut.data_width) for _ in range(beats)] if write else [],
                 [rng.getrandbits(beat_bytes) for _ in range(beats)] if write else [])


async def handshake(ctx, ready):
    """Waits for the clock edge at which ``ready`` is high."""
    while not (await ctx.tick().sample(ready))[2]:
        pass


def run(dut, bursts, *, seed=0, valid=0.8, ready=0.7, host=0.1, readback=True):
    """Runs ``bursts`` through a master with random VALID/READY pauses (``valid``/``ready``:
    probability per cycle) while a host takes the port with probability ``host`` per cycle;
    checks every R beat and B response, then (``readback``) every word through the host port.
    Returns {"cycles": ..., plus "first"/"last" cycles of R beats and B responses}."""
    rng = random.Random(seed)
    model = Model(dut)
    axi = lambda name: getattr(dut, f"s_axi_{name}")
    lanes = dut.data_width // 32
    reads = deque(b for b in bursts if not b.write)
    writes = deque(b for b in bursts if b.write)
    expected_r, expected_b, w_queue = deque(), deque(), deque()
    state = {"done": 0, "cycle": 0, "traffic": True, "r": [], "b": []}

    async def address_channel(ctx, channel, queue, mine, theirs):
        while queue:
            burst = queue.popleft()
            words = model.touched(burst)
            while not model.free(words, theirs, model.host_busy) or rng.random() > valid:
                await ctx.tick()
            mine.update(words)
            plan = model.plan(burst)
            if burst.write:
                w_queue.append((burst, plan))
                expected_b.append((burst.id, max(resp for _, resp in plan), words))
            else:
                expected_r.extend((burst.id, 0 if word is None else model.words[word], resp,
                                   n == burst.len, words) for n, (word, resp) in enumerate(plan))
            for name, value in (("id", burst.id), ("addr", burst.addr), ("len", burst.len),
                                ("size", burst.size), ("burst", burst.burst), ("valid", 1)):
                ctx.set(axi(channel + name), value)
            await handshake(ctx, axi(channel + "ready"))
            ctx.set(axi(channel + "valid"), 0)

    async def ar(ctx):
        await address_channel(ctx, "ar", reads, model.reading, model.writing)

    async def aw(ctx):
        await address_channel(ctx, "aw", writes, model.writing, model.reading)

    async def w(ctx):
        while True:
            if not w_queue:
                await ctx.tick()
                continue
            burst, plan = w_queue.popleft()
            for n, (word, _) in enumerate(plan):
                while rng.random() > valid:
                    await ctx.tick()
                ctx.set(axi("wdata"), burst.data[n])
                ctx.set(axi("wstrb"), burst.strobes[n])
                ctx.set(axi("wlast"), n == burst.len)
                ctx.set(axi("wvalid"), 1)
                await handshake(ctx, axi("wready"))
                ctx.set(axi("wvalid"), 0)
                model.write(word, burst.data[n], burst.strobes[n])

    async def r(ctx):
        while True:
            rready = rng.random() < ready
            ctx.set(axi("rready"), rready)
            _, _, rvalid, *beat = await ctx.tick().sample(
                axi("rvalid"), axi("rid"), axi("rdata"), axi("rresp"), axi("rlast"))
            if rvalid and rready:
                assert expected_r, f"R beat {beat} without a read burst"
                rid, rdata, rresp, rlast, words = expected_r.popleft()
                assert beat == [rid, rdata, rresp, rlast], \
                    f"R beat (id, data, resp, last) {beat}, expected {[rid, rdata, rresp, rlast]}"
                state["r"].append(state["cycle"])
                if rlast:
                    model.reading -= Counter(words)
                    state["done"] += 1

    async def b(ctx):
        while True:
            bready = rng.random() < ready
            ctx.set(axi("bready"), bready)
            _, _, bvalid, bid, bresp = await ctx.tick().sample(
                axi("bvalid"), axi("bid"), axi("bresp"))
            if bvalid and bready:
                assert expected_b, f"B response {bid, bresp} without a write burst"
                want_id, want_resp, words = expected_b.popleft()
                assert (bid, bresp) == (want_id, want_resp)
                state["b"].append(state["cycle"])
                model.writing -= Counter(words)
                state["done"] += 1

    def host_read_expected(address):
        if address >= dut.size_bytes // 4:
            return 0
        return model.words[address // lanes] >> 32 * (address % lanes) & 0xFFFF_FFFF

    async def host_port(ctx):
        due = deque([None] * dut.host_read_latency)  # what rdata must be, cycle by cycle
        while state["traffic"]:
            op = rng.choice(["read", "write", "none"]) if rng.random() < host else None
            address = rng.randrange(dut.size_bytes // 4 + 8)
            if op and not model.free({address // lanes}, model.reading, model.writing):
                op = None
            data = rng.getrandbits(32)
            ctx.set(dut.host.select, op is not None)
            ctx.set(dut.host.read, op == "read")
            ctx.set(dut.host.write, op == "write")
            ctx.set(dut.host.addr, address)
            ctx.set(dut.host.wdata, data)
            model.host_busy = {address // lanes} if op else set()
            due.append(host_read_expected(address) if op == "read" else None)
            if op == "write" and address < dut.size_bytes // 4:
                lane = address % lanes
                model.write(address // lanes, data << 32 * lane, 0b1111 << 4 * lane)
            _, _, rdata = await ctx.tick().sample(dut.host.rdata)
            check = due.popleft()
            assert check is None or rdata == check, f"host read {rdata:#x}, expected {check:#x}"
        ctx.set(dut.host.select, 0)
        model.host_busy = set()

    async def main(ctx):
        while state["done"] < len(bursts):
            assert state["cycle"] < MAX_CYCLES, f"{state['done']} of {len(bursts)} bursts done"
            await ctx.tick()
            state["cycle"] += 1
        state["traffic"] = False
        await ctx.tick().repeat(2)
        assert not ctx.get(axi("rvalid")) and not ctx.get(axi("bvalid"))
        if readback:
            ctx.set(dut.host.select, 1)
            ctx.set(dut.host.read, 1)
            for address in range(dut.size_bytes // 4 + 1):
                ctx.set(dut.host.addr, address)
                await ctx.tick().repeat(dut.host_read_latency)
                assert ctx.get(dut.host.rdata) == host_read_expected(address), f"word {address}"

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    for process in (ar, aw, w, r, b, host_port):
        sim.add_testbench(process, background=True)
    sim.add_testbench(main)
    sim.run()
    return {"cycles": state["cycle"], "r": state["r"], "b": state["b"]}


@pytest.mark.parametrize("data_width, size_bytes, kind, dual_port, seed", [
    (32, 1024, "spram", False, 1), (64, 2048, "bram", False, 2), (128, 4096, "bram", False, 3),
    (64, 2048, "bram", True, 6)])
def test_random_bursts_and_host_against_model(data_width, size_bytes, kind, dual_port, seed):
    dut = AxiMemory(data_width, size_bytes, kind=kind, dual_port=dual_port)
    rng = random.Random(seed)
    bursts = [random_burst(rng, dut) for _ in range(80)]
    run(dut, bursts, seed=seed)


def test_full_rate_bursts_with_host_away():
    dut = AxiMemory(64, 2048)
    rng = random.Random(4)
    bursts = [random_burst(rng, dut) for _ in range(40)]
    run(dut, bursts, seed=4, valid=1, ready=1, host=0)


@pytest.mark.parametrize("dual_port", [False, True])
def test_host_hogging_the_port_loses_no_beat(dual_port):
    dut = AxiMemory(64, 2048, dual_port=dual_port)
    rng = random.Random(5)
    bursts = [random_burst(rng, dut) for _ in range(30)]
    run(dut, bursts, seed=5, valid=1, ready=1, host=0.8)


@pytest.mark.parametrize("size", [3, 1])   # full-width and narrow beats on a 64-bit bus
def test_out_of_range_answers_decerr_and_never_wraps(size):
    """Bursts crossing the end, running far past it (the kept address bits carry out) or starting
    with an address bit at or above ``size_bytes`` set (up to past 4 GiB): DECERR beyond the end,
    no write lands and no read wraps around into memory; each taken directly (nothing running)
    and through the waiting slot (presented while an in-range burst runs)."""
    dut = AxiMemory(64, 1024)
    rng = random.Random(7)
    end, top, step = dut.size_bytes, 1 << 32, 1 << size
    probes = [(end - step - 1, 3),       # unaligned: 2 beats in, 2 out
              (end - step, 255),         # 1 in, then the kept bits wrap around to 0: 255 out
              (end | 4, 3), (1 << 31 | 8, 1),
              (top - 256, 255)]          # past 4 GiB
    ones = (1 << 64) - 1

    def probe(write, addr, length, burst_id):
        beats = length + 1
        return Burst(write, addr, length, size, id=burst_id, data=[ones] * beats if write else [],
                     strobes=[0xFF] * beats if write else [])

    resps = [[resp for _, resp in probe(False, a, n, 0).plan(8, end)] for a, n in probes]
    assert [(r.count(OKAY), r.count(DECERR)) for r in resps] == [(2, 2), (1, 255), (0, 4),
                                                                  (0, 2), (0, 256)]
    for n, (addr, length) in enumerate(probes):   # directly: first in its direction
        run(dut, [probe(True, addr, length, n), probe(False, addr, length, n)],
            valid=1, ready=1, host=0)

    def filler(write, n):   # in range, 8 beats: the next request waits in the slot meanwhile
        return Burst(write, 64 * n + (256 if write else 0), 7, 3, id=n,
                     data=[rng.getrandbits(64) for _ in range(8)] if write else [],
                     strobes=[0xFF] * 8 if write else [])

    bursts = [burst for write in (True, False) for n, (addr, length) in enumerate(probes)
              for burst in (filler(write, n), probe(write, addr, length, n))]
    bursts += [Burst(True, 0, 1, 3, FIXED, 4, [ones] * 2, [0xFF] * 2),
               Burst(True, 0, 1, 3, WRAP, 5, [ones] * 2, [0xFF] * 2),
               Burst(True, 0, 0, 4, id=6, data=[ones], strobes=[0xFF]),  # 16 bytes on 64 bits
               Burst(False, 0, 3, 3, FIXED, 9)]
    assert [burst.plan(8, end)[-1][1] for burst in bursts[-4:]] == [SLVERR] * 4
    run(dut, bursts, valid=1, ready=1, host=0)   # readback: only the fillers' words are set


@pytest.mark.parametrize("data_width", [32, 128])
def test_throughput_of_16_beat_bursts(data_width):
    dut = AxiMemory(data_width, 1024)
    beats = 16
    bursts = [Burst(False, 0, beats - 1, (data_width // 8).bit_length() - 1, id=1),
              Burst(True, 512, beats - 1, (data_width // 8).bit_length() - 1, id=2,
                    data=list(range(beats)), strobes=[(1 << data_width // 8) - 1] * beats)]
    reads_only = run(dut, bursts[:1], valid=1, ready=1, host=0, readback=False)
    assert reads_only["r"][-1] <= beats + 3, reads_only
    writes_only = run(dut, bursts[1:], valid=1, ready=1, host=0, readback=False)
    assert writes_only["b"][-1] <= beats + 3, writes_only
    both = run(dut, bursts, valid=1, ready=1, host=0, readback=False)   # share the port
    assert both["cycles"] <= 2 * beats + 4, both
    dual = run(AxiMemory(data_width, 1024, dual_port=True), bursts, valid=1, ready=1, host=0,
               readback=False)
    assert dual["cycles"] <= beats + 4, dual


def test_a_single_port_takes_reads_and_writes_in_turn():
    """AR and AW both waiting all the time: the single port's bursts alternate, a read, a
    write, ..., so neither kind waits for the other's stream to end."""
    dut = AxiMemory(32, 1024, kind="spram")
    count, beats = 4, 3
    bursts = [Burst(write, 64 * n + 512 * write, beats - 1, 2, id=n,
                    data=list(range(beats)) if write else [],
                    strobes=[0xF] * beats if write else [])
              for n in range(count) for write in (False, True)]
    result = run(dut, bursts, valid=1, ready=1, host=0, readback=False)
    ends = sorted([(cycle, "r") for cycle in result["r"][beats - 1::beats]]
                  + [(cycle, "b") for cycle in result["b"]])
    kinds = "".join(kind for _, kind in ends)
    assert len(kinds) == 2 * count and kinds in ("rb" * count, "br" * count), result


@pytest.mark.parametrize("write", [False, True])
@pytest.mark.parametrize("dual_port", [True, False])
def test_short_bursts_back_to_back(write, dual_port):
    """A stream of 4-beat bursts moves a beat every cycle: the next AW/AR waits in the slot
    while the running burst's beats go, and starts with no idle cycle between them; a single
    port (no slot) takes one idle cycle between bursts."""
    dut = AxiMemory(128, 4096, dual_port=dual_port)
    count, beats = 16, 4
    bursts = [Burst(write, 64 * n, beats - 1, 4, id=n % 16,
                    data=list(range(beats)) if write else [],
                    strobes=[0xFFFF] * beats if write else []) for n in range(count)]
    result = run(dut, bursts, valid=1, ready=1, host=0, readback=False)
    last = result["b"][-1] if write else result["r"][-1]
    assert last <= count * (beats + (not dual_port)) + 4, result


@pytest.mark.parametrize("args, kwargs, name", [
    ((48, 1024), {}, "data_width"),
    ((64, 1000), {}, "size_bytes"),
    ((64, 4), {}, "size_bytes"),
    ((64, 1 << 33), {}, "size_bytes"),
    ((64, 1024), {"kind": "dram"}, "kind"),
    ((32, 256 * 1024), {"kind": "spram"}, "size_bytes"),
    ((128, 64 * 1024), {"kind": "spram"}, "data_width"),
    ((32, 1024), {"kind": "spram", "dual_port": True}, "dual_port"),
])
def test_bad_parameters(args, kwargs, name, refuses):
    refuses(lambda: AxiMemory(*args, **kwargs), name)


def test_bram_maps_to_dp16kd_on_ecp5():
    cells = synth_component_cells(AxiMemory(64, 64 * 1024), "ecp5", name="axi_memory")
    assert cells.get("DP16KD", 0) == 64 * 1024 * 8 // (16 * 1024), cells
    assert cells.get("TRELLIS_FF", 0) < 400, cells


def test_spram_maps_to_sb_spram256ka_on_ice40():
    cells = synth_component_cells(AxiMemory(32, 128 * 1024, kind="spram"), "ice40",
                                  name="axi_memory", options=("-spram",))
    assert cells.get("SB_SPRAM256KA", 0) == 4, cells
    assert cells.get("SB_RAM40_4K", 0) == 0, cells
    assert sum(n for cell, n in cells.items() if cell.startswith("SB_DFF")) < 400, cells


@pytest.mark.parametrize("kind, dual_port", [("spram", False), ("bram", True)])
def test_no_axi_output_depends_combinationally_on_an_axi_input(kind, dual_port):
    """AXI4: no combinatorial path from an input to an output of the slave. Random inputs (not
    even the protocol kept) for 400 cycles; in each, every AXI input flipped alone changes no
    AXI output."""
    dut = AxiMemory(32, 1024, kind=kind, dual_port=dual_port)
    ports = {name: getattr(dut, name) for name in dir(dut) if name.startswith("s_axi_")}
    inputs = {name: port for name, port in ports.items() if name in dut.signature.members
              and dut.signature.members[name].flow.name == "In"}
    outputs = {name: port for name, port in ports.items() if name not in inputs}
    rng = random.Random(9)
    flips = Counter()

    async def testbench(ctx):
        for _ in range(400):
            for port in (*inputs.values(), dut.host.select, dut.host.read, dut.host.write,
                         dut.host.addr):
                ctx.set(port, rng.getrandbits(len(port)))
            before = {name: ctx.get(port) for name, port in outputs.items()}
            for name, port in inputs.items():
                value = ctx.get(port)
                ctx.set(port, value ^ 1)
                after = {name: ctx.get(port) for name, port in outputs.items()}
                assert after == before, f"{name} -> " + ", ".join(
                    out for out in outputs if after[out] != before[out])
                ctx.set(port, value)
                flips[name] += 1
            await ctx.tick()

    run_testbench(dut, testbench)
    assert set(flips) >= {"s_axi_rready", "s_axi_wvalid", "s_axi_arvalid", "s_axi_bready"}
