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


def test_a_local_folder_is_named_by_its_last_part():
    from specviz.ui.glossary import pair_html, short_label
    assert short_label("/tmp/pytest-of-root/pytest-61/popen-gw1/app0/target + /tmp/x/y/draft") == "…/target + …/draft"
    assert short_label("Qwen/Qwen2.5-Coder-1.5B-Instruct + Qwen/Qwen2.5-Coder-0.5B-Instruct").count("…") == 0
    html = pair_html({"label": "/a/b/c/target", "device": "cpu"})
    assert "…/target" in html and "title='/a/b/c/target'" in html
