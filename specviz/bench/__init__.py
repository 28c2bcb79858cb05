"""The benchmark: methods x prompt sets x repeats, interleaved in one process.
`python -m specviz.bench --help`."""
from .core import *  # noqa: F401,F403
from .core import OutputMismatch, Run, check_outputs, first_difference, main  # noqa: F401
