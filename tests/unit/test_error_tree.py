"""One exception tree (``gnomon.core.errors``): every exception class defined in
``gnomon`` derives from ``GnomonError``, except the few that are control flow, listed
here with why. A new exception outside the tree fails this test until it joins the tree
or is listed."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import gnomon
from gnomon.core.errors import GnomonError, InfraError, InternalError

# module:class -> why it is not an error of the tree
CONTROL_FLOW = {
    "gnomon.codec._fastwrite:Unsupported": "the compiled writer's signal to fall back to fastavro",
    "gnomon.codec._codec:_FetchFailed": "the reason a schema fetch failed, carried to the DecodeError decode raises",
    "gnomon.processor.savepoint:RecordTooLarge": "must not be a GnomonError: the savepoint turns it into "
                                                 "RecordFailed (a poison record), not a refusal",
    "gnomon.ui.routes:PageError": "the UI renders it as a page",
    "gnomon.ui.routes:SignInNeeded": "the UI redirects to its sign-in",
    "gnomon.web.problems:Unauthorized": "an HTTP answer (401), raised to leave a handler",
    "gnomon.web.problems:Forbidden": "an HTTP answer (403), raised to leave a handler",
    "gnomon.web.problems:TooLarge": "an HTTP answer (413), raised to leave a handler",
    "gnomon.web.problems:Pending": "an HTTP answer (202 with a Location), raised to leave a handler",
}


def _exceptions() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(gnomon.__path__, "gnomon."):
        if info.name.endswith("__main__"):
            continue
        mod = importlib.import_module(info.name)
        for name, obj in vars(mod).items():
            if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == mod.__name__:
                found[f"{mod.__name__}:{name}"] = obj
    return found


def test_every_exception_of_gnomon_is_in_the_tree_or_listed_as_control_flow() -> None:
    found = _exceptions()
    outside = {k for k, cls in found.items() if not issubclass(cls, GnomonError)}
    assert outside == set(CONTROL_FLOW), (
        f"outside the tree and not listed: {sorted(outside - set(CONTROL_FLOW))}; "
        f"listed but gone or now in the tree: {sorted(set(CONTROL_FLOW) - outside)}")


def test_operating_errors_hang_under_infra_and_packaging_under_internal() -> None:
    found = _exceptions()
    for name in ("gnomon.credentials:CredentialError", "gnomon.outbound.secrets:SecretError",
                 "gnomon.worker.sandbox:SandboxError"):
        assert issubclass(found[name], InfraError), name
    assert issubclass(found["gnomon.codec.registry:RegistryError"], InternalError)
