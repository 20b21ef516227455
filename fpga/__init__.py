"""tpugen.fpga."""
