"""Where SpecViz keeps what it builds on a machine (converted models, calibration,
datastores, vocabularies, heads): one root, $SPECVIZ_CACHE or ~/.cache/specviz.
A leaf module, so the engine can find its caches without importing the model loader."""
from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("SPECVIZ_CACHE") or Path.home() / ".cache" / "specviz").expanduser()
