"""A controller loop: queued work and timers run in order on one thread, so controllers need no locks of their own."""

from __future__ import annotations

import heapq
import itertools
import queue
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

T = TypeVar("T")


class ControllerLoop:
    """Work submitted from any thread (store listeners, the control API) and timers, run one at a time."""

    def __init__(self, thread_name: str):
        self._thread_name = thread_name
        self._work: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._sequence = itertools.count()
        self._pending = 0
        self._settled = threading.Condition()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self._thread_name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._work.put(None)
        if self._thread:
            self._thread.join(timeout=5)

    def submit(self, work: Callable[[], None]) -> None:
        with self._settled:
            self._pending += 1
        self._work.put(work)

    def call(self, work: Callable[[], T], timeout: float) -> T:
        """Run `work` on the loop's thread between two steps and return its result: a view of the controllers' state
        that no step has half changed. Raises TimeoutError when the loop does not get to it in time."""
        future: Future[T] = Future()

        def run() -> None:
            try:
                future.set_result(work())
            except Exception as error:
                future.set_exception(error)

        self.submit(run)
        return future.result(timeout)

    def _later(self, delay: float, work: Callable[[], None]) -> None:
        """Run `work` after `delay` seconds; only the loop's own thread schedules timers."""
        with self._settled:
            self._pending += 1
        heapq.heappush(self._timers, (time.monotonic() + delay, next(self._sequence), work))

    def _done_one(self) -> None:
        with self._settled:
            self._pending -= 1
            if self._pending == 0:
                self._settled.notify_all()

    def settle(self, timeout: float = 10.0) -> bool:
        """Wait until no change is queued and no MIG step is scheduled; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._settled:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._settled.wait(left)
        return True

    def _run(self) -> None:
        while True:
            wait = None
            if self._timers:
                wait = max(0.0, self._timers[0][0] - time.monotonic())
            try:
                work = self._work.get(timeout=wait)
            except queue.Empty:
                work = None
            else:
                if work is None:
                    return
                self._call(work)
            while self._timers and self._timers[0][0] <= time.monotonic():
                self._call(heapq.heappop(self._timers)[2])

    def _call(self, work: Callable[[], None]) -> None:
        try:
            work()
        except Exception:  # one node's bad step must not stop the controllers of all the others
            traceback.print_exc()
        finally:
            self._done_one()
