"""Profiles: what jobs share, interned once, so that a job at rest is a few
integers.

A job's spec splits in three:

- its **profile**: everything that decides how it runs -- the schedule's
  shape (a cron expression with its zone and DST policies, an interval's
  period and mode, or "once"), handler, pool, tenant, jitter, and the
  catch-up, overlap, retry, timeout and side-effect policies, its
  priority, and the schedule's bounds (active from, active until, max
  fires). Ten million
  jobs typically share a handful of these.
- its **schedule parameter**: the one instant of the schedule that is the
  job's own (a one-shot's ``at``, an interval's ``start_at``; 0 for cron).
- its **name and payload**, which the owner never needs: the store keeps them,
  and a run's payload is read with the claim that dispatches it.

A profile is identified by a digest of its canonical JSON (``profile_id``),
the same in every process and every store, so a profile needs no round trip
to be named and a checkpoint or a load can refer to it by id. The store keeps
each profile's body once (``job_profiles``); the owner keeps each profile it
has jobs of once (``Profiles``), with the spec template every awake job of it
shares.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace

from wheel.engine.spec import Cron, Interval, JobSpec, Once, Schedule

__all__ = ["Profile", "Profiles", "join_spec", "profile_of", "split_spec"]

# A profile's template stands for every job of it: no name, no payload, and
# the schedule's own instant zeroed (the job's parameter holds it).
_NAME = ""
_PAYLOAD = b""


@dataclass(frozen=True, slots=True)
class Profile:
    """An interned profile: its id (a digest of ``body``), its canonical JSON,
    and the spec template its jobs share (name and payload empty, the
    schedule's instant 0)."""

    profile_id: int
    body: str
    template: JobSpec
    # The spec JSON of the profile's jobs, cut where the name and the
    # parameter go (``spec_json``); made on first use.
    _parts: tuple[str, ...] | None = field(default=None, compare=False, repr=False)

    def spec_json(self, name: str, param: int) -> str:
        """The JSON of a job of this profile without its payload, as the store
        keeps it: what ``JobSpec.to_json`` says of it, made from the pieces
        of the profile's JSON instead of encoding the whole spec again (a
        bulk submit writes thousands a second)."""
        parts = self._parts
        if parts is None:
            parts = _cut(self.template)
            object.__setattr__(self, "_parts", parts)
        if len(parts) == 2:
            return parts[0] + json.dumps(name) + parts[1]
        return parts[0] + json.dumps(name) + parts[1] + str(param) + parts[2]


# Stand-ins for a job's name and parameter in its profile's JSON, each cut
# out of the text where it lands.
_NAME_MARK = "\ue000name\ue001"
_PARAM_MARK = -7_707_707_707_707_707


def _cut(template: JobSpec) -> tuple[str, ...]:
    d = template.to_dict()
    d["name"] = _NAME_MARK
    schedule = d["schedule"]
    key = {"once": "at_ms", "interval": "start_at_ms"}.get(schedule["type"])
    if key is not None:
        schedule[key] = _PARAM_MARK
    text = json.dumps(d, sort_keys=True, separators=(",", ":"))
    head, tail = text.split(json.dumps(_NAME_MARK))
    if key is None:
        return head, tail
    # "name" sorts before "schedule": the parameter is in the tail.
    middle, end = tail.split(str(_PARAM_MARK))
    return head, middle, end


def _zeroed(schedule: Schedule) -> tuple[Schedule, int]:
    """The schedule's shape and its per-job instant."""
    if isinstance(schedule, Once):
        return _ONCE, schedule.at_ms
    if isinstance(schedule, Interval):
        if not schedule.start_at_ms:
            return schedule, 0
        shape = Interval(period_ms=schedule.period_ms, mode=schedule.mode, start_at_ms=0)
        return shape, schedule.start_at_ms
    return schedule, 0


_ONCE = Once(at_ms=0)


def _with_param(schedule: Schedule, param: int) -> Schedule:
    if isinstance(schedule, Once):
        return Once(at_ms=param)
    if isinstance(schedule, Interval):
        return Interval(period_ms=schedule.period_ms, mode=schedule.mode, start_at_ms=param)
    return schedule


def split_spec(spec: JobSpec) -> tuple[JobSpec, int]:
    """A spec's profile template and its schedule parameter. (Built field by
    field: ``dataclasses.replace`` costs three times as much, and a bulk
    submit splits ten thousand specs a second.)"""
    shape, param = _zeroed(spec.schedule)
    if spec.name == _NAME and spec.payload == _PAYLOAD and shape is spec.schedule:
        return spec, param
    template = JobSpec(
        name=_NAME,
        handler=spec.handler,
        schedule=shape,
        tenant=spec.tenant,
        payload=_PAYLOAD,
        jitter_ms=spec.jitter_ms,
        catch_up=spec.catch_up,
        overlap=spec.overlap,
        retry=spec.retry,
        timeout_ms=spec.timeout_ms,
        side_effect=spec.side_effect,
        pool=spec.pool,
        priority=spec.priority,
        skip_calendars=spec.skip_calendars,
        active_from_ms=spec.active_from_ms,
        active_until_ms=spec.active_until_ms,
        max_fires=spec.max_fires,
        last_fire_ms=spec.last_fire_ms,
        concurrency_key=spec.concurrency_key,
    )
    return template, param


def join_spec(template: JobSpec, param: int) -> JobSpec:
    """The spec an owner works with: the template with the job's schedule
    parameter (name and payload stay empty)."""
    if isinstance(template.schedule, Cron):
        return template
    return replace(template, schedule=_with_param(template.schedule, param))


def schedule_of(template: JobSpec, param: int) -> Schedule:
    """The job's own schedule: the template's shape with its parameter."""
    return _with_param(template.schedule, param)


def profile_of(template: JobSpec) -> Profile:
    """The profile of a template (``split_spec``): its body and digest."""
    d = template.to_dict()
    del d["name"], d["payload"]
    body = json.dumps(d, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(body.encode()).digest()
    # 63 bits: a positive signed 64-bit integer in every store.
    profile_id = int.from_bytes(digest[:8], "little") >> 1
    return Profile(profile_id=profile_id, body=body, template=template)


def template_of_body(body: str) -> JobSpec:
    """The template a profile's body describes (a load names profiles by id
    and brings their bodies)."""
    d = json.loads(body)
    d["name"], d["payload"] = _NAME, ""
    return JobSpec.from_dict(d)


class Profiles:
    """The profiles an owner holds jobs of, each once, numbered densely from 0
    in the order first seen (a packed job refers to its profile by that
    number: 4 bytes, not a pointer and an object)."""

    __slots__ = ("_by_id", "_by_template", "items")

    def __init__(self) -> None:
        self.items: list[Profile] = []
        self._by_id: dict[int, int] = {}
        self._by_template: dict[JobSpec, int] = {}

    def __len__(self) -> int:
        return len(self.items)

    def __bool__(self) -> bool:
        # Said, not left to __len__: compiled code tests an Optional of a
        # compiled class without __bool__ for None only (mypyc 2.4).
        return len(self) > 0

    def intern(self, template: JobSpec) -> int:
        """The number of the template's profile, interning it if new."""
        index = self._by_template.get(template)
        if index is None:
            index = self.add(profile_of(template))
        return index

    def add(self, profile: Profile) -> int:
        """The number of ``profile``, interning it if new."""
        index = self._by_id.get(profile.profile_id)
        if index is None:
            index = len(self.items)
            self.items.append(profile)
            self._by_id[profile.profile_id] = index
            self._by_template[profile.template] = index
        return index

    def add_body(self, profile_id: int, body: str) -> int:
        """The number of a profile known by id and body (from the store or a
        checkpoint), interning it if new."""
        index = self._by_id.get(profile_id)
        if index is None:
            index = self.add(
                Profile(profile_id=profile_id, body=body, template=template_of_body(body))
            )
        return index

    def index_of(self, profile_id: int) -> int | None:
        return self._by_id.get(profile_id)

    def __getitem__(self, index: int) -> Profile:
        return self.items[index]
