"""Errors whose message is meant for the person who caused them, and the one
place that recognises running out of memory and says so."""
from __future__ import annotations

import sys
from typing import Callable

OOM_LOADING = "out of memory on this machine, try a smaller pair"
OOM_ADVICE = "Try fewer new tokens, a shorter prompt, a smaller γ or a smaller model pair."


class RequestError(ValueError):
    """Bad input, with a message meant for the person who typed it."""


class ModelError(Exception):
    """A message a visitor understands (one line, names the missing package/path/id)."""


def is_oom(err: BaseException) -> bool:
    """Out of memory, from torch (CPU or GPU), Python, or a library that only says so in words."""
    import torch
    return isinstance(err, (torch.OutOfMemoryError, MemoryError)) or "out of memory" in str(err).lower()


def first_line(err: BaseException) -> str:
    """The first line of the message, or the exception's type name when it has none."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def load_error_text(err: BaseException) -> str:
    """A failed model load, for the page's loader."""
    if isinstance(err, ModelError):
        return str(err).strip()
    if is_oom(err):
        return "out of memory while loading the models: try a smaller pair"
    return f"could not load the models: {first_line(err)}"


def run_error_text(err: BaseException) -> str:
    """A failed run, for the page (the server keeps running)."""
    if is_oom(err):
        return f"The run ran out of memory. {OOM_ADVICE} The app is still running."
    return f"The run failed: {first_line(err)}. The app is still running; try again or change the settings."


class Terminated(KeyboardInterrupt):
    """SIGTERM (`timeout`, `kill`, a supervisor), raised in the main thread like Ctrl-C."""


def _on_sigterm(signum, frame):
    raise Terminated


def exit_code(command: Callable[[], int]) -> int:
    """Run a command-line entry point: a visitor's mistake, a stop or running out of memory become
    one line on stderr and an exit code (2, 130, 1); bugs still raise with their traceback.
    SIGTERM stops like Ctrl-C: `finally` blocks run (vLLM / llama.cpp servers a run started are
    shut down, not left holding memory) and the reason is printed (a `timeout` around
    `generate --engine vllm` used to end it with no row and no line)."""
    import signal
    import threading
    main = threading.current_thread() is threading.main_thread()
    before = signal.signal(signal.SIGTERM, _on_sigterm) if main else None
    try:
        return command()
    except (RequestError, ModelError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Terminated:
        print("stopped: terminated (SIGTERM) before the run finished; rows already printed are complete",
              file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - out of memory: one line, not a traceback; bugs still raise
        if not is_oom(e):
            raise
        print(f"error: out of memory. {OOM_ADVICE}", file=sys.stderr)
        return 1
    finally:
        if main:
            signal.signal(signal.SIGTERM, before)


def free_memory() -> None:
    """After an out-of-memory error: drop what the failed run held."""
    import gc

    import torch
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
