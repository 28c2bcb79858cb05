"""The README's module map ("How it fits together") names every module of specviz/:
each folder as `name/`, each file in its own folder's entry (top-level files in a
top-level entry). Package plumbing (__init__.py, __main__.py) is the folder's entry."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENTRY = re.compile(r"^  (\S+)")  # an entry starts at indent 2; deeper lines continue it


def sections() -> dict[str, str]:
    """Folder ('' for top level, 'engine/proposers/' ...) -> the text of its entries."""
    text = (ROOT / "README.md").read_text()
    block = text.split("## How it fits together", 1)[1].split("```", 2)[1]
    out: dict[str, str] = {}
    key = ""
    for line in block.splitlines()[2:]:  # past "```" and "specviz/"
        m = ENTRY.match(line)
        if m:
            key = m[1] if m[1].endswith("/") else ""
        out[key] = out.get(key, "") + "\n" + line
    return out


def test_readme_map_names_every_module():
    secs = sections()
    missing = []
    for path in sorted((ROOT / "specviz").rglob("*.py")):
        rel = path.relative_to(ROOT / "specviz")
        if path.name in ("__init__.py", "__main__.py"):
            folder = f"{rel.parent.as_posix()}/"
            if rel.parent != Path(".") and folder not in secs:
                missing.append(folder)
            continue
        folder = "" if rel.parent == Path(".") else f"{rel.parent.as_posix()}/"
        if not re.search(rf"(?<![\w/]){re.escape(path.name)}", secs.get(folder, "")):
            missing.append(rel.as_posix())
    assert not missing, f"README map lacks: {', '.join(missing)}"
