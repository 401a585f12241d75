"""``wheel.client``'s public surface is its own: no signature, return type or
dataclass field of it names a type from the engine, the gRPC layer or
protobuf, and its words say what the engine's say."""

from __future__ import annotations

import collections.abc
import dataclasses
import datetime
import enum
import inspect
import types
import typing
from typing import Any, TypedDict, get_args, get_origin, get_type_hints

import pytest

import wheel.client
from wheel.engine import model
from wheel.engine import spec as engine
from wheel.rpc.v1 import jobs_pb2

# Where a type in the public surface may come from (``wheel.tls._security``: the
# channel security every SDK shares; ``wheel.codec``: the payload codec the
# client, the worker and the outbox share).
ALLOWED_MODULES = {
    "builtins",
    "datetime",
    "typing",
    "collections.abc",
    "types",
    "wheel.codec",
    "wheel.errors",
    "wheel.tls._security",
}


def _foreign(tp: Any, seen: set[int], own: tuple[str, ...] = ("wheel.client",)) -> set[str]:
    """The types named in annotation ``tp`` that come from outside the allowed
    modules, following unions, generics, and the fields of the TypedDicts and
    dataclasses of the modules in ``own``."""
    if id(tp) in seen or tp is None or tp is type(None) or tp is Any or tp is Ellipsis:
        return set()
    seen.add(id(tp))
    out: set[str] = set()
    if get_origin(tp) is not None:  # X | Y, list[X], Iterator[X], Unpack[X]...
        for arg in get_args(tp):
            out |= _foreign(arg, seen, own)
        origin = get_origin(tp)
        return out | (_foreign(origin, seen, own) if isinstance(origin, type) else set())
    if isinstance(tp, types.UnionType):
        for arg in get_args(tp):
            out |= _foreign(arg, seen, own)
        return out
    if not isinstance(tp, type):
        return {repr(tp)} if not isinstance(tp, typing.TypeVar) else set()
    module = tp.__module__
    if module.startswith(own):
        if typing.is_typeddict(tp) or dataclasses.is_dataclass(tp):
            for hint in get_type_hints(tp).values():
                out |= _foreign(hint, seen, own)
        return out
    if module not in ALLOWED_MODULES:
        out.add(f"{module}.{tp.__qualname__}")
    return out


def public_types() -> dict[str, set[str]]:
    """Per public name (and public method), the foreign types it names."""
    found: dict[str, set[str]] = {}
    for name in wheel.client.__all__:
        obj = getattr(wheel.client, name)
        seen: set[int] = set()
        if inspect.isclass(obj) and not issubclass(obj, enum.Enum):
            hints: dict[str, Any] = {}
            if dataclasses.is_dataclass(obj) or typing.is_typeddict(obj):
                hints.update(get_type_hints(obj))
            for attr, member in vars(obj).items():
                if callable(member) and (not attr.startswith("_") or attr == "__init__"):
                    for key, hint in get_type_hints(member).items():
                        hints[f"{attr}.{key}"] = hint
            found[name] = set().union(*(_foreign(h, seen) for h in hints.values()))
        elif callable(obj) and not inspect.isclass(obj):
            found[name] = set().union(*(_foreign(h, seen) for h in get_type_hints(obj).values()))
        else:  # a type alias (When, Duration, Payload, Schedule) or a constant
            found[name] = _foreign(obj, seen) if not isinstance(obj, str) else set()
    return found


def test_no_public_signature_or_field_names_an_engine_or_protobuf_type() -> None:
    found = public_types()
    # The walk reached the calls and the values they return.
    assert {"Client", "AsyncClient", "Job", "Run", "Status", "JobArgs"} <= found.keys()
    assert {name: bad for name, bad in found.items() if bad} == {}


def test_the_check_sees_an_engine_type_wherever_it_hides() -> None:
    class Leaky(TypedDict):
        spec: list[engine.JobSpec] | None

    @dataclasses.dataclass
    class Holder:
        state: collections.abc.Iterator[dict[str, model.JobState]]

    def returns(x: datetime.datetime) -> typing.Unpack[Leaky]:  # type: ignore[valid-type]
        raise NotImplementedError

    own = ("wheel.client", __name__)
    assert _foreign(Leaky, set(), own) == {"wheel.engine.spec.JobSpec"}
    assert _foreign(Holder, set(), own) == {"wheel.engine.model.JobState"}
    returned = get_type_hints(returns, localns={"Leaky": Leaky})["return"]
    assert _foreign(returned, set(), own) == {"wheel.engine.spec.JobSpec"}
    assert _foreign(jobs_pb2.Job, set()) == {"wheel.rpc.v1.jobs_pb2.Job"}


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (wheel.client.JobState, model.JobState),
        (wheel.client.MissedReason, model.MissedReason),
        (wheel.client.AlertKind, model.AlertKind),
        (wheel.client.CatchUpMode, engine.CatchUpMode),
        (wheel.client.OverlapPolicy, engine.OverlapPolicy),
        (wheel.client.DstGap, engine.DstGap),
        (wheel.client.DstFold, engine.DstFold),
    ],
)
def test_the_client_words_are_the_engine_words(
    ours: type[enum.StrEnum], theirs: type[enum.StrEnum]
) -> None:
    assert [m.value for m in ours] == [m.value for m in theirs]


def test_run_states_are_the_engine_states_and_missed() -> None:
    ours = [m.value for m in wheel.client.RunState]
    assert ours == [m.value for m in model.RunState] + ["missed"]


def test_submit_keywords_are_the_fields_of_a_job_request() -> None:
    fields = {f.name: f for f in dataclasses.fields(wheel.client.JobRequest)}
    args = get_type_hints(wheel.client.JobArgs)
    assert args.keys() == fields.keys()
    hints = get_type_hints(wheel.client.JobRequest)
    assert {k: v for k, v in args.items()} == hints
    assert wheel.client.JobArgs.__required_keys__ == {
        name for name, f in fields.items() if f.default is dataclasses.MISSING
    }


def test_the_async_client_has_the_calls_of_the_blocking_one() -> None:
    def calls(cls: type) -> dict[str, inspect.Signature]:
        return {
            name: inspect.signature(fn)
            for name, fn in vars(cls).items()
            if callable(fn) and not name.startswith("_")
        }

    sync, aio = calls(wheel.client.Client), calls(wheel.client.AsyncClient)
    assert sync.keys() == aio.keys()
    for name, sig in sync.items():
        assert list(sig.parameters.values()) == list(aio[name].parameters.values()), name
    hints = get_type_hints(wheel.client.AsyncClient.jobs)
    assert get_origin(hints["return"]) is collections.abc.AsyncIterator
