# cython: language_level=3, boundscheck=False, wraparound=False
"""Streams and capture: a launch goes on the caller's current stream of the data's device
(CuPy's, or torch's in the adapter) unless `stream=` names one; arrays whose producer names a
stream (CAI v3, DLPack) are ordered before it on the GPU; what a captured call allocates for
itself is held while its graph may replay.
"""
from contextlib import nullcontext as _nullcontext
from libc.stdint cimport uintptr_t

from rawops._launch.arrays cimport DeviceArray
from rawops._launch.driver cimport import_cupy, stream_wait

cdef object _get_current_stream = None  # cupy.cuda.get_current_stream


cpdef uintptr_t stream_pointer(object stream, int device) except? 0:
    """A raw CUstream from None (CuPy's current stream on `device`), a CuPy/torch stream
    object, an object with __cuda_stream__, or an int handle. A stream object of another GPU
    than `device` (the arrays') is a ValueError, raised before anything is launched there."""
    global _get_current_stream
    if stream is None:
        if _get_current_stream is None:
            _get_current_stream = import_cupy().cuda.get_current_stream
        return _get_current_stream(device).ptr
    cdef uintptr_t handle
    cdef int owner = -1
    if isinstance(stream, int):
        if stream < 0:
            raise ValueError(f"stream must be a non-negative handle, got {stream}")
        handle = stream
    else:
        for attribute in ("ptr", "cuda_stream"):
            value = getattr(stream, attribute, None)
            if isinstance(value, int):
                handle = value
                break
        else:
            if not hasattr(stream, "__cuda_stream__"):
                raise TypeError(f"stream must be None, an int handle or a CUDA stream object, got {type(stream).__name__}")
            handle = stream.__cuda_stream__()[1]
        owner = _object_device(stream)
    if owner >= 0 and owner != device:
        raise ValueError(f"stream is on device {owner}, the arrays on device {device}; pass a stream of their GPU")
    return handle


cdef int _object_device(object stream) except -2:
    """The GPU a stream object says it belongs to (CuPy: device_id, torch: device_index); -1
    when it does not say. A raw int handle is taken as given: the driver dereferences what it
    is handed (cuStreamGetDevice on a stray int can crash the process)."""
    for attribute in ("device_id", "device_index"):
        value = getattr(stream, attribute, None)
        if isinstance(value, int) and value >= 0:
            return value
    return -1


class _StreamHandle:
    """A raw CUstream through the CUDA stream protocol (for CuPy's Stream.from_external, which
    does not own the stream)."""
    __slots__ = ("handle",)

    def __init__(self, handle):
        self.handle = handle

    def __cuda_stream__(self):
        return (0, self.handle)


_NO_STREAM_GIVEN = _nullcontext()


def allocating_on(stream, uintptr_t s):
    """A context in which CuPy allocates on the launches' stream `s` where the caller gave one
    (`stream`, as passed); enter it on the arrays' device. CuPy's pool hands out blocks per
    current stream, ordered only with that stream's work: an output or scratch block taken on
    the current stream and written on another could still be in use by the current stream's
    queued work (tests/test_streams.py)."""
    if stream is None:
        return _NO_STREAM_GIVEN
    cupy = import_cupy()
    if isinstance(stream, cupy.cuda.Stream):
        return stream
    from_external = getattr(cupy.cuda.Stream, "from_external", None)  # CuPy 14; ExternalStream is deprecated there
    return from_external(_StreamHandle(s)) if from_external is not None else cupy.cuda.ExternalStream(s)


_captured_scratch = []  # scratch that captured launches use: their graphs may replay at any time


def hold_if_capturing(uintptr_t s, *scratch):
    """Keep `scratch` (what a call allocated for itself: partial sums, split-K slabs, an
    intermediate) alive while stream `s` is being captured into a CUDA graph. Back in CuPy's
    pool, a block could be handed to a later array while the graph's replays still write it.
    Held until release_captured_scratch(). The legacy streams (0, 1) cannot be captured."""
    if s <= 1 or not import_cupy().cuda.runtime.streamIsCapturing(s):
        return
    _captured_scratch.extend(a for a in scratch if a is not None)


def release_captured_scratch():
    """Free the scratch of every call captured so far (see hold_if_capturing): call it once no
    graph captured from rawops' CuPy API will replay again. Returns how many buffers it freed."""
    count = len(_captured_scratch)
    _captured_scratch.clear()
    return count


cdef bint _same_stream(uintptr_t a, uintptr_t b):
    # 0 and 1 both name the legacy default stream.
    return a == b or (a <= 1 and b <= 1)


cpdef int wait_for_producer(DeviceArray a, uintptr_t stream) except -1:
    """CAI v3 / DLPack: order our stream after the producer's, without blocking the host."""
    if a.stream is None or _same_stream(<uintptr_t>a.stream, stream):
        return 0
    return stream_wait(stream, <uintptr_t>a.stream)
