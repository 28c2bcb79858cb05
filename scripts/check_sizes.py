"""Size rules of the style guide: no module in specviz/ over 500 lines, no
function over 80 lines. Prints each offender; exit 1 if there is any."""
from __future__ import annotations

import ast
import sys
from pathlib import Path

MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80


def offenders(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        n = len(text.splitlines())
        if n > MAX_MODULE_LINES:
            found.append(f"{path}: module has {n} lines (max {MAX_MODULE_LINES})")
        for node in ast.walk(ast.parse(text, filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                size = node.end_lineno - start + 1
                if size > MAX_FUNCTION_LINES:
                    found.append(f"{path}:{node.lineno}: {node.name} has {size} lines "
                                 f"(max {MAX_FUNCTION_LINES})")
    return found


def main() -> int:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "specviz"
    found = offenders(root)
    print("\n".join(found) if found else f"sizes ok: {root}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
