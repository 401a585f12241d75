"""Handler references (``module:function``, or the ``Worker`` objects of a
module) resolved to functions, for ``wheelctl worker``."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from wheel.errors import InvalidArgument
from wheel.worker._api import RunContext
from wheel.worker._worker import Worker

__all__ = ["load_handler", "load_handlers"]


def load_handler(spec: str) -> tuple[str, Callable[[RunContext], Any]]:
    """Resolve ``"pkg.mod:func"`` or ``"name=pkg.mod:func"`` to (name, function).

    The name defaults to the function's ``__name__``; ``func`` may be dotted
    (``pkg.mod:Class.method``).
    """
    name, module_name, attr = _parse(spec)
    if not attr:
        raise InvalidArgument(
            "handler", f"{spec!r} is not 'module:function' or 'name=module:function'"
        )
    obj = _resolve(spec, module_name, attr)
    if not callable(obj):
        raise InvalidArgument("handler", f"{spec!r} is not callable")
    return name or getattr(obj, "__name__", attr.rsplit(".", 1)[-1]), obj


def load_handlers(spec: str) -> list[tuple[str, Callable[[RunContext], Any]]]:
    """The handlers ``spec`` names, as (name, function) pairs, for
    ``wheelctl worker``:

    - ``module:function`` or ``name=module:function``: that function (see
      ``load_handler``);
    - ``module:worker``: every handler registered on that ``Worker`` object
      (``@worker.handler``), under the names it registered;
    - ``module``: every handler of every ``Worker`` object at the top level
      of the module: a module declares its handlers by building a ``Worker``
      and registering them on it.

    Only the handlers are taken: where to connect, the capacity and the pools
    come from the caller (``wheelctl worker``'s flags), not from the object.
    """
    name, module_name, attr = _parse(spec)
    if not attr:
        if name:
            raise InvalidArgument(
                "handler", f"{spec!r}: a name= goes with one function, 'name=module:function'"
            )
        module = _import(module_name)
        workers = [v for v in vars(module).values() if isinstance(v, Worker)]
        found = [pair for w in workers for pair in w.handlers.items()]
        if not found:
            raise InvalidArgument(
                "handler",
                f"module {module_name!r} declares no handlers: build a wheel.worker.Worker in it"
                " and register them with @worker.handler(), or give module:function",
            )
        return found
    obj = _resolve(spec, module_name, attr)
    if isinstance(obj, Worker):
        if name:
            raise InvalidArgument(
                "handler", f"{spec!r}: a Worker's handlers keep the names they registered"
            )
        if not obj.handlers:
            raise InvalidArgument("handler", f"{spec!r} is a Worker with no handler registered")
        return list(obj.handlers.items())
    if not callable(obj):
        raise InvalidArgument(
            "handler",
            f"{spec!r} is a {type(obj).__name__}, not a function or a wheel.worker.Worker",
        )
    return [(name or getattr(obj, "__name__", attr.rsplit(".", 1)[-1]), obj)]


def _parse(spec: str) -> tuple[str, str, str]:
    """(name, module, attribute) of ``[name=]module[:attribute]``."""
    name, sep, ref = spec.partition("=")
    if not sep or ":" in name:
        name, ref = "", spec
    module_name, colon, attr = ref.partition(":")
    if not module_name or (colon and not attr):
        raise InvalidArgument(
            "handler", f"{spec!r} is not 'module:function' or 'name=module:function'"
        )
    return name, module_name, attr


def _import(module_name: str) -> Any:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module_name + ".").startswith(exc.name + "."):
            raise InvalidArgument(
                "handler",
                f"cannot import {module_name!r}: no module named {exc.name!r} in the working"
                " directory or on sys.path",
            ) from exc
        raise InvalidArgument(
            "handler", f"importing {module_name!r} failed: {type(exc).__name__}: {exc}"
        ) from exc
    except Exception as exc:  # the module's own code raised
        raise InvalidArgument(
            "handler", f"importing {module_name!r} failed: {type(exc).__name__}: {exc}"
        ) from exc


def _resolve(spec: str, module_name: str, attr: str) -> Any:
    obj: Any = _import(module_name)
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise InvalidArgument("handler", f"{module_name!r} has no attribute {attr!r}") from None
    return obj
