"""The project's own trained drafts shipped in assets/drafts/: each file <= 40 MB, <= 80 MB in all,
each listed with its sha256 in docs/trained_drafts.md (the card), and each readable as its kind."""
import hashlib
import json
from pathlib import Path

import pytest
import torch

from specviz.engine.trained.eagle_head import unpack
from specviz.engine.trained.store import SHIPPED

CARD = Path(__file__).resolve().parents[1] / "docs" / "trained_drafts.md"
FILES = sorted(SHIPPED.glob("*/*.pt"))
MB = 1 << 20
KIND = {"eagle.pt": "eagle", "heads.pt": "medusa", "exit.pt": "exit"}  # a file -> its report's kind


def test_sizes_and_card():
    assert sum(f.stat().st_size for f in FILES) <= 80 * MB
    card = CARD.read_text() if FILES else ""
    for f in FILES:
        assert f.stat().st_size <= 40 * MB, f
        assert hashlib.sha256(f.read_bytes()).hexdigest() in card, f"{f} is not on the card with its sha256"
        assert (f.parent / f"{KIND[f.name]}-report.json").is_file()


@pytest.mark.parametrize("path", FILES, ids=[f.name for f in FILES])
def test_each_file_reads(path):
    blob = torch.load(path, map_location="cpu", weights_only=True)
    if path.name == "eagle.pt":
        head, keep = unpack(blob)
        assert len(keep) <= 40_000 and head.cfg["hidden"] > 0
    elif path.name == "exit.pt":
        from specviz.engine.trained.exit_head import unpack_exit
        adapter, keep = unpack_exit(blob)
        assert len(keep) <= 40_000 and adapter.cfg["layer"] >= 1
    else:
        assert blob["k"] >= 1 and len(blob["keep"]) <= 40_000
    rep = json.loads((path.parent / f"{KIND[path.name]}-report.json").read_text())
    assert rep.get("acceptance_by_position"), "the held-out acceptance is measured (heads accept)"


def test_every_shipped_file_is_in_its_sha256sums():
    """What the load checks (store.check): each shipped file's sha256 as its folder's SHA256SUMS lists it."""
    from specviz.engine.trained import store
    for f in FILES:
        assert store.check(f) is None, store.check(f)


def test_the_card_is_what_its_script_writes():
    """docs/trained_drafts.md is scripts/drafts_card.py's output: with the pass's folder gone (an earlier
    machine's), the script keeps the card's data lines and "Bench", and writes the rest from the reports
    and docs/trained_drafts_commands.sh, so a report edited without the card fails here."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("drafts_card", CARD.parents[1] / "scripts" / "drafts_card.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    old = CARD.read_text()
    text = mod.card(None, mod.MACHINE, "2026-11-29", [], old)
    assert mod.KEEP_FROM in old and mod.with_bench(text, old) == old
