"""FPGA flows: synthesis reports (board tops and bitstreams to come)."""
