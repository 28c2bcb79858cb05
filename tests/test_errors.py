"""One error mapping for both command lines (specviz and specviz.bench): injected exceptions, no models."""
import pytest
import torch

from specviz.bench import cli as bench_cli
from specviz.cli import main as cli
from specviz.errors import OOM_ADVICE, ModelError, RequestError, exit_code


def _raise(err):
    def command():
        raise err
    return command


@pytest.mark.parametrize("err, code, line", [
    (RequestError("γ must be 1..16"), 2, "error: γ must be 1..16"),
    (ModelError("no such model: x/y"), 2, "error: no such model: x/y"),
    (KeyboardInterrupt(), 130, "stopped"),
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"), 1, f"error: out of memory. {OOM_ADVICE}"),
    (MemoryError(), 1, f"error: out of memory. {OOM_ADVICE}"),
    (RuntimeError("[enforce fail] DefaultCPUAllocator: can't allocate: out of memory"), 1,
     f"error: out of memory. {OOM_ADVICE}"),
])
def test_exit_code_maps_to_one_line(capsys, err, code, line):
    assert exit_code(_raise(err)) == code
    out = capsys.readouterr()
    assert out.out == "" and out.err == line + "\n"


def test_exit_code_passes_result_and_bugs():
    assert exit_code(lambda: 0) == 0 and exit_code(lambda: 1) == 1
    with pytest.raises(ZeroDivisionError):
        exit_code(lambda: 1 / 0)


@pytest.mark.parametrize("main, target", [(cli.main, "_dispatch"), (bench_cli.main, "run_bench")])
@pytest.mark.parametrize("err, code", [(RequestError("bad"), 2), (ModelError("gone"), 2),
                                       (KeyboardInterrupt(), 130), (MemoryError(), 1)])
def test_both_mains_share_the_mapping(monkeypatch, capsys, main, target, err, code):
    module = cli if main is cli.main else bench_cli
    monkeypatch.setattr(module, target, lambda *a: _raise(err)())
    assert main(["generate", "--prompt", "hi"] if main is cli.main else []) == code
    err_text = capsys.readouterr().err
    assert len(err_text.splitlines()) == 1 and "Traceback" not in err_text


def test_sigterm_stops_a_command_with_one_line(capsys):
    """`timeout` around a CLI run (issue 26: `generate --engine vllm` ended with no row and no
    line): SIGTERM stops like Ctrl-C, `finally` blocks run, and one line says so."""
    import os
    import signal
    import time

    from specviz.errors import exit_code
    cleaned = []

    def command():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
            return 0
        finally:
            cleaned.append(True)  # e.g. the vLLM servers this run started are shut down
    assert exit_code(command) == 143 and cleaned
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("stopped: terminated (SIGTERM)")
