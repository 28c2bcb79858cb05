"""Model pairs: which target/draft pairs exist, the offline default pair, loading.

registry.py  PairSpec, PAIRS, resolve_pair, available_pairs, device/dtype choice
embedded.py  the offline default pair: GGUF parts joined, verified, converted, cached
loading.py   ModelPair, load_pair, vocabulary check, eos ids, load errors
tiny.py      tiny random pairs for tests
"""
from ..errors import ModelError
from .embedded import (
    DEFAULT_DRAFT,
    DEFAULT_TARGET,
    EMBEDDED,
    EMBEDDED_PREFIX,
    MANIFEST,
    Embedded,
    Progress,
    cache_root,
    ensure_default_pair,
    local_refs,
    verify_cache,
    write_manifest,
)
from .loading import QUANTIZE, ModelPair, check_vocab, load_pair, load_stock
from .registry import PAIRS, PairSpec, available_pairs, pick_device_dtype, resolve_pair

__all__ = [
    "DEFAULT_DRAFT", "DEFAULT_TARGET", "EMBEDDED", "EMBEDDED_PREFIX", "MANIFEST", "PAIRS", "QUANTIZE",
    "Embedded", "ModelError", "ModelPair", "PairSpec", "Progress", "available_pairs", "cache_root",
    "check_vocab", "ensure_default_pair", "load_pair", "load_stock", "local_refs", "pick_device_dtype",
    "resolve_pair", "verify_cache", "write_manifest",
]
