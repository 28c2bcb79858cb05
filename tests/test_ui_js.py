"""Every script the page runs parses (node --check): a quote inside a Python string once broke
access.PAGE_JS, and with it the page's load, so Run never enabled (2026-11-28)."""
import shutil
import subprocess

import pytest

NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="node is not installed")


def _scripts() -> dict[str, str]:
    import gradio as gr

    from specviz.ui import access, blocks, inspector, runqueue, stage
    found = {"access.PAGE_JS": access.PAGE_JS, "stage.PAGE_JS": stage.PAGE_JS % {"forced": "false"},
             "runqueue.PRESS_JS": runqueue.PRESS_JS, "runqueue.SUBMIT_JS": runqueue.SUBMIT_JS}
    with gr.Blocks() as demo:  # the scripts written inline where an event is wired
        blocks.race_pressed(gr.Button())
    for i, dep in enumerate(demo.get_config_file()["dependencies"]):
        if dep.get("js"):
            found[f"blocks.race_pressed #{i}"] = dep["js"]
    out = {name: f"const f = {js};\n" for name, js in found.items()}
    # a js_on_load body runs inside a function of the element and its trigger
    out["inspector.PANE_JS"] = "function f(element, trigger) {\n" + inspector.PANE_JS + "\n}\n"
    return out


def test_every_page_script_parses(tmp_path):
    scripts = _scripts()
    assert len(scripts) >= 6
    for name, js in scripts.items():
        path = tmp_path / "script.js"
        path.write_text(js)
        done = subprocess.run([NODE, "--check", str(path)], capture_output=True, text=True)
        assert done.returncode == 0, f"{name}: {done.stderr}"
