"""The worker runtime: register, claim, run, heartbeat, settle, drain.

A `Worker` is one row in ``workers``. Side by side it runs:

- a **claim loop** that takes up to ``concurrency`` tasks while its row is ``active``;
- each **task**, a coroutine function on the event loop or anything else in a thread,
  settled afterwards (complete or fail) with the claim's execution token;
- a **heartbeat** that renews the leases it holds, reports its running tasks and
  leases, reaps the pool's expired leases, and reads back what the controller wants.

Drain, as the controller asks it (the row goes ``draining``): stop claiming, finish
what is in hand, report 0 running and 0 leases at once, then wait. The controller
either removes the replica (the row goes ``gone``: the worker exits) or calls the
drain off (the row goes ``active``: the worker claims again).

`stop()` (SIGTERM) is the same drain, started by the worker: finish, mark the row
``gone``, exit. A second `stop()` aborts: tasks in hand are left to their leases.

A settle whose reply is lost (the connection dropped mid-commit) is retried with the
same token until the lease would run out. The token makes the retry safe: it either
applies, or reports that the first attempt had committed, or is rejected because the
lease was lost. The task is never released early, so nobody else gets it meanwhile.
"""

from __future__ import annotations

import asyncio
import contextvars
import enum
import inspect
import logging
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from roost.decide.snapshot import WorkerStatus
from roost.store import tasks as tasks_q
from roost.store import workers as workers_q
from roost.store.tasks import Claim, TaskNotFound, TaskStatus, TokenRejected, WorkerNotActive
from roost.worker.config import WorkerConfig
from roost.worker.errors import PermanentTaskError, RetryTask, retry_delay

log = logging.getLogger("roost.worker")

TRANSIENT: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.OperatorInterventionError,  # admin shutdown, terminated backend
)
"""Errors after which a statement may or may not have run: retry, never assume."""


class ExitReason(enum.StrEnum):
    STOPPED = "stopped"  # stop()/SIGTERM: drained, row marked gone
    REMOVED = "removed"  # drained by the controller, which removed the replica
    UNREGISTERED = "unregistered"  # the worker's row vanished (its pool was deleted)
    ABORTED = "aborted"  # a second stop(): tasks in hand left to their leases


@dataclass(frozen=True, slots=True)
class TaskContext:
    """What a running task may want to know about itself: see `current_task`."""

    task_id: int
    pool: str
    attempt: int
    max_attempts: int
    worker_id: str


_current: contextvars.ContextVar[TaskContext] = contextvars.ContextVar("roost_task")


def current_task() -> TaskContext:
    """The task being run, from inside a task function (sync or async)."""
    try:
        return _current.get()
    except LookupError:
        raise RuntimeError("current_task() is only available inside a task") from None


@dataclass(slots=True)
class WorkerStats:
    claimed: int = 0
    succeeded: int = 0
    retried: int = 0
    """Failed attempts queued again."""
    failed: int = 0
    rejected: int = 0
    """Settles refused because the lease had been lost."""
    replayed: int = 0
    """Settles retried after a lost reply that turned out to have committed."""
    unconfirmed: int = 0
    """Settles given up when the lease ran out before the database could be reached."""
    lost_leases: int = 0


@dataclass(frozen=True, slots=True)
class _Done:
    value: Any


@dataclass(frozen=True, slots=True)
class _Failed:
    error: str
    retry: bool
    delay: float


@dataclass(slots=True)
class _Held:
    claim: Claim
    deadline: float
    """Loop time until which the lease surely holds (measured from before the request
    that set it, so it errs early)."""
    lost: bool = False


def _is_async(fn: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 (an object with an async __call__)
    )


async def _wait(event: asyncio.Event, seconds: float) -> None:
    """Sleep until ``event`` is set or ``seconds`` pass, then clear it. Not
    `asyncio.wait_for`: on Python 3.11 it can swallow a cancellation that arrives just
    as the event is set, and the loop it sleeps in would never stop."""
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({waiter}, timeout=seconds)
    finally:
        waiter.cancel()
    event.clear()


def _describe(exc: BaseException) -> str:
    return "".join(traceback.format_exception_only(exc)).strip()


