"""The CPU speed work: block-quantised kernels, low-bit weights, the lean forward."""
