"""An AXI4-Lite master for amaranth.sim testbenches, driving a slave's bus
(``axi_lite_signature().flip()``)."""

__all__ = ["AxiLiteMaster", "WRITE_ORDERS"]

WRITE_ORDERS = ("together", "aw_first", "w_first")


class AxiLiteMaster:
    """One transaction at a time on ``bus``; every call returns after the response handshake.

    ``order`` raises AWVALID and WVALID together or one ``gap`` cycles after the other (never
    waiting for the first's handshake, which AXI4 forbids a master: a slave may wait for both);
    ``resp_delay`` holds BREADY/RREADY low for that many cycles after BVALID/RVALID, checking
    that the slave keeps its response stable meanwhile.
    """

    def __init__(self, bus):
        self.bus = bus

    async def handshake(self, ctx, *channels):
        """Raise each ``(valid, ready)`` channel's valid until its handshake."""
        for valid, _ in channels:
            ctx.set(valid, 1)
        pending = list(channels)
        while pending:
            pending = await self._cycle(ctx, pending)

    @staticmethod
    async def _cycle(ctx, pending):
        """A clock cycle of the ``pending`` channels (valid raised): lowers the valid of those
        whose handshake it is; returns the others."""
        if not pending:
            await ctx.tick()
            return pending
        _, _, *readies = await ctx.tick().sample(*(ready for _, ready in pending))
        for (valid, _), ready in zip(pending, readies):
            if ready:
                ctx.set(valid, 0)
        return [channel for channel, ready in zip(pending, readies) if not ready]

    async def _response(self, ctx, valid, ready, payload, resp_delay):
        ctx.set(ready, resp_delay == 0)
        if resp_delay:
            held = await ctx.tick().sample(*payload).until(valid)
            for _ in range(resp_delay):
                _, _, *now, still = await ctx.tick().sample(*payload, valid)
                assert still and tuple(now) == held, "response changed before its handshake"
            ctx.set(ready, 1)
        values = await ctx.tick().sample(*payload).until(valid)
        ctx.set(ready, 0)
        return values

    async def write(self, ctx, addr, value, strb=0xF, order="together", gap=0, resp_delay=0):
        """Write ``value`` to byte address ``addr``; returns BRESP."""
        if order not in WRITE_ORDERS:
            raise ValueError(f"order={order!r} is invalid: allowed {', '.join(WRITE_ORDERS)}")
        bus = self.bus
        ctx.set(bus.awaddr, addr)
        ctx.set(bus.wdata, value)
        ctx.set(bus.wstrb, strb)
        aw, w = (bus.awvalid, bus.awready), (bus.wvalid, bus.wready)
        if order == "together":
            await self.handshake(ctx, aw, w)
        else:
            first, second = (aw, w) if order == "aw_first" else (w, aw)
            ctx.set(first[0], 1)
            pending = [first]
            for _ in range(gap):
                pending = await self._cycle(ctx, pending)
                assert not ctx.get(bus.bvalid), "BVALID before both AW and W"
            await self.handshake(ctx, *pending, second)
        resp, = await self._response(ctx, bus.bvalid, bus.bready, (bus.bresp,), resp_delay)
        return resp

    async def read(self, ctx, addr, resp_delay=0):
        """Read byte address ``addr``; returns (RDATA, RRESP)."""
        bus = self.bus
        ctx.set(bus.araddr, addr)
        await self.handshake(ctx, (bus.arvalid, bus.arready))
        return tuple(await self._response(ctx, bus.rvalid, bus.rready, (bus.rdata, bus.rresp),
                                          resp_delay))
