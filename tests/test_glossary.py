"""The glossary explains every precision the page may name (issue 59: "7-bit per-token activations",
from the status line's precision detail, was not in it)."""
from specviz.engine.cpu.lowbit import NAMES
from specviz.ui.glossary import glossary_html


def test_every_activation_format_is_in_the_glossary():
    gloss = glossary_html()
    for name in NAMES.values():
        acts = name.split(", ")[-1]  # "7-bit per-token activations", "bfloat16 activations", …
        kind = acts.removesuffix(" activations")
        assert kind in gloss or {"float32": "fp32"}.get(kind, kind) in gloss, (name, kind)
    assert "7-bit per-token activations" in gloss and "8-bit per-block activations" in gloss
