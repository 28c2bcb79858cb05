"""Source-code edits that build the grounded code tasks: each returns the
edited code, or None when the edit does not apply (nothing to strip)."""
from __future__ import annotations

import ast


def _function_defs(tree: ast.Module) -> list[ast.FunctionDef]:
    return [node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


def strip_annotations(code: str) -> str | None:
    """Remove parameter and return annotations from every function signature.

    Rewrites only the signature lines; the body (comments, docstring) is kept
    verbatim. Code without annotations is returned unchanged. Returns None
    when the code cannot be handled.
    """
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return None
    lines = code.split("\n")
    defs = sorted(_function_defs(tree), key=lambda d: d.lineno, reverse=True)
    changed = False
    for node in defs:
        if node.decorator_list or not node.body:
            return None
        first_body = node.body[0].lineno
        if first_body <= node.lineno:  # one-line def: body on the signature line
            return None
        args = node.args
        has_ann = node.returns is not None or any(
            a.annotation is not None
            for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
            if a is not None
        )
        if not has_ann:
            continue
        for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
            if a is not None:
                a.annotation = None
        sig_start = node.lineno - 1
        sig_end = first_body - 1  # exclusive; signature ends before the body
        # Do not swallow blank or comment lines sitting between signature and body.
        while sig_end - 1 > sig_start and not lines[sig_end - 1].rstrip().endswith(":"):
            sig_end -= 1
        indent = lines[sig_start][: len(lines[sig_start]) - len(lines[sig_start].lstrip())]
        prefix = "async def" if isinstance(node, ast.AsyncFunctionDef) else "def"
        new_sig = f"{indent}{prefix} {node.name}({ast.unparse(args)}):"
        lines[sig_start:sig_end] = [new_sig]
        changed = True
    if not changed:  # no hints to begin with: the task applies as is
        return code
    out = "\n".join(lines)
    try:
        ast.parse(out)
    except SyntaxError:
        return None
    return out


def strip_docstrings(code: str) -> str | None:
    """Remove the docstring of every function (lines only; the rest verbatim)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return None
    lines = code.split("\n")
    spans = []
    for node in _function_defs(tree):
        body = node.body
        if (
            len(body) > 1
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
            and body[0].lineno > node.lineno
        ):
            spans.append((body[0].lineno - 1, body[0].end_lineno))
    if not spans:
        return None
    for start, end in sorted(spans, reverse=True):
        del lines[start:end]
    out = "\n".join(lines)
    try:
        ast.parse(out)
    except SyntaxError:
        return None
    return out


def two_space_indent(code: str) -> str | None:
    """Halve leading indentation (4 -> 2 spaces per level); None if nothing changes."""
    out = []
    for line in code.split("\n"):
        stripped = line.lstrip(" ")
        lead = len(line) - len(stripped)
        out.append(" " * (lead // 4 * 2 + lead % 4) + stripped)
    new = "\n".join(out)
    if new == code:
        return None
    try:
        ast.parse(new)
    except SyntaxError:
        return None
    return new


def fenced(code: str) -> str:
    return f"```python\n{code.strip()}\n```"
