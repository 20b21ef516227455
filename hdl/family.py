"""Which FPGA family a design is elaborated for: the one answer the blocks that instantiate
vendor primitives (SB_MAC16 pairs, a DCCA) or pick a memory style ask."""

__all__ = ["dsp_model", "fpga_family"]


def fpga_family(platform):
    """``"ice40"``, ``"ecp5"`` (or another family's lower-case name) when ``platform`` is an
    Amaranth vendor platform or a synthesis target with a ``family`` attribute (as
    `hdl.generate.generate_verilog` makes for yosys); None for simulation and generic Verilog."""
    family = getattr(platform, "family", None)
    return family.lower() if isinstance(family, str) else None


def dsp_model(platform):
    """Whether ``platform`` asks for the DSP blocks' arithmetic modelled in Amaranth instead of
    their instances (a true ``dsp_model``: `sim.testbench.ForFamily`, for the simulator)."""
    return bool(getattr(platform, "dsp_model", False))
