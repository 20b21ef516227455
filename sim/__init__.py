"""tpugen.sim."""
