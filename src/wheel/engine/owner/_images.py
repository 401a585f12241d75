"""Jobs kept as their checkpoint image until first touched: a restart arms a
million timers without parsing a million specs."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from wheel.engine.model import shard_of
from wheel.engine.owner._state import _Job, _OwnerState
from wheel.engine.owner._values import (
    FIRE,
    JobImage,
)
from wheel.engine.schedule import CompiledSchedule, compile_schedule
from wheel.engine.spec import JobSpec

log = logging.getLogger("wheel.owner")


class _Images(_OwnerState):
    __slots__ = ()

    def _job(self, job_id: int) -> _Job | None:
        """The job, woken from its checkpoint image if it is dormant. The
        dispatch path writes ``self.jobs.get(j) or self._job(j)``: a job it
        touches is nearly always awake, and the call costs more than the get."""
        job = self.jobs.get(job_id)
        if job is None and job_id in self._dormant:
            job = self._wake(job_id)
        return job

    def _job_or_raise(self, job_id: int) -> _Job:
        job = self._job(job_id)
        if job is None:
            raise KeyError(job_id)
        return job

    def _dormant_image(self, raw: object) -> JobImage:
        assert self._decode_image is not None
        return self._decode_image(raw)

    def _wake(self, job_id: int) -> _Job | None:
        raw = self._dormant.pop(job_id)
        try:
            image = self._dormant_image(raw)
            spec = JobSpec.from_json(image.spec_json.decode())
            compiled = self._compile(job_id, spec)
        except Exception:
            # One bad row (an expression this version rejects) must not stop
            # the owner, nor every other job of the shard from running.
            log.exception("job %s could not be loaded; skipped", job_id)
            self.wheel.cancel((job_id << 2) | FIRE)
            state = self._shards.get(shard_of(job_id))
            if state is not None:
                state.jobs.discard(job_id)
            return None
        job = _Job(job_id, spec, compiled, image.spec_json)
        job.paused = image.paused
        job.store_next = image.store_next
        # The FIRE timer was armed at image.due_at by load_images. An image
        # made from a store row knows only the fire's nominal time: the job's
        # jitter (never earlier) moves the timer now.
        job.next_fire = None if image.paused else image.store_next
        if job.next_fire is not None:
            due = compiled.jittered(job.next_fire)
            if due != image.due_at:
                self.wheel.add((job_id << 2) | FIRE, due)
        self.jobs[job_id] = job
        return job

    def _wake_to_fire(self, job_id: int, now_ms: int) -> _Job | None:
        """A dormant job whose FIRE timer went off, if its fire is due: one
        armed at the nominal time of a jittered fire is due later (``_wake``
        armed it again for then)."""
        job = self._job(job_id)
        if job is None or job.next_fire is None or job.compiled.jittered(job.next_fire) > now_ms:
            return None
        return job

    def _compile(self, job_id: int, spec: JobSpec) -> CompiledSchedule:
        return compile_schedule(spec.schedule, jitter_ms=spec.jitter_ms, job_id=job_id)

    def has_job(self, job_id: int) -> bool:
        return job_id in self.jobs or job_id in self._dormant

    def job_count(self) -> int:
        return len(self.jobs) + len(self._dormant)

    def job_ids(self) -> list[int]:
        return [*self.jobs, *self._dormant]

    def dormant_record(self, job_id: int) -> object | None:
        """A dormant job's image as ``load_images`` was given it (None: the
        job is awake or gone)."""
        return self._dormant.get(job_id)

    def image_of(self, job_id: int) -> JobImage | None:
        """What a checkpoint keeps of a job (None: the job is gone)."""
        dormant = self._dormant.get(job_id)
        if dormant is not None:
            return self._dormant_image(dormant)
        job = self.jobs.get(job_id)
        if job is None:
            return None
        due_at = None
        if job.store_next is not None and not job.paused:
            due_at = job.compiled.jittered(job.store_next)
        return JobImage(
            spec_json=job.spec_json, paused=job.paused, store_next=job.store_next, due_at=due_at
        )

    def take_dirty(self) -> set[int]:
        dirty, self.dirty = self.dirty, set()
        return dirty

    def take_new_specs(self, dirty: set[int] | None = None) -> set[int]:
        """Of ``dirty`` (the jobs about to be logged), those whose spec the
        checkpoint has not seen: they are logged as full images, the others as
        moves. The rest stay marked until they are logged (None: take all,
        when a snapshot of everything follows or nothing is logged)."""
        if dirty is None:
            new, self.new_specs = self.new_specs, set()
            return new
        new = self.new_specs & dirty
        self.new_specs -= new
        return new

    def load_images(
        self, images: Mapping[int, tuple[int | None, object]], ours: set[int] | None = None
    ) -> None:
        """Take on jobs from a checkpoint, or from the store's rows made into
        images: ``images`` maps a job id to (when its earliest unclaimed fire
        is due, or its nominal time if it may be jittered later; its image in
        the checkpoint's own encoding). Each is armed now and decoded only
        when the job is first touched: a restart arms a million jobs without
        parsing a million specs. ``ours``: the shards to take them for (None:
        every one is ours)."""
        ids: list[int] = []
        deadlines: list[int] = []
        dormant = self._dormant
        shards = self._shards
        for job_id, (due_at, raw) in images.items():
            shard = shard_of(job_id)
            if ours is not None and shard not in ours:
                continue
            dormant[job_id] = raw
            shards[shard].jobs.add(job_id)
            if due_at is not None:
                ids.append((job_id << 2) | FIRE)
                deadlines.append(due_at)
        self.wheel.add_many(ids, deadlines)

    def _keep_job(self, job: _Job) -> None:
        """A job joins the table of awake jobs and its shard's jobs."""
        self.jobs[job.job_id] = job
        self._shards[job.shard].jobs.add(job.job_id)

    def _forget_job(self, job: _Job) -> None:
        """A job leaves the owner: its schedule and runs are over."""
        del self.jobs[job.job_id]
        state = self._shards.get(job.shard)
        if state is not None:
            state.jobs.discard(job.job_id)
        self.dirty.add(job.job_id)
