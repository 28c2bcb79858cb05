"""What makes a GPU fast under the loop (beside engine/cpu/): the one static KV cache (static.py's
StaticKV, which the CPU's static backends serve too) and a forward over it with fixed shapes
(StaticModel), captured as plain torch.cuda.CUDAGraphs (no torch.compile: ZeroGPU does not support
it), and the greedy loop over them with acceptance on the device (graphs.py); timing helpers for
`python -m specviz gpu-check` (measure.py) and the default pair's configs it builds random models
from (configs/). Only torch and transformers: a bare GPU machine runs it."""
