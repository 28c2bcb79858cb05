"""Source-code edits that build the grounded code tasks: each returns the
edited code, or None when the edit does not apply (nothing to strip); and the
instructions of the edit tasks (EDIT_TEMPLATES)."""
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


def params_of(code: str, name: str) -> list[str] | None:
    """The parameter names of the function `name` in `code` (None: no such function)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return [a.arg for a in _all_args(node.args)]
    return None


def names_in(code: str) -> set[str]:
    """Every identifier the code uses (names, attributes, arguments, definitions)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
        elif isinstance(node, ast.Attribute):
            out.add(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
    return out


# ------------------------------------------------------------------ the edit tasks (prompts.edit_prompts)
# the new name of a parameter (HumanEval's common ones; others get "<name>_value")
_NEW_NAMES = {"n": "count", "lst": "items", "s": "text", "a": "first", "l": "values", "arr": "array",
              "numbers": "values", "string": "text", "x": "value", "strings": "texts", "text": "content",
              "number": "value", "nums": "values", "xs": "coefficients", "txt": "text", "grid": "matrix"}


def _edit_rename(full: str, fn: str, params: list[str], used: set[str]):
    old = params[0]
    new = _NEW_NAMES.get(old, f"{old}_value")
    if new in used:
        new = f"{old}_value"
    return (f"Rename the parameter `{old}` of `{fn}` to `{new}` in the signature and the body "
            "(change nothing else) and return the full function:", full)


def _edit_typehints(full: str, fn: str, params: list[str], used: set[str]):
    bare = strip_annotations(full)
    if bare is None or bare == full:
        return None
    return (f"Add type hints to every parameter and return value of `{fn}` (and of any other function "
            "here), change nothing else, and return the full code:", bare)


def _edit_validate(full: str, fn: str, params: list[str], used: set[str]):
    return (f"Extend `{fn}` with input validation: at the top of its body, raise a ValueError with a "
            f"clear message when `{params[0]}` is None. Keep everything else unchanged and return the "
            "full function:", full)


def _edit_class(full: str, fn: str, params: list[str], used: set[str]):
    if "Solution" in used:
        return None
    return (f"Move `{fn}` into a class `Solution` as a @staticmethod (imports stay at the top, the "
            "body unchanged) and return the full code:", full)


def _edit_rename_function(full: str, fn: str, params: list[str], used: set[str]):
    new = f"{fn}_v2"
    if new in used:
        return None
    return (f"Rename the function `{fn}` to `{new}`, also in the examples of its docstring, and "
            "return the full function:", full)


# (name, edit(full code, entry point, its parameters, identifiers in use) -> (instruction, code) or None)
EDIT_TEMPLATES = (
    ("rename", _edit_rename),
    ("typehints", _edit_typehints),
    ("validate", _edit_validate),
    ("class", _edit_class),
    ("rename-function", _edit_rename_function),
)
