"""Measuring one operator over its grid: interleaved passes, out-of-memory points skipped and recorded.

On a shared or busy host, a burst of other work slows whatever runs at that moment. Timing each
grid point once, point after point, turns such a burst into a bias on a few neighbouring points,
which a smooth fit then bends towards. With ``passes > 1`` every point's callable is built first and
the grid is swept several times, each sweep taking a share of the repetitions, so a burst spreads
over all points as noise and the median over all samples removes it. One pass is used where inputs
are too large to keep all points resident (GPU attention at long contexts) and timing is precise.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from blendsim.calibrate.timing import Clock, is_oom, summarize


@dataclass(slots=True)
class OpData:
    """Raw measurements of one operator."""

    op: str
    grid: list = field(default_factory=list)  # points (tuples of the operator's variables)
    median_s: list = field(default_factory=list)
    p10_s: list = field(default_factory=list)
    p90_s: list = field(default_factory=list)
    reps: list = field(default_factory=list)


def measure_op(clock: Clock, op: str, points, build, passes: int = 1, skipped: list | None = None,
               on_point=None, release=None) -> OpData:
    """Time ``build(point)()`` at each point; out-of-memory points go to ``skipped``, the rest on.

    ``build(point)`` returns a zero-argument callable running the operator once. ``on_point`` is
    called after each point of each pass (progress); ``release`` frees cached memory after an OOM.
    """
    take = lambda fn, reps, warm: [{op: t} for t in clock.samples(fn, reps, warmup=warm)]  # noqa: E731
    return _sweep(clock, points, build, take, lambda p: (op,), passes, skipped, on_point, release).get(op, OpData(op))


def measure_steps(clock: Clock, points, build, ops_at, passes: int = 1, skipped: list | None = None,
                  on_point=None, release=None) -> dict[str, OpData]:
    """:func:`measure_op` for callables that time their own operators (``blendsim.calibrate.forward``).

    ``build(point)()`` runs one step and returns ``{op: seconds}``; every call is one sample of each
    operator in it. ``ops_at(point)`` names the operators measured at ``point`` (an out-of-memory
    point is recorded as skipped for each of them). Returns ``{op: OpData}``.
    """
    import gc

    def take(fn, reps, warm):
        for _ in range(warm):
            fn()
        gc_was = gc.isenabled()
        gc.disable()
        try:
            return [fn() for _ in range(reps)]
        finally:
            if gc_was:
                gc.enable()

    return _sweep(clock, points, build, take, ops_at, passes, skipped, on_point, release)


def _sweep(clock, points, build, take, ops_at, passes, skipped, on_point, release) -> dict[str, OpData]:
    skipped = [] if skipped is None else skipped
    points = [tuple(int(v) for v in p) for p in points]
    fns: dict = {}
    samples: dict = {p: [] for p in points}
    reps: dict = {}
    short: dict = {}
    dead: set = set()

    def fail(p, e):
        skipped.extend({"op": op, "point": list(p), "reason": _reason(e)} for op in ops_at(p))
        dead.add(p)
        fns.pop(p, None)
        if release is not None:
            release()

    for k in range(passes):
        for p in points:
            if p in dead:
                if on_point:
                    on_point()
                continue
            try:
                fn = fns.get(p) or build(p)
                if p not in reps:
                    reps[p] = clock.reps_for(fn, 1.0 / passes)
                    short[p] = clock.last_estimate_s < 1e-3
                    warm = 0
                else:  # a short kernel gets one call to bring its data back into cache
                    warm = 1 if short[p] else 0
                samples[p].extend(take(fn, reps[p], warm))
                clock.sync()
                if passes > 1 and k < passes - 1:
                    fns[p] = fn
                else:
                    fns.pop(p, None)
                del fn
            except Exception as e:  # noqa: BLE001 - only out-of-memory is expected; others re-raise
                if not is_oom(e):
                    raise
                fail(p, e)
            if on_point:
                on_point()
    out: dict[str, OpData] = {}
    for p in points:
        if p in dead or not samples[p]:
            continue
        for op in ops_at(p):
            vals = [s[op] for s in samples[p] if op in s]
            if not vals:
                continue
            t = summarize(vals)
            d = out.setdefault(op, OpData(op))
            d.grid.append(list(p))
            d.median_s.append(t.median_s)
            d.p10_s.append(t.p10_s)
            d.p90_s.append(t.p90_s)
            d.reps.append(t.reps)
    return out


def _reason(e: BaseException) -> str:
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"out of memory ({type(e).__name__}: {first[:200]})"


__all__ = ["OpData", "measure_op", "measure_steps"]
