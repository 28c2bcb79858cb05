"""Source-code edits that build the grounded code tasks: each returns the
edited code, or None when the edit does not apply (nothing to strip)."""
from __future__ import annotations

import ast


class _Skip(Exception):
    """The edit cannot be made safely: the transform returns None."""


def _edit_functions(code: str, span, unchanged: str | None) -> str | None:
    """Parse code, ask span(node, lines) for each function what to replace
    ((start, end, new lines), or None to leave it), apply the edits bottom-up so
    earlier line numbers stay valid, and check the result still parses. No edit:
    `unchanged`; code that does not parse or an edit that cannot be made: None."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return None
    lines = code.split("\n")
    defs = [node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    try:
        edits = [e for e in (span(node, lines) for node in sorted(defs, key=lambda d: d.lineno)) if e]
    except _Skip:
        return None
    if not edits:
        return unchanged
    for start, end, new in sorted(edits, key=lambda e: e[0], reverse=True):
        lines[start:end] = new
    out = "\n".join(lines)
    try:
        ast.parse(out)
    except SyntaxError:
        return None
    return out


def _all_args(args: ast.arguments) -> list[ast.arg]:
    every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
    return [a for a in every if a is not None]


def _signature_without_hints(node, lines):
    if node.decorator_list or not node.body:
        raise _Skip
    first_body = node.body[0].lineno
    if first_body <= node.lineno:  # one-line def: body on the signature line
        raise _Skip
    if node.returns is None and all(a.annotation is None for a in _all_args(node.args)):
        return None
    for a in _all_args(node.args):
        a.annotation = None
    sig_start = node.lineno - 1
    sig_end = first_body - 1  # exclusive; signature ends before the body
    # Do not swallow blank or comment lines sitting between signature and body.
    while sig_end - 1 > sig_start and not lines[sig_end - 1].rstrip().endswith(":"):
        sig_end -= 1
    indent = lines[sig_start][: len(lines[sig_start]) - len(lines[sig_start].lstrip())]
    prefix = "async def" if isinstance(node, ast.AsyncFunctionDef) else "def"
    return sig_start, sig_end, [f"{indent}{prefix} {node.name}({ast.unparse(node.args)}):"]


def _docstring_lines(node, lines):
    body = node.body
    if (
        len(body) > 1
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
        and body[0].lineno > node.lineno
    ):
        return body[0].lineno - 1, body[0].end_lineno, []
    return None


def strip_annotations(code: str) -> str | None:
    """Remove parameter and return annotations from every function signature.

    Rewrites only the signature lines; the body (comments, docstring) is kept
    verbatim. Code without annotations is returned unchanged. Returns None
    when the code cannot be handled.
    """
    return _edit_functions(code, _signature_without_hints, unchanged=code)


def strip_docstrings(code: str) -> str | None:
    """Remove the docstring of every function (lines only; the rest verbatim)."""
    return _edit_functions(code, _docstring_lines, unchanged=None)


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
