"""Values that both the CUDA kernels and the Python launchers need, defined here once.

The build passes every upper-case name below to nvcc as `-DRAWOPS_<NAME>=<value>` (and the
NVRTC fallback and the development rebuild pass the same), so a kernel reads
`RAWOPS_MAP_UNROLL` where Python reads `_constants.MAP_UNROLL`; a kernel file that uses one
fails to compile without it. Standard library only: setup.py loads this file by path.
Grouped by family; each value's meaning is documented where the kernel uses it.
"""

# elementwise: vectors of 16 bytes a thread handles per block step of the map kernels
MAP_UNROLL = 1


def defines():
    """The -D flags of every constant, sorted by name (part of the fatbin cache key)."""
    return [f"-DRAWOPS_{name}={value}" for name, value in sorted(globals().items())
            if name.isupper() and isinstance(value, int) and not isinstance(value, bool)]
