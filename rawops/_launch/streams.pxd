"""Streams and capture: which stream a launch goes on, ordering with producers, and the
scratch that captured launches keep alive."""
from libc.stdint cimport uintptr_t

from rawops._launch.arrays cimport DeviceArray

cpdef uintptr_t stream_pointer(object stream, int device) except? 0
cpdef int wait_for_producer(DeviceArray a, uintptr_t stream) except -1
