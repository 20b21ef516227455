"""The front of a DMA engine (tile walker, element stage, burst planner), and one front shared
by the load and store engines (`CoreConfig.shared_dma`)."""
from dataclasses import dataclass

from amaranth.hdl import Module, Mux, ResetInserter, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..isa import ErrorCode, TensorDescriptor, window_layout
from .walker import (POOLING, BurstPlanner, ElementStage, TileWalker, burst_layout,
                     element_layout, step_layout)

__all__ = ["FrontClient", "DmaFront", "SharedDmaFront", "engine_front", "front_geometry",
           "front_signature", "shared_front_signature"]


@dataclass(frozen=True)
class FrontClient:
    """What an engine needs of a front: its SRAM's ``lanes`` and ``rows``, the element sizes
    (``elem_log2``, a tuple) and pooling its descriptors may have, the window ``permission``
    ("read" or "write"), the `BurstPlanner`'s ``max_steps`` and ``max_beats``, and whether the
    engine ``holds`` the descriptor on ``held`` until its walk ends (else it may change from
    the cycle after ``walk``: the front's walker keeps what it needs of it)."""
    lanes: int
    rows: int
    elem_log2: tuple
    pool: bool
    permission: str
    max_steps: int
    max_beats: int
    holds: bool = True


def front_signature(lanes, rows, beat_bytes, address_width=32):
    """A front as its engine sees it, written from the front's side (addresses of
    ``address_width`` bits, `CoreConfig.address_width`).

    ``request``: the engine wants the front (`engine_front`; unused unless shared);
    ``granted``: the front is the engine's (always, unless shared); the engine uses nothing
    else before it. ``walk``: a pulse that starts the tile walker on ``held`` (and
    ``held_pool``), which the engine keeps until the walk ends if its `FrontClient` ``holds``
    it; the walker is idle then. ``external``: the elements come from ``extra`` (the load
    engine's im2col walker) instead. Elements flow while ``running``; ``abort``
    stops the walker and the planner. ``steps``, ``bursts`` and ``error``: the
    `BurstPlanner`'s.
    """
    return wiring.Signature({
        "request": In(1),
        "granted": Out(1),
        "walk": In(1),
        "held": In(TensorDescriptor),
        "held_pool": In(POOLING),
        "external": In(1),
        "extra": In(stream.Signature(element_layout(lanes, rows, address_width))),
        "running": In(1),
        "abort": In(1),
        "steps": Out(stream.Signature(step_layout(lanes, rows, beat_bytes))),
        "bursts": Out(stream.Signature(burst_layout(address_width))),
        "error": Out(ErrorCode),
    })


def _front_request(m, engine, front, acquiring):
    """Drive the ``request`` of ``engine``'s shared ``front``: asked while ``acquiring`` (a
    1-bit value of ``m``), kept until the walk has left the front (its last step taken, no
    burst waiting; the engine finishes the instruction without it) or the engine is no longer
    busy (idle, or stopped on an error)."""
    walked_out = Signal(name="walked_out")
    with m.If(acquiring):
        m.d.sync += walked_out.eq(0)
    with m.Elif(front.steps.valid & front.steps.ready & front.steps.payload.last):
        m.d.sync += walked_out.eq(1)
    m.d.comb += front.request.eq(engine.busy & (
        acquiring | front.granted & ~(walked_out & ~front.bursts.valid)))


def _union(clients):
    """(lanes, rows) of a front for every one of ``clients``."""
    return max(c.lanes for c in clients), max(c.rows for c in clients)


def front_geometry(config, client):
    """(lanes, rows) of the elements and steps of the front that serves ``client`` (a
    `FrontClient` of the core ``config``): its own, or the shared front's."""
    if config.shared_dma:  # the load engine's lanes; the scratchpad's or accumulator's rows
        return config.lanes, max(config.scratchpad_rows, config.accumulator_rows)
    return client.lanes, client.rows


