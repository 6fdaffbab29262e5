"""Shared CLI plumbing: one-line errors with the right exit code, JSON output."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.text import Text

from gnomon.core.errors import GnomonError, ValidationError

console = Console()
err_console = Console(stderr=True)

EXIT_USAGE = 2  # bad input: the user can fix it
EXIT_FAILURE = 1  # something else went wrong

# Imported only by the processor, the API, the projector and `gnomon infra`: installed by
# gnomon[server], absent from a worker-only install (gnomon[worker]).
SERVER_ONLY_MODULES = frozenset({"cassandra", "fastapi", "pydantic", "rocksdict", "starlette", "uvicorn"})


# Characters a terminal acts on instead of showing: C0/C1 controls (ESC starts escape
# sequences that recolour, move the cursor, set the title or hyperlinks), DEL, line
# separators and the bidi overrides/isolates that make text display reordered.
_UNPRINTABLE_RE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def clean(value: Any) -> str:
    """``value`` as one printable line: every control or bidi character is shown as its
    escape (``\\x1b``, ``\\u202e``) instead of reaching the terminal. Job data (names,
    errors, log lines) is another tenant's or a program's text, not ours to execute."""
    text = value if isinstance(value, str) else str(value)
    return _UNPRINTABLE_RE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def safe(value: Any, style: str = "") -> Text:
    """``clean(value)`` as a rich Text: rendered literally, never parsed as [markup]."""
    return Text(clean(value), style=style)


def fail(message: str, code: int = EXIT_FAILURE) -> NoReturn:
    err_console.print(f"gnomon: {clean(message)}", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def require_server_extra(command: str, *modules: str) -> None:
    """Refuse to start ``command`` (exit 2, naming the extra) when one of the server-only
    ``modules`` is not installed. They are imported late (rocksdict when a partition is
    assigned, the Cassandra driver when connecting), so without this check a worker-only
    install would start a processor that joins the group and then fails."""
    import importlib.util

    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        fail(f"`gnomon {command}` needs gnomon's server extra: pip install 'gnomon[server]' "
             f"({', '.join(missing)} not installed)", EXIT_USAGE)


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
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] not in SERVER_ONLY_MODULES:
            raise
        fail(f"this command needs gnomon's server extra: pip install 'gnomon[server]' ({exc})", EXIT_USAGE)


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
