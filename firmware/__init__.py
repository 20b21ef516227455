"""tpugen.firmware."""
