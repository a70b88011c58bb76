"""Progress of long commands, one helper for all of them (fidelity, sweep, plan, calibrate, validate).

On a terminal it draws a rich bar on stderr, as before. When stderr is not a terminal (piped, redirected,
a CI log) it prints a plain line there instead, ``<label>: <done>/<total> <unit> (<pct>%), <elapsed> s
elapsed[, <detail>]``, from a background ticker every ``interval`` seconds (10 by default), so a long run
is never silent for longer than that and never floods the log. ``quiet`` turns both off. Nothing goes to
stdout, so ``--json`` output and results stay byte-identical.

Use::

    from blendsim.progress import Progress

    with Progress("fidelity", total=len(rows), unit="rows", quiet=quiet) as bar:
        for i, row in enumerate(rows):
            ...
            bar.update(i + 1, detail=row.id)

``update(done, total=None, detail="")`` may be called from the thread that owns the bar as often as
wanted; only the ticker writes plain lines. ``BLENDSIM_PROGRESS_S`` overrides the interval (tests).
"""

from __future__ import annotations

import os
import sys
import threading
import time

INTERVAL_S = 10.0


def _interval() -> float:
    try:
        v = float(os.environ.get("BLENDSIM_PROGRESS_S", INTERVAL_S))
    except ValueError:
        return INTERVAL_S
    return v if v > 0 else INTERVAL_S


class Progress:
    """A progress display of ``done`` out of ``total`` units (see the module docstring)."""

    def __init__(self, label: str, total: int | None = None, unit: str = "", quiet: bool = False, stream=None,
                 interval: float | None = None, tty: bool | None = None):
        self.label = label
        self.total = total
        self.unit = unit
        self.done = 0
        self.detail = ""
        self.stream = stream or sys.stderr
        self.quiet = quiet
        self.tty = (self.stream.isatty() if hasattr(self.stream, "isatty") else False) if tty is None else tty
        self.interval = interval or _interval()
        self._start = time.monotonic()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = None
        self._bar = None
        self._task = None

    # ---- public ----------------------------------------------------------------------------------
    def update(self, done: int, total: int | None = None, detail: str = "") -> None:
        with self._lock:
            self.done = done
            if total is not None:
                self.total = total
            self.detail = detail
        if self._bar is not None:
            if self._task is None:
                self._task = self._bar.add_task(self.label, total=self.total, completed=done)
            else:
                self._bar.update(self._task, completed=done, total=self.total)

    def line(self) -> str:
        """The plain progress line for now."""
        with self._lock:
            done, total, detail = self.done, self.total, self.detail
        unit = f" {self.unit}" if self.unit else ""
        if total is not None:
            head = f"{done}/{total}{unit}" + (f" ({100 * done / total:.0f}%)" if total else "") + ", "
        else:  # an open-ended task (validate's steps): the detail says where it is
            head = f"{done}{unit}, " if unit else ""
        tail = f", {detail}" if detail else ""
        return f"{self.label}: {head}{time.monotonic() - self._start:.0f} s elapsed{tail}"

    # ---- context manager -------------------------------------------------------------------------
    def __enter__(self) -> Progress:
        self._start = time.monotonic()
        if self.quiet:
            return self
        if self.tty:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(TextColumn(self.label), BarColumn(), MofNCompleteColumn(),
                                     TextColumn(self.unit), TimeElapsedColumn(), TextColumn("ETA"),
                                     TimeRemainingColumn(), console=Console(file=self.stream), transient=True)
            self._bar.__enter__()
            if self.total is not None:
                self._task = self._bar.add_task(self.label, total=self.total, completed=0)
        else:
            self._thread = threading.Thread(target=self._tick, name=f"progress-{self.label}", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> bool:
        if self._bar is not None:
            self._bar.__exit__(*exc)
            self._bar = None
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        return False

    def _tick(self) -> None:
        while not self._stop.wait(self.interval):
            self._write(self.line())

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text + "\n")
            self.stream.flush()
        except (OSError, ValueError):  # a closed pipe: progress is best effort
            self._stop.set()


__all__ = ["INTERVAL_S", "Progress"]
