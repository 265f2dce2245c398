"""How every command ends on bad input or a fault: one line on stderr that names the file, field and value,
exit status 2, and nothing half-written left behind (the writers clean up, SIGTERM included)."""

from __future__ import annotations

import argparse
import errno
import os
import re
import sys

from dllm_offload_sim.traces.atomic import exit_on_sigterm
from dllm_offload_sim.traces.errors import TraceError

USAGE_ERROR = 2


def describe_os_error(e: OSError) -> str:
    """An OS error as a user reads it: the path, what went wrong, and that nothing was left half-written."""
    where = f"{e.filename}: " if e.filename else ""
    if e.errno == errno.ENOSPC:
        return (
            f"{where}no space left on device; nothing half-written was kept, free some space and run it again"
        )
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"{where}not writable ({e.strerror})"
    return f"{where}{e.strerror or e}"


def missing_extra(prog: str, module: str, extra: str) -> str:
    """The message for a command whose optional dependency ``module`` is not installed: which extra installs it, in
    the wheel's terms and a checkout's."""
    return (
        f"error: {prog} needs {module}, which the '{extra}' extra installs: pip install 'dllm-offload-sim[{extra}]' "
        f"(in a checkout: pip install -e '.[{extra}]'; on a GPU host, the torch build of its CUDA first)"
    )


def run_cli(main, argv=None) -> int:
    """Run a command's ``main(argv)``: a project error (bad trace, profile, config or policy, a ValueError
    naming the bad value) or an OS error (a full disk, a missing or unwritable path) becomes one ``error:``
    line and exit 2; Ctrl-C exit 130; SIGTERM exit 143 after the writers' clean-up. ``DLLM_DEBUG=1`` shows
    the traceback instead."""
    try:
        with exit_on_sigterm():
            return main(argv)
    except KeyboardInterrupt:
        print("interrupted; nothing half-written was kept", file=sys.stderr)
        return 130
    except (TraceError, ValueError, OSError) as e:
        if os.environ.get("DLLM_DEBUG"):
            raise
        msg = describe_os_error(e) if isinstance(e, OSError) else str(e)
        print(f"error: {msg}", file=sys.stderr)
        return USAGE_ERROR


def entry_point(main):
    """A console entry point for a command's ``main(argv)``: runs it through :func:`run_cli` and exits with its status."""

    def cli() -> None:
        sys.exit(run_cli(main))

    cli.__doc__ = f"Console entry point of {main.__module__}."
    return cli


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (``--requests 0`` or ``--jobs 0`` is refused, not read as "all")."""
    return _bounded_int(text, 1)


def non_negative_int(text: str) -> int:
    return _bounded_int(text, 0)


def non_negative_float(text: str) -> float:
    """argparse type: a finite number >= 0 (``--tolerance -1`` is refused)."""
    import argparse
    import math

    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text!r}") from None
    if not math.isfinite(v) or v < 0:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text!r}")
    return v


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0 (``--budget-s -1`` or ``0`` is refused, not read as "no limit")."""
    import argparse

    v = non_negative_float(text)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}")
    return v


def _bounded_int(text: str, minimum: int) -> int:
    import argparse

    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {text!r}") from None
    if v < minimum:
        raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {v}")
    return v


_ROLE = re.compile(r":(?:func|class|meth|mod|data|attr|obj):`~?([^`]+)`")


def plain_text(text: str) -> str:
    """Docstring markup (``code``, :func:`name`) as plain text, for a terminal."""
    return _ROLE.sub(r"\1", text).replace("``", "")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The commands' ``--help``: descriptions kept as written (their docstrings), markup shown as plain text."""

    def format_help(self) -> str:
        return plain_text(super().format_help())
