"""The grounded code tasks' source edits: signatures and docstrings only, the rest verbatim."""
from specviz.code_transforms import strip_annotations, strip_docstrings, two_space_indent

NESTED = '''def outer(x: int) -> int:
    """Outer doc."""
    def inner(
        y: int,
    ) -> int:
        # kept
        """Inner
        doc."""
        return y
    return inner(x)'''


def test_strip_annotations():
    assert strip_annotations(NESTED) == NESTED.replace("x: int) -> int", "x)").replace(
        "inner(\n        y: int,\n    ) -> int:", "inner(y):")
    assert strip_annotations("def f(a, b):\n    return a") == "def f(a, b):\n    return a"  # nothing to strip
    assert strip_annotations("x = 1") == "x = 1"
    assert strip_annotations("async def g(*a: int, k: float = 1.0, **kw: str) -> None:\n    pass") == \
        "async def g(*a, k=1.0, **kw):\n    pass"


def test_strip_annotations_refuses():
    for code in ["@dec\ndef f(a: int):\n    return a", "def f(a: int): return a", "def broken(:"]:
        assert strip_annotations(code) is None


def test_strip_docstrings():
    out = strip_docstrings(NESTED)
    assert "doc" not in out and "# kept" in out and out.count("\n") == NESTED.count("\n") - 3
    assert strip_docstrings('def f():\n    """only a docstring"""') is None  # the body would be empty
    assert strip_docstrings("def f():\n    return 1") is None
    assert strip_docstrings("def broken(:") is None


def test_two_space_indent():
    assert two_space_indent("def f():\n    if x:\n        return 1") == "def f():\n  if x:\n    return 1"
    assert two_space_indent("x = 1") is None
