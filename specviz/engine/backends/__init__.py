"""Forward backends: one way each to run a model's KV-cached forward, chosen once per model and
cache kind (engine/kvcache.py's choose, when set_cache or the pair's load decides) and held in the
model's Runtime (base.py), so that no forward asks again which path it takes.

- eager.py: transformers' `model(...)` over a DynamicCache (any architecture);
- lean.py: the Llama family's lean forward and C layer stack over a DynamicCache
  (engine/cpu/lean_forward.py), stepping aside per call only for what can change between calls
  (a forward hook, a forward longer than the path serves);
- static.py: the static (preallocated) KV cache, eager (the cache itself: engine/gpu/static.py's
  StaticKV, the one the graph path runs over too);
- compiled.py: the static cache's step under torch.compile ("reduce-overhead" on CUDA);
- graphs.py: a GPU's static cache replayed as captured CUDA graphs (engine/gpu/), no torch.compile.

A new backend is one more file here: a base.Backend subclass whose caches name it
(`cache.backend`), and one line in kvcache.choose.
"""
