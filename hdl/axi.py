"""AXI4 / AXI4-Lite signatures, named as cocotbext-axi expects them (``<prefix>_<signal>``)."""
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["AXI_BURST_INCR", "AXI_RESP_DECERR", "AXI_RESP_OKAY", "AXI_RESP_SLVERR", "ID_WIDTH", "ADDR_WIDTH",
           "axi_read_signature", "axi_write_signature", "axi_lite_signature", "flat_ports",
           "connect_by_name", "memory_host_signature"]

ADDR_WIDTH = 32
ID_WIDTH = 4
AXI_BURST_INCR = 0b01
AXI_RESP_OKAY = 0b00
AXI_RESP_SLVERR = 0b10
AXI_RESP_DECERR = 0b11


def axi_read_signature(data_width, addr_width=ADDR_WIDTH, id_width=ID_WIDTH):
    """AR and R channels, from the master's side."""
    return wiring.Signature({
        "arid": Out(id_width), "araddr": Out(addr_width), "arlen": Out(8), "arsize": Out(3),
        "arburst": Out(2), "arvalid": Out(1), "arready": In(1),
        "rid": In(id_width), "rdata": In(data_width), "rresp": In(2), "rlast": In(1),
        "rvalid": In(1), "rready": Out(1),
    })


def axi_write_signature(data_width, addr_width=ADDR_WIDTH, id_width=ID_WIDTH):
    """AW, W and B channels, from the master's side."""
    return wiring.Signature({
        "awid": Out(id_width), "awaddr": Out(addr_width), "awlen": Out(8), "awsize": Out(3),
        "awburst": Out(2), "awvalid": Out(1), "awready": In(1),
        "wdata": Out(data_width), "wstrb": Out(data_width // 8), "wlast": Out(1),
        "wvalid": Out(1), "wready": In(1),
        "bid": In(id_width), "bresp": In(2), "bvalid": In(1), "bready": Out(1),
    })


def axi_lite_signature(addr_width=12, data_width=32):
    """AXI4-Lite, from the master's side (a slave's port is its ``flip()``)."""
    return wiring.Signature({
        "awaddr": Out(addr_width), "awprot": Out(3), "awvalid": Out(1), "awready": In(1),
        "wdata": Out(data_width), "wstrb": Out(data_width // 8), "wvalid": Out(1),
        "wready": In(1),
        "bresp": In(2), "bvalid": In(1), "bready": Out(1),
        "araddr": Out(addr_width), "arprot": Out(3), "arvalid": Out(1), "arready": In(1),
        "rdata": In(data_width), "rresp": In(2), "rvalid": In(1), "rready": Out(1),
    })


def flat_ports(prefix, signature):
    """Members of ``signature`` renamed ``<prefix>_<name>``, for a top-level port list."""
    return {f"{prefix}_{name}": member for name, member in signature.members.items()}


def memory_host_signature(addr_width=30):
    """A 32-bit word port into a board's memory, from the host side (the UART bridge).

    While ``select`` is high the host owns the memory and the AXI side waits. ``addr`` is a
    word address (byte address >> 2); ``read`` returns ``rdata`` after the memory's
    ``host_read_latency`` cycles (`AxiMemory`); ``write`` stores ``wdata``.
    """
    return wiring.Signature({
        "select": Out(1), "addr": Out(addr_width), "read": Out(1), "write": Out(1),
        "wdata": Out(32), "rdata": In(32),
    })


def connect_by_name(m, master, master_prefix, slave, slave_prefix, signature):
    """Connect ``master.<master_prefix><name>`` and ``slave.<slave_prefix><name>`` for every
    member of ``signature`` (seen from the master), each driven in its direction: for port
    groups flattened to a top level (`flat_ports`), which `wiring.connect` cannot join."""
    for name, member in signature.members.items():
        source = getattr(master, f"{master_prefix}{name}")
        sink = getattr(slave, f"{slave_prefix}{name}")
        if member.flow == Out:
            m.d.comb += sink.eq(source)
        else:
            m.d.comb += source.eq(sink)
