"""What the `pulseio` and `pulseio-engine` command lines share: a parser whose every error is one line
(`<prog>: error: <what>, got <value>; <the fix>`), option types that check values as they are parsed,
and `run_command`, which turns any exception a user can cause into that one line (`--debug` shows
the traceback instead)."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

DEBUG_HELP = "show the Python traceback of an error instead of one line"


class UsageError(Exception):
    """A command-line value breaks a rule; `prog` is the (sub)command that found it."""

    def __init__(self, prog: str, message: str) -> None:
        super().__init__(message)
        self.prog = prog


class _DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows the default of options that take a value (not of flags, nor a default of None)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.nargs == 0 or action.default is None:
            return action.help
        return super()._get_help_string(action)


class OneLineParser(argparse.ArgumentParser):
    """argparse, with help showing every default and errors raised as UsageError (no usage dump)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("formatter_class", _DefaultsFormatter)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(self.prog, f"{message}; see `{self.prog} --help`")


def run_command(prog: str, parser: argparse.ArgumentParser, argv: list[str] | None,
                command: Callable[[argparse.Namespace], int]) -> int:
    """Parse, then run `command`; every failure becomes one line on stderr and exit code 2
    (1 is left to the command, 130 to Ctrl-C). With `--debug` errors raise as they are.
    A subcommand may name itself in errors with `set_defaults(prog=...)`."""
    try:
        args = parser.parse_args(argv)
    except UsageError as exc:
        return _fail(exc.prog, str(exc))
    try:
        return command(args)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except UsageError as exc:
        if args.debug:
            raise
        return _fail(exc.prog, str(exc))
    except Exception as exc:  # the CLI boundary: nothing a user types may end in a traceback
        if args.debug:
            raise
        return _fail(getattr(args, "prog", prog), describe(exc))


def describe(exc: BaseException) -> str:
    """An exception as one line; a type the code does not raise on purpose is named as such."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, (ValueError, OSError, ImportError, MemoryError, LookupError)) or _is_ours(exc):
        return text
    return f"{text} ({type(exc).__name__}: unexpected here; rerun with --debug for the traceback and report it)"


def _is_ours(exc: BaseException) -> bool:
    return type(exc).__module__.split(".")[0] in ("pulseio", "pulseio_engine")


def _fail(prog: str, message: str) -> int:
    print(f"{prog}: error: {message}", file=sys.stderr)
    return 2


# ---- option types: each raises ArgumentTypeError with the rule and the fix; argparse adds the option


def int_at_least(low: int, fix: str = "") -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text.replace("_", ""))
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}{'; ' + fix if fix else ''}")
        return value

    parse.__name__ = f"integer >= {low}"
    return parse


def float_at_least(low: float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
        if not value >= low:  # also refuses nan
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {text}")
        return value

    parse.__name__ = f"number >= {low}"
    return parse


def int_list(low: int, multiple_of: int = 1) -> Callable[[str], tuple[int, ...]]:
    """A non-empty comma- or space-separated list of whole numbers >= low (and multiples of `multiple_of`)."""

    def parse(text: str) -> tuple[int, ...]:
        items = text.replace(",", " ").split()
        if not items:
            raise argparse.ArgumentTypeError(f"needs at least one number, got {text!r}")
        values = []
        for item in items:
            try:
                values.append(int(item.replace("_", "")))
            except ValueError:
                raise argparse.ArgumentTypeError(f"must be whole numbers, got {item!r} in {text!r}") from None
        for value in values:
            if value < low or value % multiple_of:
                rule = f">= {low}" + (f" and a multiple of {multiple_of}" if multiple_of > 1 else "")
                raise argparse.ArgumentTypeError(f"every value must be {rule}, got {value} in {text!r}")
        return tuple(values)

    parse.__name__ = "list of integers"
    return parse


def non_empty_text(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError(f"must not be empty, got {text!r}")
    return text


def choice_list(allowed: tuple[str, ...]) -> Callable[[str], tuple[str, ...]]:
    """A non-empty comma-separated subset of `allowed`."""

    def parse(text: str) -> tuple[str, ...]:
        items = [x.strip() for x in text.split(",") if x.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"needs at least one of {', '.join(allowed)}, got {text!r}")
        for item in items:
            if item not in allowed:
                raise argparse.ArgumentTypeError(f"{item!r} is not one of {', '.join(allowed)} (got {text!r})")
        return tuple(dict.fromkeys(items))

    parse.__name__ = "comma-separated list"
    return parse


def device_name(allow_auto: bool) -> Callable[[str], str]:
    """'cpu', 'cuda' or 'cuda:N' (and 'auto' where allowed); whether the GPU exists is checked by `require_device`."""
    names = ("auto", "cpu", "cuda", "cuda:N") if allow_auto else ("cpu", "cuda", "cuda:N")

    def parse(text: str) -> str:
        ok = text in names[:-1] or (text.startswith("cuda:") and text[5:].isdigit())
        if not ok:
            raise argparse.ArgumentTypeError(f"must be one of {', '.join(names)}, got {text!r}")
        return text

    parse.__name__ = "device"
    return parse


def require_device(prog: str, device: str) -> str:
    """Resolve 'auto' and check that a CUDA device exists; raises UsageError naming the fix."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        return device
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index = int(device[5:]) if ":" in device else 0
    if index >= count:
        seen = "torch sees no CUDA GPU" if count == 0 else f"torch sees {count} CUDA GPU(s), cuda:0..cuda:{count - 1}"
        build = "" if torch.version.cuda else f" (this torch {torch.__version__} is a CPU-only build)"
        raise UsageError(prog, f"--device {device} needs that GPU, but {seen}{build}; use --device cpu")
    return device


def progress_enabled(requested: bool) -> bool:
    """Progress bars only where a person watches: stderr is a terminal and not turned off."""
    return requested and sys.stderr.isatty() and not os.environ.get("PULSEIO_NO_PROGRESS")


def check_writable(prog: str, option: str, path: Path) -> None:
    """Refuse, before any work, an output path that cannot be written (its folders may not exist yet).

    Permission bits are not enough (root passes every `os.access` check, and /proc or a read-only mount
    refuse files whatever the bits say), so this tries: it opens an existing file for appending (its
    contents untouched), or creates and removes a file in the nearest folder that exists."""
    if path.is_dir():
        raise UsageError(prog, f"{option} {path} is a directory; pass a file path you can write")
    if path.exists():
        try:
            with open(path, "ab"):
                pass
        except OSError as exc:
            raise UsageError(prog, f"{option} {path} cannot be written ({exc.strerror}); "
                                   "pass a path you can write") from None
        return
    parent = path.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise UsageError(prog, f"{option} {path} cannot be written: {parent} is a file, not a folder; "
                               "pass a path you can write")
    try:
        fd, probe = tempfile.mkstemp(dir=parent, prefix=".pulseio-write-check-")
    except OSError as exc:
        raise UsageError(prog, f"{option} {path} cannot be written: {parent} takes no new files "
                               f"({exc.strerror}); pass a path you can write") from None
    os.close(fd)
    os.unlink(probe)
