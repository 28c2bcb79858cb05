"""A GGUF file to a float32 safetensors folder, one tensor at a time.

`from_pretrained(gguf_file=...)` dequantises every tensor into one state dict and builds the
model from it before anything can be saved: most of a first start's memory
(docs/why.md#gguf-convert). Here each tensor is dequantised
with the same function transformers uses (gguf-py's `dequantize`, then its tensor processor
and name map), written into shards of at most SHARD_BYTES, and let go: the same bytes on disk,
in a sharded checkpoint that `from_pretrained(folder)` reads as it read the single file.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

SHARD_BYTES = 1 << 30  # a shard is held in memory until written
INDEX = "model.safetensors.index.json"


def _shard_name(i: int) -> str:
    return f"model-{i:05d}.safetensors"


def _hf_names(gguf: Path, config) -> tuple[dict[str, str], object, dict]:
    """(GGUF tensor name -> transformers name, transformers' tensor processor for the
    architecture, the parsed metadata): what `load_gguf_checkpoint` uses, the names read off a
    model built on the meta device."""
    from transformers import AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import (
        TENSOR_PROCESSORS,
        TensorProcessor,
        get_gguf_hf_weights_map,
        load_gguf_checkpoint,
    )
    parsed = load_gguf_checkpoint(str(gguf), return_tensors=False)
    arch = parsed["config"].get("model_type")
    processor = TENSOR_PROCESSORS.get(arch, TensorProcessor)(config=parsed["config"])
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    return get_gguf_hf_weights_map(skeleton, processor), processor, parsed


def convert_gguf(gguf: Path, out: Path, progress=None) -> None:
    """Write config.json, the weights (sharded, float32) and their index into `out`."""
    from gguf import GGUFReader, dequantize
    from safetensors.torch import save_file
    from transformers import AutoConfig

    progress = progress or (lambda frac: None)
    config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name, trust_remote_code=False)
    names, processor, parsed = _hf_names(gguf, config)
    reader = GGUFReader(str(gguf))
    shard: dict[str, torch.Tensor] = {}
    weight_map: dict[str, str] = {}
    size = total = 0

    def flush() -> None:
        nonlocal shard, size
        if shard:
            name = _shard_name(len(set(weight_map.values())) + 1)
            save_file(shard, str(out / name), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(shard, name))
            shard, size = {}, 0

    for i, t in enumerate(reader.tensors):
        done = processor.process(weights=dequantize(t.data, t.tensor_type), name=t.name,
                                 tensor_key_mapping=names, parsed_parameters=parsed)
        if done.name not in names:
            continue
        tensor = torch.from_numpy(np.array(done.weights, dtype=np.float32))  # a copy: F32 ones view the file
        if size and size + tensor.nbytes > SHARD_BYTES:
            flush()
        shard[names[done.name]] = tensor
        size += tensor.nbytes
        total += tensor.nbytes
        progress((i + 1) / len(reader.tensors))
    flush()
    del reader
    (out / INDEX).write_text(json.dumps({"metadata": {"total_size": total},
                                         "weight_map": dict(sorted(weight_map.items()))}, indent=1))
    config.architectures = [type_name(config)]
    config.dtype = torch.float32
    config.save_pretrained(out)


def type_name(config) -> str:
    """The causal-LM class name transformers would record for this config."""
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM._model_mapping[type(config)].__name__
