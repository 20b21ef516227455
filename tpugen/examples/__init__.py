"""Examples on real data, run on the simulated core."""
