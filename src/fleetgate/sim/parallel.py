"""Independent simulations in parallel processes, with one progress bar on stderr.

``Runner(jobs)`` holds ``jobs`` worker processes (``jobs == 1``: none; a task then runs
here, at once, when it is submitted). ``fleetgate simulate`` gives it one task per policy,
``fleetgate plan`` one per candidate row's capacity and one per fleet x policy it confirms,
``bench/scenarios.py`` one per cell of the matrix. A task is a module-level function and
picklable arguments; its result comes back as a value. Simulations are seeded and share
nothing, so a task gives the same result in any process and in any order: callers order
results by task (``map``) or decide only from results of tasks they have settled, never
from the order of completion, and their output is the same bytes whatever ``jobs`` is.

Workers are forked where the platform can (Linux): they start with the parent's imports
(no second start-up) and all of them are started before the progress bar's refresh thread
(a fork after a thread has started may deadlock the child). Elsewhere they are spawned.

Progress goes to stderr, never stdout (the caller's tables): on a terminal a rich bar (done
of submitted, the task last started, elapsed time); otherwise one line per finished task,
which is what a CI log keeps. ``quiet=True`` shows nothing (tests, library callers).

Leaving the ``with`` block while tasks still run (an error, or a search that no longer
needs the tasks it started ahead) stops the workers rather than waiting for them.

May touch: concurrent.futures, multiprocessing, rich. Must not touch: the simulator's state
(it runs what it is given).
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from types import TracebackType
from typing import Any, TypeVar

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

T = TypeVar("T")


def default_jobs() -> int:
    return os.cpu_count() or 1


def _nothing() -> None:
    return None


class Runner:
    """A pool of ``jobs`` processes and a progress display (module docstring)."""

    def __init__(self, jobs: int | None = None, title: str = "simulating",
                 quiet: bool = False) -> None:
        self.jobs = max(1, jobs if jobs is not None else default_jobs())
        self.title, self.quiet = title, quiet
        self._pool: ProcessPoolExecutor | None = None
        self._console = Console(stderr=True)
        self._bar: Progress | None = None
        self._task: TaskID | None = None
        self._done = self._submitted = 0
        self._futures: list[Future[Any]] = []
        self._closing = False
        self._t0 = time.perf_counter()

    def __enter__(self) -> Runner:
        if self.jobs > 1:
            methods = multiprocessing.get_all_start_methods()
            context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
            self._pool = ProcessPoolExecutor(self.jobs, mp_context=context)
            self._pool.submit(_nothing).result()  # every worker starts now, before any thread
        if not self.quiet and self._console.is_terminal:
            self._bar = Progress(TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TimeElapsedColumn(),
                                 console=self._console, transient=False)
            self._task = self._bar.add_task(self.title, total=0)
            self._bar.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._bar is not None:
            self._bar.stop()
        if self._pool is None:
            return
        if exc is None and all(f.done() for f in self._futures):
            self._pool.shutdown()
            return
        # a failure, or tasks nobody waits for (a search that no longer needs them): stop
        self._closing = True
        processes = list((getattr(self._pool, "_processes", None) or {}).values())
        self._pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            process.terminate()

    def submit(self, label: str, fn: Callable[..., T], *args: Any) -> Future[T]:
        """Run ``fn(*args)`` in a worker (here and now with one job)."""
        self._submitted += 1
        self._show(f"{self.title}: {label}")
        if self._pool is None:
            future: Future[T] = Future()
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # handed to whoever reads the result, as a pool does
                future.set_exception(exc)
            self._finished(label)
            return future
        future = self._pool.submit(fn, *args)
        self._futures.append(future)
        future.add_done_callback(lambda _f: self._finished(label))
        return future

    def map(self, label: Callable[[Sequence[Any]], str], fn: Callable[..., T],
            calls: Iterable[Sequence[Any]]) -> list[T]:
        """``fn(*args)`` for each ``args`` of ``calls``, results in the order of ``calls``."""
        futures = [self.submit(label(args), fn, *args) for args in calls]
        return [f.result() for f in futures]

    @staticmethod
    def wait_any(futures: Iterable[Future[Any]]) -> None:
        """Return once at least one of ``futures`` is done (at once if one is, or none left)."""
        pending = list(futures)
        if pending:
            wait(pending, return_when=FIRST_COMPLETED)

    # -- display ----------------------------------------------------------------------------
    def _show(self, description: str) -> None:
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, description=description, total=self._submitted)

    def _finished(self, label: str) -> None:
        if self._closing:
            return  # stopped, not finished
        self._done += 1
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, completed=self._done)
        elif not self.quiet:
            print(f"  [{self._done}/{self._submitted}] {self.title}: {label} "
                  f"({time.perf_counter() - self._t0:.0f} s)", file=sys.stderr, flush=True)
