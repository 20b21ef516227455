"""`AxiRegisterSlice`: a register stage on every channel of an AXI4 link, as interconnects put
between a master and a slave that are far apart on the die."""
from amaranth.hdl import Cat, Module
from amaranth.lib import wiring

from .axi import axi_read_signature, axi_write_signature, flat_ports
from .pipeline import SkidBuffer

__all__ = ["AxiRegisterSlice"]

_CHANNELS = {
    # channel: (its payload fields, whether the master drives it)
    "ar": (("id", "addr", "len", "size", "burst"), True),
    "aw": (("id", "addr", "len", "size", "burst"), True),
    "w": (("data", "strb", "last"), True),
    "r": (("id", "data", "resp", "last"), False),
    "b": (("id", "resp"), False),
}


class AxiRegisterSlice(wiring.Component):
    """Passes an AXI4 link from ``s_axi_*`` (a master's ``m_axi_*`` connect here, name by name)
    to ``m_axi_*`` (the slave's ``s_axi_*``) through a `SkidBuffer` per channel.

    No output depends combinationally on an input: every VALID, READY and payload leaving it
    comes from a flip-flop (no LUT RAM read), so a path between the master and the slave ends
    here. Full throughput (a beat per cycle per channel), a cycle of latency each way; order
    within each channel is kept, and the channels are as independent as AXI4 makes them.
    """

    def __init__(self, data_width):
        self.data_width = data_width
        super().__init__({
            **flat_ports("s_axi", axi_read_signature(data_width).flip()),
            **flat_ports("s_axi", axi_write_signature(data_width).flip()),
            **flat_ports("m_axi", axi_read_signature(data_width)),
            **flat_ports("m_axi", axi_write_signature(data_width)),
        })

    def elaborate(self, platform):
        m = Module()
        for channel, (fields, forward) in _CHANNELS.items():
            source, sink = ("s_axi", "m_axi") if forward else ("m_axi", "s_axi")

            def port(side, name):
                return getattr(self, f"{side}_{channel}{name}")

            payload_in = Cat(port(source, f) for f in fields)
            payload_out = Cat(port(sink, f) for f in fields)
            m.submodules[f"{channel}_slice"] = buffer = SkidBuffer(len(payload_in))
            m.d.comb += [
                buffer.i.payload.eq(payload_in),
                buffer.i.valid.eq(port(source, "valid")),
                port(source, "ready").eq(buffer.i.ready),
                payload_out.eq(buffer.o.payload),
                port(sink, "valid").eq(buffer.o.valid),
                buffer.o.ready.eq(port(sink, "ready")),
            ]
        return m
