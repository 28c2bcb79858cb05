"""The benchmark: methods x prompt sets x repeats, interleaved in one process.
`python -m specviz bench --help`.

settings.py  presets, Settings, prompts      runs.py     Variant, Run, measure, output check
hf.py        Hugging Face generate runs      summary.py  medians per task / prompt
report.py    table, header, CSV              plots.py    plotly charts, PNG/SVG via kaleido
cli/main.py       the command (run_bench, main)   ui_overhead.py  engine speed with the page streaming
"""
from .cli import main, run_bench
from .runs import RUN_COLUMNS, OutputMismatch, Run, Variant, check_outputs, first_difference
from .summary import SUMMARY_COLUMNS

__all__ = ["RUN_COLUMNS", "SUMMARY_COLUMNS", "OutputMismatch", "Run", "Variant", "check_outputs",
           "first_difference", "main", "run_bench"]
