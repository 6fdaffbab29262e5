"""Shared CLI plumbing: one-line errors with the right exit code, JSON output."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import typer
from rich.console import Console

from gnomon.core.errors import GnomonError, ValidationError

console = Console()
err_console = Console(stderr=True)

EXIT_USAGE = 2  # bad input: the user can fix it
EXIT_FAILURE = 1  # something else went wrong


def fail(message: str, code: int = EXIT_FAILURE) -> NoReturn:
    err_console.print(f"gnomon: {message}", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(code)


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn gnomon's errors into one readable line and an exit code (2 = bad input)."""
    from gnomon.client import ApiError, ApiUnavailable

    try:
        yield
    except ValidationError as exc:
        fail(f"{exc.field}: {exc.message}", EXIT_USAGE)
    except ApiError as exc:
        fail(str(exc), EXIT_USAGE if 400 <= exc.status < 500 else EXIT_FAILURE)
    except ApiUnavailable as exc:
        fail(f"{exc} (is `gnomon api` or `gnomon dev` running?)")
    except GnomonError as exc:
        fail(str(exc))


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True) + "\n")


def command(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator: run the command body inside ``user_errors``."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with user_errors():
            return fn(*args, **kwargs)

    return wrapper