def shared_front_signature(config):
    """`front_signature` of the shared front of the core ``config``."""
    lanes, rows = front_geometry(config, None)
    return front_signature(lanes, rows, config.axi_data_width // 8, config.address_width)


class DmaFront(wiring.Component):
    """A `TileWalker` (or the ``extra`` elements) -> `ElementStage` -> `BurstPlanner` for the
    ``clients`` (`FrontClient`): one engine's, or with two (reads, then writes) the shared
    front's, which checks for the permission its ``write`` input chooses. ``windows``: the
    core's access windows; ``address_width``: `CoreConfig.address_width`. The walker keeps
    the fields it walks by (`TileWalker` without ``held``) if a client does not hold its
    descriptor through the walk."""

    def __init__(self, clients, beat_bytes, windows, dims, address_width=32):
        if (len(clients) not in (1, 2) or not all(isinstance(c, FrontClient) for c in clients)
                or len(clients) == 2 and [c.permission for c in clients] != ["read", "write"]):
            raise ValueError(f"clients={clients!r} is invalid: allowed one FrontClient, or two "
                             f"(reads, then writes)")
        self.clients, self.beat_bytes, self.dims = tuple(clients), beat_bytes, dims
        self.address_width = address_width
        lanes, rows = _union(clients)
        super().__init__({
            **front_signature(lanes, rows, beat_bytes, address_width).members,
            "windows": In(data.ArrayLayout(window_layout(address_width), windows)),
            **({"write": In(1)} if len(clients) == 2 else {}),
        })

    def elaborate(self, platform):
        m = Module()
        clients, beat_bytes = self.clients, self.beat_bytes
        lanes, rows = _union(clients)
        shared = len(clients) == 2
        permission = "either" if shared else clients[0].permission

        def limits(name):
            values = tuple(getattr(c, name) for c in clients)
            return values if shared else values[0]

        held = all(c.holds for c in clients)
        m.submodules.walker = walker = TileWalker(
            lanes, rows, elem_log2=tuple(sorted({e for c in clients for e in c.elem_log2})),
            beat_bytes=beat_bytes, pool=any(c.pool for c in clients), dims=self.dims, held=held,
            address_width=self.address_width)
        m.submodules.stage = stage = ElementStage(lanes, rows, beat_bytes, permission,
                                                  len(self.windows), self.address_width)
        m.submodules.planner = planner = BurstPlanner(
            lanes, rows, beat_bytes, max_steps=limits("max_steps"),
            max_beats=limits("max_beats"), permission=permission,
            address_width=self.address_width)
        if shared:
            m.d.comb += [stage.write.eq(self.write), planner.write.eq(self.write)]
        if "held_pool" in walker.signature.members:
            m.d.comb += walker.held_pool.eq(self.held_pool)
        elif "pool" in walker.signature.members:
            m.d.comb += walker.pool.eq(self.held_pool)
        if held:
            m.d.comb += walker.held.eq(self.held)
        wiring.connect(m, stage.output, planner.elements)
        external, running = self.external, self.running
        m.d.comb += [
            self.granted.eq(1),
            walker.descriptor.payload.eq(self.held),
            walker.descriptor.valid.eq(self.walk),
            walker.abort.eq(self.abort),
            planner.abort.eq(self.abort),
            stage.windows.eq(self.windows),
            stage.input.payload.eq(Mux(external, self.extra.payload, walker.elements.payload)),
            stage.input.valid.eq(Mux(external, self.extra.valid, walker.elements.valid)
                                 & running),
            walker.elements.ready.eq(stage.input.ready & running & ~external),
            self.extra.ready.eq(stage.input.ready & running & external),
            self.error.eq(planner.error),
        ]
        wiring.connect(m, planner.steps, wiring.flipped(self.steps))
        wiring.connect(m, planner.bursts, wiring.flipped(self.bursts))
        return m


class SharedDmaFront(wiring.Component):
    """One `DmaFront` for the load and store engines (``load`` and ``store``, each a
    `front_signature`): the engine whose ``request`` was granted has it until the request
    falls (`engine_front`: its walk has left the front, or it is idle or stopped on an
    error), then the front is reset for a cycle (an aborted walk leaves nothing behind) and
    granted again, to the other engine first if it asks. A granted walk needs nothing from the
    other engine, so neither waits for ever."""

    def __init__(self, load, store, beat_bytes, windows, dims, address_width=32):
        self.load_client, self.store_client = load, store
        self.beat_bytes, self.dims, self.address_width = beat_bytes, dims, address_width
        lanes, rows = _union((load, store))
        port = front_signature(lanes, rows, beat_bytes, address_width)
        super().__init__({"load": Out(port), "store": Out(port),
                          "windows": In(data.ArrayLayout(window_layout(address_width), windows))})

    def elaborate(self, platform):
        m = Module()
        ports = [self.load, self.store]
        owned = Signal()
        owner = Signal()  # 0: load, 1: store
        release = Signal()
        m.d.comb += release.eq(owned & ~Mux(owner, self.store.request, self.load.request))
        front = DmaFront((self.load_client, self.store_client), self.beat_bytes,
                         len(self.windows), self.dims, self.address_width)
        m.submodules.front = ResetInserter(release)(front)

        with m.If(release):
            m.d.sync += owned.eq(0)
        with m.Elif(~owned & (self.load.request | self.store.request)):
            # To the engine that had it not last, if it asks (no engine waits for ever).
            m.d.sync += [owned.eq(1),
                         owner.eq(Mux(owner, ~self.load.request, self.store.request))]

        granted = [owned & ~owner, owned & owner]
        chosen = {name: Mux(owner, getattr(self.store, name), getattr(self.load, name))
                  for name in ("held", "held_pool", "running", "abort")}
        m.d.comb += [
            front.write.eq(owner),
            front.external.eq(self.load.external & ~owner),
            front.windows.eq(self.windows),
            front.walk.eq(Mux(owner, self.store.walk, self.load.walk) & owned),
            front.extra.payload.eq(self.load.extra.payload),  # the store engine has none
            front.extra.valid.eq(self.load.extra.valid & ~owner),
            front.steps.ready.eq(Mux(owner, self.store.steps.ready, self.load.steps.ready)),
            front.bursts.ready.eq(Mux(owner, self.store.bursts.ready, self.load.bursts.ready)),
            *(getattr(front, name).eq(value) for name, value in chosen.items()),
        ]
        for port, mine in zip(ports, granted):
            m.d.comb += [
                port.granted.eq(mine),
                port.extra.ready.eq(front.extra.ready & mine),  # (the load engine's)
                port.steps.payload.eq(front.steps.payload),
                port.steps.valid.eq(front.steps.valid & mine),
                port.bursts.payload.eq(front.bursts.payload),
                port.bursts.valid.eq(front.bursts.valid & mine),
                port.error.eq(Mux(mine, front.error, ErrorCode.NONE)),
            ]
        return m


def engine_front(m, engine, client):
    """``(front, acquiring)``: the DMA front of ``engine`` (a DMA engine, needing ``client``,
    a `FrontClient`), as the engine sees it. With `CoreConfig.shared_dma` the core's shared
    front through ``engine.front``, whose ``request`` this drives (`_front_request`), and
    ``acquiring``, a signal of ``m`` the engine sets while it waits for the front; else a
    `DmaFront` of its own in ``m``, and None."""
    config = engine.config
    if config.shared_dma:
        front = wiring.flipped(engine.front)
        acquiring = Signal()
        _front_request(m, engine, front, acquiring)
        return front, acquiring
    m.submodules.front = front = DmaFront([client], config.axi_data_width // 8, config.windows,
                                          config.descriptor_dims, config.address_width)
    m.d.comb += front.windows.eq(engine.windows)
    return front, None
