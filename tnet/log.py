"""tnet's one logging mechanism: Python `logging`, under the "tnet" logger.

Every message tnet writes (outside a CLI's documented output, such as
`tnet.train`'s final JSON line) goes to a logger named "tnet" or
"tnet.<part>" (`tnet.log.get("train")`). Each message carries its own
prefix (`tnet.train: ...`, `[tnet.checkpoint] ...`), so the console
handler writes the message alone: INFO and DEBUG lines to stdout,
WARNING and above to stderr (the streams looked up at each message, so
redirections and test captures see them).

Importing tnet installs that handler on the "tnet" logger, at INFO, and
stops the logger propagating to the root logger (so absl's handler, which
`python -m tnet.train` installs, does not print each line twice). To route
tnet's messages elsewhere: `logging.getLogger("tnet").handlers.clear()`
and set `propagate = True`, or add your own handler; `set_verbosity` (or
`logging.getLogger("tnet").setLevel`) chooses how much is said.

Every CLI takes `--verbosity` (absl's: -1 warnings and errors only, 0
info, the default, 1 debug) and, unless the environment sets
TF_CPP_MIN_LOG_LEVEL, hides TensorFlow's C++ start-up lines (see
`quiet_tensorflow`).
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
from typing import Iterator

LOGGER_NAME = "tnet"

# The CLIs whose process `python -m` starts (see quiet_tensorflow).
CLI_MODULES = ("tnet.train", "tnet.launch", "tnet.server",
               "tnet.serving.follow", "tnet.serving.checks")


class _ConsoleHandler(logging.Handler):
    """The message alone; INFO and below to stdout, WARNING and above to
    stderr; the stream looked up per message."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream = (sys.stderr if record.levelno >= logging.WARNING
                      else sys.stdout)
            stream.write(self.format(record) + "\n")
            stream.flush()
        except Exception:  # noqa: BLE001  (logging must never raise)
            self.handleError(record)


def get(name: str = "") -> logging.Logger:
    """The logger "tnet" or "tnet.<name>"."""
    return logging.getLogger(f"{LOGGER_NAME}.{name}" if name else LOGGER_NAME)


def install() -> None:
    """The console handler on the "tnet" logger (once per process)."""
    logger = logging.getLogger(LOGGER_NAME)
    # (By a mark, not the class: tnet.launch loads this file on its own.)
    if not any(getattr(h, "_tnet_console", False) for h in logger.handlers):
        handler = _ConsoleHandler()
        handler._tnet_console = True
        logger.addHandler(handler)
        logger.propagate = False
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.INFO)


def set_verbosity(verbosity: int) -> None:
    """absl's scale: -1 (or less) warnings and errors only, 0 info, 1 (or
    more) debug."""
    level = (logging.WARNING if verbosity < 0 else
             logging.INFO if verbosity == 0 else logging.DEBUG)
    if verbosity <= -2:
        level = logging.ERROR
    logging.getLogger(LOGGER_NAME).setLevel(level)


def add_verbosity_flag(parser) -> None:
    """`--verbosity` on an argparse CLI, as absl's flag of that name is on
    `tnet.train`."""
    parser.add_argument(
        "--verbosity", "-v", type=int, default=0,
        help="how much tnet logs: -1 warnings and errors only, 0 info "
             "(default), 1 debug")


# TensorFlow's start-up lines that no environment variable hides (written
# before its logging is initialized): held back while tnet imports it.
_STARTUP_CHATTER = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\) is called"
    r"|[IW]\d{4} [\d:. ]+\d+ (port|cudart_stub|cpu_feature_guard)\.cc:\d+\]"
    r"|E\d{4} [\d:. ]+\d+ cuda_platform\.cc:\d+\] failed call to cuInit"
    r"|To enable the following instructions: )")


@contextlib.contextmanager
def hold_startup_chatter(active: bool) -> Iterator[None]:
    """While tnet imports TensorFlow in one of its CLIs (`active`), stderr
    goes to a temporary file; afterwards every line of it is written back
    except TensorFlow's start-up chatter (`_STARTUP_CHATTER`), so an import
    error or any other message still shows. The devices are listed inside
    the window: TensorFlow probes CUDA then, and on a machine without a
    GPU writes "failed call to cuInit" as an error line (tnet's CLIs run
    on CPUs; a program of the user's that imports tnet still sees it)."""
    if not active:
        yield
        return
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):
        yield
        return
    held = tempfile.TemporaryFile()
    os.dup2(held.fileno(), 2)
    try:
        yield
        tf = sys.modules.get("tensorflow")
        if tf is not None:
            try:
                tf.config.list_physical_devices("GPU")
            except Exception:  # noqa: BLE001  (the probe is only for quiet)
                pass
    finally:
        try:
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        os.dup2(saved, 2)
        os.close(saved)
        held.seek(0)
        for line in held.read().decode("utf-8", "replace").splitlines(True):
            if not _STARTUP_CHATTER.match(line):
                sys.stderr.write(line)
        sys.stderr.flush()
        held.close()


def quiet_tensorflow() -> bool:
    """Hides TensorFlow's C++ start-up lines (oneDNN, CUDA probing) in a
    process started as one of tnet's CLIs, unless the user asked for
    TensorFlow's info lines (TF_CPP_MIN_LOG_LEVEL=0). Called when tnet is
    imported, which for `python -m tnet.<cli>` happens before TensorFlow
    is; a tnet imported as a library leaves TensorFlow's logging alone.
    Unset, the level becomes 2: C++ info and warning lines (CPU features,
    ...) hidden, errors kept. The lines TensorFlow 2.21 writes before its
    logging is initialized (oneDNN, "Could not find cuda drivers") ignore
    the variable: tnet holds them back while it imports TensorFlow
    (`hold_startup_chatter`), also where the level was already set (by
    tnet.launch for its tasks, or by this CLI before its bind re-exec).
    True when the CLI's quiet mode is on."""
    argv = list(getattr(sys, "orig_argv", []))
    if not ("-m" in argv[:-1] and argv[argv.index("-m") + 1] in CLI_MODULES):
        return False
    level = os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2").strip()
    return level not in ("", "0")
    argv = list(getattr(sys, "orig_argv", []))
    if "-m" in argv[:-1] and argv[argv.index("-m") + 1] in CLI_MODULES:
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
        return True
    return False