@dataclass
class Worker:
    """Run ``fn(payload)`` for the tasks of ``config.pool``. ``await run()`` returns
    when the worker has exited, with the reason."""

    fn: Callable[[Any], Any]
    config: WorkerConfig
    stats: WorkerStats = field(default_factory=WorkerStats)

    def __post_init__(self) -> None:
        self.config = self.config.validate()
        self.worker_id = self.config.worker_id
        self.mode = WorkerStatus.ACTIVE
        """What the controller last said this worker should be."""
        self.registered = asyncio.Event()
        self._held: dict[int, _Held] = {}
        self._running = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()
        self._beat_now = asyncio.Event()
        self._stopping = False
        self._abort = False
        self._ended: ExitReason | None = None
        self._failing: dict[str, int] = {}
        self._db: Any = None
        self._executor: ThreadPoolExecutor | None = None

    # ---- control -----------------------------------------------------------------------

    def stop(self) -> None:
        """Drain and exit (SIGTERM). Called again, abort: tasks in hand are cancelled
        (threads cannot be) and left to their leases."""
        if self._stopping:
            self._abort = True
            for t in self._tasks:
                t.cancel()
        self._stopping = True
        self._wake.set()

    @property
    def running(self) -> int:
        return self._running

    @property
    def stopping(self) -> bool:
        """A drain was asked for by signal or `stop` (the controller's is `mode`)."""
        return self._stopping

    @property
    def held(self) -> int:
        return len(self._held)

    # ---- the whole life ------------------------------------------------------------------

    async def run(self) -> ExitReason:
        c = self.config
        self._executor = ThreadPoolExecutor(c.concurrency, thread_name_prefix="roost-task")
        self._db = await asyncpg.create_pool(
            c.dsn, min_size=1, max_size=c.db_pool_size,
            command_timeout=max(1.0, min(10.0, c.lease / 2)),
        )
        try:
            await workers_q.register(self._db, self.worker_id, pool_id=c.pool,
                                     revision=c.revision, instance_ref=c.instance_ref,
                                     slots=c.concurrency)
            log.info("worker %s registered in pool %s (instance %r, revision %r, "
                     "concurrency %d)", self.worker_id, c.pool, c.instance_ref, c.revision,
                     c.concurrency)
            self.registered.set()
            beat = asyncio.create_task(self._heartbeat_loop(), name="roost-worker-heartbeat")
            try:
                reason = await self._claim_loop()
            finally:
                beat.cancel()
                await asyncio.gather(beat, return_exceptions=True)
            if reason in (ExitReason.STOPPED, ExitReason.ABORTED):
                try:
                    await workers_q.leave(self._db, self.worker_id)
                except TRANSIENT as exc:
                    log.warning("could not mark worker %s gone: %s", self.worker_id, exc)
            log.info("worker %s exits: %s (%s)", self.worker_id, reason, self.stats)
            return reason
        finally:
            for t in self._tasks:
                t.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            self._executor.shutdown(wait=not self._abort, cancel_futures=True)
            try:
                await asyncio.wait_for(self._db.close(), 5)
            except TimeoutError:  # a server that stopped answering: just drop the sockets
                self._db.terminate()

    def _trouble(self, what: str, exc: BaseException | None) -> None:
        """Log the first failure of a kind and the recovery, not every retry between."""
        if exc is None:
            if self._failing.pop(what, 0):
                log.info("%s works again", what)
            return
        n = self._failing[what] = self._failing.get(what, 0) + 1
        if n == 1:
            log.warning("%s failed (retrying quietly): %s", what, _describe(exc))
        else:
            log.debug("%s failed again (%d): %s", what, n, _describe(exc))

    # ---- claiming --------------------------------------------------------------------------

    def _exit_reason(self) -> ExitReason | None:
        if self._abort:
            return ExitReason.ABORTED
        if self._held:
            return None
        if self._stopping:
            return ExitReason.STOPPED
        return self._ended

    async def _claim_loop(self) -> ExitReason:
        c = self.config
        loop = asyncio.get_running_loop()
        idle = 0.02
        while (reason := self._exit_reason()) is None:
            free = c.concurrency - len(self._held)
            claiming = (free > 0 and self.mode is WorkerStatus.ACTIVE
                        and not self._stopping and self._ended is None)
            wait = c.poll_interval
            if claiming:
                sent = loop.time()
                claims: list[Claim] = []
                try:
                    claims = await tasks_q.claim(self._db, c.pool, self.worker_id,
                                                 limit=free, lease=c.lease)
                except WorkerNotActive as exc:
                    log.info("worker %s: %s; waiting for the controller", self.worker_id, exc)
                    self.mode = WorkerStatus(exc.status) if exc.status else WorkerStatus.GONE
                except TRANSIENT as exc:
                    self._trouble("claim", exc)
                else:
                    self._trouble("claim", None)
                for claim in claims:
                    self._start(claim, deadline=sent + c.lease)
                if len(claims) == free:
                    continue  # the queue may hold more; slots are full now anyway
                idle = 0.02 if claims else min(idle * 2, c.poll_interval)
                wait = idle
            await _wait(self._wake, wait)
        return reason

    def _start(self, claim: Claim, *, deadline: float) -> None:
        self._held[claim.task_id] = _Held(claim, deadline)
        self.stats.claimed += 1
        log.debug("task %d: attempt %d of %d", claim.task_id, claim.attempt,
                  claim.max_attempts)
        task = asyncio.create_task(self._run_task(claim), name=f"roost-task-{claim.task_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---- one task ------------------------------------------------------------------------------

    async def _run_task(self, claim: Claim) -> None:
        self._running += 1
        try:
            outcome = await self._call(claim)
        finally:
            self._running -= 1
        try:
            await self._settle(claim, outcome)
        finally:
            self._held.pop(claim.task_id, None)
            self._wake.set()
            if self.mode is not WorkerStatus.ACTIVE or self._stopping:
                self._beat_now.set()  # report 0/0 as soon as it is true

    async def _call(self, claim: Claim) -> _Done | _Failed:
        c = self.config
        _current.set(TaskContext(claim.task_id, c.pool, claim.attempt, claim.max_attempts,
                                 self.worker_id))
        backoff = retry_delay(claim.attempt, base=c.retry_backoff, cap=c.retry_backoff_max)
        try:
            if _is_async(self.fn):
                value = await self.fn(claim.payload)
            else:
                ctx = contextvars.copy_context()
                value = await asyncio.get_running_loop().run_in_executor(
                    self._executor, ctx.run, self.fn, claim.payload)
            if inspect.isawaitable(value):
                value = await value
        except RetryTask as exc:
            return _Failed(_describe(exc), True, backoff if exc.delay is None else exc.delay)
        except PermanentTaskError as exc:
            return _Failed(_describe(exc), False, 0.0)
        except Exception as exc:
            log.warning("task %d attempt %d raised", claim.task_id, claim.attempt,
                        exc_info=exc)
            return _Failed(_describe(exc), True, backoff)
        try:
            tasks_q.encode(value)
        except (TypeError, ValueError) as exc:
            return _Failed(f"the result is not JSON: {exc}", False, 0.0)
        return _Done(value)

    async def _settle(self, claim: Claim, outcome: _Done | _Failed) -> None:
        loop = asyncio.get_running_loop()
        pause = 0.05
        while True:
            try:
                if isinstance(outcome, _Done):
                    s = await tasks_q.complete(self._db, claim.task_id, claim.token,
                                               outcome.value)
                else:
                    s = await tasks_q.fail(self._db, claim.task_id, claim.token, outcome.error,
                                           retry=outcome.retry, delay=outcome.delay)
            except TokenRejected as exc:
                self.stats.rejected += 1
                log.warning("%s: this attempt's outcome is dropped", exc)
                return
            except TaskNotFound as exc:
                log.warning("%s (deleted while it ran)", exc)
                return
            except TRANSIENT as exc:
                held = self._held.get(claim.task_id)
                left = (held.deadline if held else 0.0) - loop.time()
                if left <= 0:
                    self.stats.unconfirmed += 1
                    log.error("task %d: could not confirm its outcome before its lease ran "
                              "out (%s); it may run again", claim.task_id, _describe(exc))
                    return
                log.warning("task %d: outcome unconfirmed (%s); retrying with the same "
                            "token", claim.task_id, _describe(exc))
                await asyncio.sleep(min(pause, left))
                pause = min(2 * pause, 1.0)
                continue
            self._count(claim, s)
            return

    def _count(self, claim: Claim, s: tasks_q.Settlement) -> None:
        if s.already:
            self.stats.replayed += 1
            log.info("task %d: the first settle had committed; its reply was lost",
                     claim.task_id)
        if s.status is TaskStatus.DONE:
            self.stats.succeeded += 1
        elif s.status is TaskStatus.QUEUED:
            self.stats.retried += 1
        else:
            self.stats.failed += 1
            log.warning("task %d failed for good after attempt %d", claim.task_id,
                        claim.attempt)

    # ---- heartbeat -------------------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        every = self.config.heartbeat_interval
        while True:
            delay = every
            try:
                await self._beat()
            except TRANSIENT as exc:
                self._trouble("heartbeat", exc)
                delay = min(every, 1.0)
            except Exception:  # a bug here must not silently stop the heartbeat
                log.exception("heartbeat failed")
            else:
                self._trouble("heartbeat", None)
            await _wait(self._beat_now, delay)

    async def _beat(self) -> None:
        c = self.config
        loop = asyncio.get_running_loop()
        sent = loop.time()
        held = {tid: h.claim.token for tid, h in self._held.items()}
        beat = await workers_q.heartbeat(self._db, self.worker_id, held=held,
                                         running=self._running, lease=c.lease)
        for tid in held:
            h = self._held.get(tid)
            if h is None:
                continue
            if tid in beat.renewed:
                h.deadline = max(h.deadline, sent + c.lease)
            elif not h.lost:
                h.lost = True
                self.stats.lost_leases += 1
                log.warning("task %d: lease lost (expired and reaped, or re-claimed); "
                            "its outcome will be refused", tid)
        if beat.status is None:
            self._ended = ExitReason.UNREGISTERED
            log.warning("worker %s: its row is gone (pool deleted?)", self.worker_id)
        elif beat.status is WorkerStatus.GONE:
            self._ended = ExitReason.REMOVED
        elif beat.status is not self.mode:
            log.info("worker %s: %s -> %s", self.worker_id, self.mode, beat.status)
            self.mode = beat.status
        self._wake.set()
        reaped = await tasks_q.reap_expired(self._db, c.pool)
        if reaped:
            log.info("pool %s: %d expired leases returned to the queue", c.pool, reaped)
