# Cython declarations for sim/kv.py, read only when that module is compiled (blendsim.sim._compiled): the
# pure-Python module is the reference, and these types must not change what it computes. KVCache becomes an
# extension type (subclasses such as sim.kv_tiers.TieredKVCache still get a __dict__, and a Python
# override of a cpdef method still wins). The per-node lists are typed list; ``access`` (float64) and
# ``_req_node`` (int64) are array.array objects, left untyped.
cimport cython

cdef class KVCache:
    cdef dict __dict__
    cdef public object tree, on_event, access, _req_node
    cdef public Py_ssize_t block_size, total, cache_blocks, evictable, private, evicted_blocks
    cdef public bint caching, retain
    cdef public list blk_start, nblocks, parent, cached, ref, cached_children, _heap

    cpdef list path_of(self, req)
    @cython.locals(hit=Py_ssize_t, c=Py_ssize_t, x=Py_ssize_t, cached=list, nb=list)
    cpdef Py_ssize_t match(self, list path, Py_ssize_t max_blocks) except? -1
    cpdef bint reserve(self, Py_ssize_t n) except -1
    cpdef release(self, Py_ssize_t n)
    @cython.locals(r=Py_ssize_t)
    cpdef lock(self, Py_ssize_t node, now)
    @cython.locals(r=Py_ssize_t)
    cpdef unlock(self, Py_ssize_t node, now)
    cpdef unlock_all(self, nodes, now)
    @cython.locals(c=Py_ssize_t, new=Py_ssize_t, p=Py_ssize_t)
    cpdef Py_ssize_t insert(self, Py_ssize_t node, Py_ssize_t index, Py_ssize_t count) except? -1
    @cython.locals(freed=Py_ssize_t, heap=list, cached=list, ref=list, kids=list, x=Py_ssize_t,
                   c=Py_ssize_t, take=Py_ssize_t, p=Py_ssize_t)
    cpdef Py_ssize_t evict(self, Py_ssize_t n) except? -1
