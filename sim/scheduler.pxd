# Cython declarations for sim/scheduler.py, read only when that module is compiled (blendsim._compiled):
# the pure-Python module is the reference, and these types must not change what it computes.
# Scheduler becomes an extension type: its instance attributes are typed slots (subclasses, e.g. the
# policies' schedulers, still get a __dict__), and the per-step methods are cpdef (a Python subclass's
# override still wins). Locals are typed only where every value is a Python int or float.
cimport cython
from blendsim.sim.seq cimport Seq
from blendsim.sim.kv cimport KVCache

cdef class Scheduler:
    cdef dict __dict__
    cdef public KVCache kv
    cdef public object cfg, P, Dlen, waiting, rec, hint
    cdef public list events, prefilling, buckets, fin_heap, hi_water, _chunk_seqs
    cdef public dict running, dec, resume
    cdef public Py_ssize_t B, replica, n_dec, dec_S, tau, step_no, _order, _resv_tau, _owner
    cdef public Py_ssize_t est_sum, gen_S, gen_P, fin_sum, fin_n, hit_tokens
    cdef public bint record, blocked, stall
    cdef public object stalled
    cdef public Py_ssize_t flushes, refused_req
    cdef public double _load_ready, reserve_need
    cdef public bint async_loads
    cdef public dict loading

    cpdef bint has_work(self)
    @cython.locals(step=Py_ssize_t, tau=Py_ssize_t, heap=list, s=Seq)
    cpdef update(self, batch, now)
    cpdef next_candidate(self)
    cpdef take_candidate(self, req)
    cpdef pick_victim(self)
    cpdef on_admit(self, Seq s, now)
    cpdef on_finish(self, Seq s, now)
    cpdef requeue(self, req)
    cpdef max_hit_blocks(self, req)
    cpdef max_insert_blocks(self, Seq s)
    @cython.locals(n=Py_ssize_t, c=Py_ssize_t, s=Seq)
    cpdef Py_ssize_t _continue_prefills(self, Py_ssize_t budget, now, list chunks, list seqs) except? -2
    @cython.locals(cap=Py_ssize_t, reserve=bint, c=Py_ssize_t, n=Py_ssize_t, s=Seq, need=double, refused=bint,
                   grows=bint)
    cpdef _schedule_prefill(self, Py_ssize_t budget, now, list chunks, list seqs)
    @cython.locals(g=Py_ssize_t, p=Py_ssize_t, hit=Py_ssize_t, acc=Py_ssize_t, i=Py_ssize_t, nb=list, path=list, s=Seq, kv=KVCache)
    cpdef _admit(self, r, now)
    cpdef bint _can_grow(self, Seq s) except -1
    @cython.locals(hw=Py_ssize_t, h=Py_ssize_t)
    cpdef bint _commit_admission(self, Seq s, now) except -1
    cpdef bint _fits_expected(self, Seq s) except -1
    @cython.locals(growth=Py_ssize_t)
    cpdef double _reserve_need(self, Seq s) except? -1
    @cython.locals(growth=Py_ssize_t, q=Seq)
    cpdef Py_ssize_t _growth(self) except? -1
    cpdef double _reserve_own(self, Seq s) except? -1
    @cython.locals(B=Py_ssize_t, c=Py_ssize_t, have=Py_ssize_t, e=Py_ssize_t, need=Py_ssize_t, free=Py_ssize_t,
                   avail=Py_ssize_t, r=Py_ssize_t, kv=KVCache, p=Py_ssize_t, hw=Py_ssize_t, new_first=Py_ssize_t)
    cpdef Py_ssize_t _grow(self, Seq s, Py_ssize_t n, now) except? -1
    @cython.locals(B=Py_ssize_t, done=Py_ssize_t, j=Py_ssize_t, i=Py_ssize_t, x=Py_ssize_t, bs=Py_ssize_t,
                   end=Py_ssize_t, cnt=Py_ssize_t, moved=Py_ssize_t, kv=KVCache, bs_=list, nb_=list, path=list)
    cpdef _insert(self, Seq s, now)
    @cython.locals(tau0=Py_ssize_t)
    cpdef _prefill_done(self, Seq s, now, step)
    @cython.locals(tau0=Py_ssize_t)
    cpdef _enter_decode(self, Seq s)
    @cython.locals(B=Py_ssize_t, need=Py_ssize_t, kv=KVCache)
    cpdef _reserve_decode(self, now)
    @cython.locals(B=Py_ssize_t, phase=Py_ssize_t, avail=Py_ssize_t, back=Py_ssize_t, short=Py_ssize_t,
                   need=Py_ssize_t, kv=KVCache, s=Seq)
    cpdef _reserve_or_stall(self)
    @cython.locals(tau=Py_ssize_t, ctx=Py_ssize_t, cross=list, s=Seq)
    cpdef _stall(self, Py_ssize_t k, Py_ssize_t phase)
    cpdef _flush(self, now)
    cpdef Py_ssize_t _leave_decode(self, Seq s) except? -1
    @cython.locals(ctx=Py_ssize_t)
    cpdef _finish_decode(self, Seq s, now, step)
    cpdef _finish(self, Seq s, now, step)
    cpdef _preempt(self, Seq s, now)
    cpdef _release_locks(self, Seq s, now)
    cpdef bint quiescent(self) except -1
    cpdef _tiers_step(self, now)
    cpdef double _load_wait(self, now) except? -1
