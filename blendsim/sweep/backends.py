"""Where a sweep's tasks run: in this process, in a local process pool, or on a Ray cluster.

A backend has ``submit(fn, *args) -> handle``, ``wait() -> [(handle, result)]`` (at least one
finished task), ``trace_arg(path, handle)`` (how a cell task receives its workload's trace) and
``close(cancel)``. ``capacity`` is how many tasks the driver keeps in flight; ``ships`` says whether
workers send results back as bytes (they may not share the driver's disk) rather than writing them.
"""

from __future__ import annotations

import os
from collections import deque
from pathlib import Path

from blendsim.sim.errors import UserError


class InlineBackend:
    """Runs each task in this process when the driver waits for it (``--jobs 1``)."""

    ships = False

    def __init__(self):
        self.capacity = 1
        self._queue: deque = deque()
        self._next = 0

    def submit(self, fn, *args):
        self._next += 1
        self._queue.append((self._next, fn, args))
        return self._next

    def wait(self) -> list:
        handle, fn, args = self._queue.popleft()
        return [(handle, fn(*args))]

    def trace_arg(self, path: Path, handle=None):
        return str(path)

    def close(self, cancel: bool = False) -> None:
        self._queue.clear()


class LocalBackend:
    """A pool of ``jobs`` long-lived worker processes on this machine.

    NOTE: workers start from a forkserver that has imported the simulator once (``tasks.warm_up``),
    so no cell pays the imports, and no worker is forked from the driver's threads (rich's refresh
    thread, the pool's own manager thread).
    """

    ships = False

    def __init__(self, jobs: int):
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        from blendsim.sweep.tasks import warm_up

        method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
        ctx = mp.get_context(method)
        if method == "forkserver":
            ctx.set_forkserver_preload(["blendsim.sweep.tasks", "blendsim.runner", "blendsim.policies.base", "blendsim.workloads.recipes"])
        self.capacity = jobs
        self._pool = ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=warm_up,
                                         initargs=(os.getpid(),))
        self._futures: set = set()

    def submit(self, fn, *args):
        f = self._pool.submit(fn, *args)
        self._futures.add(f)
        return f

    def wait(self) -> list:
        from concurrent.futures import FIRST_COMPLETED, wait
        from concurrent.futures.process import BrokenProcessPool

        done, _ = wait(self._futures, return_when=FIRST_COMPLETED)
        out = []
        for f in done:
            self._futures.discard(f)
            try:
                out.append((f, f.result()))
            except BrokenProcessPool:
                raise UserError("a sweep worker process died (killed, out of memory, or failed to start: see above; "
                                "a Python script that calls blendsim.sweep with jobs > 1 must call it under "
                                "`if __name__ == \"__main__\":`, since each worker imports the script); finished "
                                "cells are kept, rerun the command to resume") from None
        return out

    def trace_arg(self, path: Path, handle=None):
        return str(path)

    def close(self, cancel: bool = False) -> None:
        """Shut the pool down; ``cancel`` (an interrupt) also stops the cells running now, so the
        command ends at once rather than when they finish (interpreter exit joins the pool)."""
        self._futures.clear()
        if cancel:
            pool = self._pool
            if hasattr(pool, "terminate_workers"):  # Python >= 3.14
                pool.terminate_workers()
                return
            # NOTE: earlier Pythons have no public way to stop a running task: terminate the workers
            # the pool itself tracks, then let its manager thread find them gone
            procs = list((getattr(pool, "_processes", None) or {}).values())
            pool.shutdown(wait=False, cancel_futures=True)
            for p in procs:
                if p.is_alive():
                    p.terminate()
            for p in procs:
                p.join(timeout=5)
            return
        self._pool.shutdown(wait=True)


class RayBackend:
    """Tasks on a Ray cluster: ``address`` (e.g. ``ray://head:10001`` or ``auto``), or a local Ray
    started for the run. Workers send run directories back as bytes, so the cluster's nodes need not
    share this machine's disk; they need blendsim installed (``pip install blendsim``) with the same
    code, or the project's packages are shipped with the job when ``ship_code`` is set."""

    ships = True

    def __init__(self, address: str | None, jobs: int | None, ship_code: bool = False):
        try:
            import ray
        except ImportError:
            raise UserError("--backend ray needs Ray, which is not installed; "
                            "pip install 'blendsim[ray]' (or 'ray[default]')") from None
        self._ray = ray
        self._started = not ray.is_initialized()
        if self._started:
            kw = {"runtime_env": {"py_modules": _project_modules()}} if ship_code else {}
            try:
                ray.init(address=address, include_dashboard=False, log_to_driver=False,
                         logging_level="ERROR", **kw)
            except (ConnectionError, ValueError, RuntimeError) as e:
                where = address or "a local Ray instance"
                raise UserError(f"--ray-address: cannot connect to {where}: {str(e).splitlines()[0]}") from None
        cpus = int(ray.cluster_resources().get("CPU", 1))
        self.capacity = max(1, jobs or cpus)
        self._remote = {}
        self._pending: set = set()

    def submit(self, fn, *args):
        if fn not in self._remote:
            self._remote[fn] = self._ray.remote(num_cpus=1, max_retries=2)(fn)
        ref = self._remote[fn].remote(*args)
        self._pending.add(ref)
        return ref

    def wait(self) -> list:
        done, _ = self._ray.wait(list(self._pending), num_returns=1)
        out = []
        for ref in done:
            self._pending.discard(ref)
            try:
                out.append((ref, self._ray.get(ref)))
            except self._ray.exceptions.RayError as e:  # a lost node or worker, after Ray's retries
                msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                out.append((ref, {"ok": False, "error": f"Ray: {msg}", "user_error": False}))
        return out

    def trace_arg(self, path: Path, handle=None):
        # NOTE: the synthesis task's own result is the trace's bytes: passing its ObjectRef lets Ray
        # hand it to the cell tasks from the object store instead of uploading it again.
        return handle if handle is not None else self._ray.put(Path(path).read_bytes())

    def close(self, cancel: bool = False) -> None:
        if cancel:
            for ref in list(self._pending):
                self._ray.cancel(ref, force=True)
        self._pending.clear()
        if self._started:
            self._ray.shutdown()


def _project_modules() -> list:
    from blendsim import calibrate, policies, real_backend, reports, sim, workloads

    return [sim, policies, workloads, calibrate, real_backend, reports]


def make_backend(kind: str, jobs: int | None, ray_address: str | None = None):
    """The backend ``kind`` ("local" or "ray"); ``--jobs 1`` runs locally in this process."""
    if kind == "ray":
        return RayBackend(ray_address, jobs, ship_code=ray_address is not None)
    if kind != "local":
        raise UserError(f"--backend {kind!r}: use local or ray")
    if ray_address is not None:
        raise UserError("--ray-address needs --backend ray")
    jobs = jobs or os.cpu_count() or 1
    return InlineBackend() if jobs == 1 else LocalBackend(jobs)


__all__ = ["InlineBackend", "LocalBackend", "RayBackend", "make_backend"]
