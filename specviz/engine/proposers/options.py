"""A method's settings, each declared once as an `Option` in the method's own
file (`register(..., options=(...))`). From these declarations come the CLI
flags (cli.py), the page's "Method settings" controls (ui/method_options.py),
request validation (MethodSpec.check_options), what traces record and the run
header's "shape 4-2-2-1 · budget 8".
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ...errors import RequestError

INT, TEXT, FLAG = "int", "text", "flag"


@dataclass(frozen=True)
class Option:
    name: str  # the RunRequest.options key; the CLI flag is --name-with-dashes
    label: str  # the page control's label, and the subject of its error messages
    help: str  # the CLI's --help and the page's tooltip: what it does, and its default
    type: str = INT  # INT: a whole number in [lo, hi]; TEXT: `parse` reads it; FLAG: on/off
    lo: int = 1
    hi: int | None = None
    default: object = None  # a blank means this; None: the method decides (dynamic tree, calibrated layer)
    keep: bool = False  # a blank is recorded as `default` in the request (and its trace), else left out
    parse: Callable | None = None  # TEXT: value -> checked value, RequestError in the visitor's words
    short: str = ""  # in the run header: "shape 4-2-2-1"
    show: Callable | None = None  # a checked list of ints as the run header writes it (default "4-2-2-1")
    slider: bool = False  # the page shows a slider (at `default`), else a text box (blank = default)
    placeholder: str = ""
    page: bool = True  # False: never on the page (rest's datastore: a visitor must not pick server files)
    cli: bool = True  # False: API and bench only (early-exit's kv_reuse)

    @property
    def flag(self) -> str:
        return f"--{self.name.replace('_', '-')}"

    def check(self, value):
        """`value` as the method reads it; RequestError naming this option if it is not one."""
        if self.type == INT:
            return self._whole(value)
        if self.type == FLAG:
            if value not in (True, False, "on", "off", 0, 1):
                raise RequestError(f"{self.label} must be on or off, not {value!r}.")
            return value in (True, "on", 1)
        return self.parse(value) if self.parse is not None else value

    def _whole(self, value) -> int:
        try:
            if isinstance(value, bool):
                raise TypeError
            x = int(float(value))
            if x != float(value):
                raise ValueError
        except (TypeError, ValueError, OverflowError):
            raise RequestError(f"{self.label} must be a whole number, got {value!r}.") from None
        if x < self.lo or (self.hi is not None and x > self.hi):
            span = f"between {self.lo} and {self.hi}" if self.hi is not None else f"of at least {self.lo}"
            raise RequestError(f"{self.label} must be a whole number {span}, got {value!r}.")
        return x


def blank(value) -> bool:
    """None, "", "  " or [] (an API caller's empty tree shape): the default."""
    return value is None or (isinstance(value, str) and value.strip() == "") or value in ([], ())


def check_options(declared: tuple[Option, ...], options: dict) -> dict:
    """Each declared option checked (blank: its default, or left out); keys a
    method does not declare pass through unchanged, as before."""
    out = dict(options)
    for opt in declared:
        value = out.get(opt.name)
        if not blank(value):
            out[opt.name] = opt.check(value)
        elif opt.keep:
            out[opt.name] = opt.default
        else:
            out.pop(opt.name, None)
    return out
