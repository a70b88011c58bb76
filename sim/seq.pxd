# Cython declarations for sim/seq.py, read only when that module is compiled (blendsim.sim._compiled): the
# pure-Python module is the reference, and these types must not change what it computes. Seq becomes an
# extension type with typed slots (every counter below only ever holds a Python int: the golden cases
# run under both paths), so the compiled scheduler reads and writes them as C fields.
cdef class Seq:
    cdef public Py_ssize_t req, p, d, target, computed, generated, shared, private, lock_n, ins_i, ins_j
    cdef public Py_ssize_t order, hit, tau0, c0, key, fin, est, load
    cdef public bint contig
    cdef public object path, side
