"""Arrays of the CPU kernel: work buffers on cache lines (:func:`_aligned`; the
forward's per-thread set, :func:`_thread_buffers`) and a
per-thread pool that recycles the forward's output and the backward's gradients once
nothing references them (:func:`_buffer`, emptied by :func:`release_workspace`).

Why: work buffers, outputs and gradients start on 64-byte boundaries
(:func:`_aligned`, :func:`_buffer`), so vector accesses do not straddle cache lines;
outputs and gradients are recycled arrays (:func:`_buffer`: a new large array costs
its page faults); a residue work item stores its state back with non-temporal stores
(:func:`._llvm._copy_nt`), which need its destination rows on cache lines.
"""

from __future__ import annotations

import math
import sys
import threading

import numba
import numpy as np

__all__ = ["release_workspace", "_aligned", "_buffer", "_ring_slot", "_ring_slots",
           "_thread_buffers", "_views"]


@numba.njit(cache=True)
def _aligned(size, like):  # pragma: no cover - compiled
    """An uninitialized 1-D array of ``size`` elements of ``like``'s dtype starting on a
    64-byte boundary. numba's ``np.empty`` aligns to 32 bytes: a buffer that starts 32
    bytes into a cache line makes every 16-float vector access straddle two lines."""
    per = 64 // like.itemsize
    raw = np.empty(size + per, like.dtype)
    off = (-(raw.ctypes.data // like.itemsize)) % per
    return raw[off: off + size]


@numba.njit(cache=True)
def _thread_buffers(T, block, chunk, d, like):  # pragma: no cover - compiled
    """The buffers of :func:`._forward_block._qblock` for each of ``T`` threads, allocated once per
    call (not per work item), on cache lines: queries and output rows, keys and values
    of a chunk, its scores, six row vectors and the row offsets, followed by the slots of
    a chunk's tiles and the ``chunk`` tags of a ring of them (:func:`_ring_slots`, empty).
    The scores hold at least ``block`` rows of ``d`` (:func:`._llvm_fwd._pv32_amx` stores
    ``P V`` there)."""
    wq = _aligned(T * 2 * block * d, like).reshape((T, 2, block * d))
    wkv = _aligned(T * 2 * chunk * block * d, like).reshape((T, 2, chunk * block * d))
    ns = block * max(chunk * block, d)
    ws = _aligned(T * ns, like).reshape((T, ns))
    wr = _aligned(T * 6 * block, like).reshape((T, 6, block))
    wi = np.empty((T, block + 2 * chunk), np.int64)
    wi[:, block + chunk:] = -1
    return wq, wkv, ws, wr, wi


@numba.njit(cache=True, inline="always")
def _ring_slot(ring, used, a, words):  # pragma: no cover - compiled
    """:func:`_ring_slots` for one tile that starts at word ``a``: its slot code and
    ``used`` (the bits of the slots the call's tiles took so far) with its slot's bit
    set. The tile's slot is ``a // words`` modulo the ring's size, or the next one that
    no tile of the call took."""
    s = (a // words) % ring.size
    while (used >> s) & 1:
        s = (s + 1) % ring.size
    used |= 1 << s
    if ring[s] == a:
        return -1 - s, used
    ring[s] = a
    return s, used


@numba.njit(cache=True)
def _ring_slots(ring, slots, at, offs, ntile, words):  # pragma: no cover - compiled
    """The slots of ``ntile`` tiles of ``words`` words each, tile ``t`` from word ``at +
    offs[32 t]`` (``offs`` empty: ``at + t words``; words counted from address 0) of an
    array that no one writes while ``ring`` is in use, in a ring of ``ring.size <= 62``
    slots (``ring[s]``: the word at which slot ``s``'s tile starts, -1 for none):
    ``slots[t] = s`` where tile ``t`` is to be made in slot ``s``, ``-1 - s`` where slot
    ``s`` holds it already; no two tiles of a call share a slot (:func:`_ring_slot`).
    ``at < 0``: rows of this chunk only, every tile made again (``slots[t] = t``) and the
    ring emptied. The
    paired rows of the AMX products by tiles of rows that several calls in a row use
    (:func:`._llvm_fwd._pv32_amx`: the value rows of the window's key tiles, each used by
    5 query blocks; :func:`._llvm_bwd._dkv32_amx`: the q and dO rows of query tiles)."""
    if at < 0 or ring.size > 62:
        ring[:] = -1
        for t in range(ntile):
            slots[t] = t
        return
    used = 0
    for t in range(ntile):
        a = at + (offs[32 * t] if offs.size > 0 else t * words)
        slots[t], used = _ring_slot(ring, used, a, words)


@numba.njit(cache=True, inline="always")
def _views(bufs, tid):  # pragma: no cover - compiled
    """Thread ``tid``'s buffers from :func:`_thread_buffers`, in :func:`._forward_block._qblock`'s
    argument order: ``qbuf, kbuf, vbuf, sbuf, obuf, mrow, lrow, cmax, msub, csum, alpha,
    roff``."""
    wq, wkv, ws, wr, wi = bufs
    return (wq[tid, 0], wkv[tid, 0], wkv[tid, 1], ws[tid], wq[tid, 1], wr[tid, 0], wr[tid, 1],
            wr[tid, 2], wr[tid, 3], wr[tid, 4], wr[tid, 5], wi[tid])



_WORKSPACE = threading.local()
_POOL_ARRAYS = 8  # recycled arrays a thread keeps (the least recently used one goes)
_POOL_MIN_BYTES = 1 << 20  # smaller arrays come from malloc, which recycles them itself


def _buffer(shape: tuple, dtype) -> np.ndarray:
    """An uninitialized C-contiguous array: one of the calling thread's recycled
    arrays of that size and dtype that nothing outside the pool references any more
    (no array, view, tensor or buffer made from it is alive), else a new one, which
    joins the pool.

    Why: an array of more than 32 MiB is a new ``mmap`` each time (glibc's malloc
    recycles only smaller ones), and its first touch costs a page fault per page,
    on a virtual machine also the host's; the backward's three gradients pay it three
    times. Recycling puts the kernel's outputs on the footing that malloc gives smaller
    arrays. The pool keeps up to
    ``_POOL_ARRAYS`` arrays of at least ``_POOL_MIN_BYTES`` per thread (per thread, so
    concurrent calls never share one) until :func:`release_workspace`."""
    dtype = np.dtype(dtype)
    size = math.prod(shape)
    if size * dtype.itemsize < _POOL_MIN_BYTES:
        return np.empty(shape, dtype)
    pool = getattr(_WORKSPACE, "pool", None)
    if pool is None:
        pool = _WORKSPACE.pool = []
    pad = 64 // dtype.itemsize
    for i in range(len(pool)):
        raw = pool[i]
        # referenced by the pool, by ``raw`` and by getrefcount's argument only (every
        # view handed out refers to ``raw``, numpy's base of a view of a view)
        if raw.size == size + pad and raw.dtype == dtype and sys.getrefcount(raw) == 3:
            pool.append(pool.pop(i))  # the most recently used last
            break
    else:
        raw = np.empty(size + pad, dtype)
        pool.append(raw)
        if len(pool) > _POOL_ARRAYS:
            del pool[0]  # forgotten; freed unless its user still holds it
    # on a cache line: rows of the output and the gradients are read and written in
    # 64-byte vectors, and a large np.empty starts 16 bytes into a line
    off = (-raw.ctypes.data % 64) // dtype.itemsize
    return raw[off: off + size].reshape(shape)


def release_workspace() -> None:
    """Free the arrays that the calling thread keeps for reuse: outputs and
    gradients of earlier calls that nothing references any more (the forward and
    backward take their large arrays from a per-thread pool of up to 8 such arrays;
    see ``_buffer``). Arrays still in use are not touched.

    Examples
    --------
    >>> release_workspace()
    """
    _WORKSPACE.pool = []
