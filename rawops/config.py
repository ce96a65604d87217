"""rawops' switches, in one place: `rawops.config.<name>`, read when a call plans its launch.

    import rawops
    rawops.config.linear_tf32 = True       # opt-in: float32 linear_gelu <= 128 rows on 3xTF32
    with rawops.config.override(gemm_sm90=False):
        ...                                # portable GEMM kernels inside this block only

Each switch starts from the environment variable `RAWOPS_<NAME>` (upper case) when it is set
(`1`/`true`/`yes`/`on` or `0`/`false`/`no`/`off`), else from its default. Setting an unknown
name, or a value of the wrong type, is an error. Every default is the fastest choice that keeps
each dtype's accuracy (float32 results within torch's float32 error); `linear_tf32` is an opt-in
that trades float32 accuracy for speed. The other switches exist to compare paths (the benchmarks
and tests do) and to step around a path on a machine where it misbehaves.
`rawops.config.describe()` lists them with their values.

The module is the configuration object: `import rawops.config`, `from rawops import config`
and `rawops.config` are the same object.
"""
import contextlib
import os
import sys
import types

# name -> (default, documentation). Booleans unless the default says otherwise.
SWITCHES = {
    "linear_tf32": (False, "opt-in: float32 linear_gelu forwards of <= 128 rows on sm_90+ run 3xTF32 on tensor "
                           "cores (faster; near float32's error, up to ~3x torch's at one row); False: exact FFMA "
                           "at every size."),
    "mlp_tf32": (True, "the float32 source network (100-128-64-10) beyond 4096 rows runs on the tensor pipe on "
                       "sm_80+, forward and backward: 3xTF32 with each k8 slice's tensor-core sum added in float32 "
                       "(float32's accuracy); False: exact FFMA."),
    "mlp_fast_forward": (True, "half-type fused_mlp forwards keep activations in registers (mma.sync, sm_80+) "
                               "where the weights fit in shared memory; False: the WMMA tile kernels."),
    "mlp_fast_backward": (True, "half-type fused_mlp backwards run as one fused kernel (sm_80+, widths 16..64); "
                                "False: the chain + weight-gradient tile kernels."),
    "gemm_sm90": (True, "GEMMs on sm_90 run the WGMMA + TMA kernel where it takes the shape; False: the "
                        "portable mma.sync / FFMA kernels."),
    "gemm_sm90_narrow": (True, "outputs too small to fill an sm_90 GPU with 128 x 256 tiles run the WGMMA kernel's "
                               "narrow tiles and K splits, and those that fill it its 128-wide tiles where the "
                               "planner's model rates them faster than 256; False: the portable kernels for the "
                               "former, 256 wide for the latter."),
    "gemm_sm90_shape": (None, "None, or (tile width, K splits) forced on every WGMMA launch (tests and "
                              "experiments; tile width one of 256, 128, 64)."),
    "f32_3xtf32": (True, "float32 GEMMs of >= 2^30 FLOP on sm_90 (matmul, linear_gelu and their gradients, "
                          "without tf32=True) run 3xTF32 on WGMMA with each stage's sums added in float32 "
                          "(float32's accuracy; scratch of 2 x the operands; outputs that inf or NaN inputs reach "
                          "summed again exactly, as torch's). False: exact FFMA."),
    "tf32_sm90": (True, "matmul(..., tf32=True) on sm_90 runs on WGMMA; False: on mma.sync."),
    "tf32_wide": (True, "TF32 nn GEMMs that fill the GPU with 128 x 256 tiles use them (sm_80/90/100)."),
    "bias_gelu_backward_tiles": (True, "bias_gelu's backward (and linear_gelu's dbias) runs as short row tiles "
                                       "where the last dim is whole 64-column tiles; False: the column walkers."),
    "exact_half_dbias": (True, "float16 bias_gelu backwards of >= 2^24 elements sum dbias exactly in int64 fixed "
                               "point (deterministic bits in any order); False: float32 partial rows."),
    "norm_full_rows": (None, "16-bit layer_norm backwards of rows that fill every thread's vectors (2048, 4096, "
                             "8192 wide): None (default) lets the device choose, the full-rows entry (stepped row "
                             "pointers, one-barrier row sums) where its memory is fast an SM (fast_memory: the "
                             "H200, not the H100), a block a row elsewhere; True / False: always / never the "
                             "full-rows entry (bench_norm times both)."),
    "dependent_launch": (True, "on sm_90+ a kernel that only finishes its predecessor's work (the column sums, "
                               "the MLP's gradient reduce, normalize_volume's map) is launched programmatically "
                               "dependent."),
    "dev_kernels": (False, "kernel authors: rebuild an edited kernels/<family>.cu of a source checkout with nvcc "
                           "for the current GPU at first use, cached by content hash (needs nvcc)."),
    "force_nvrtc": (False, "compile the shipped kernel sources with NVRTC even where a fatbin exists (tests)."),
}

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")
_TRISTATE = ("norm_full_rows",)  # None (the device decides), True or False; environment: auto, or as a boolean


def _from_environment(name, default):
    text = os.environ.get(f"RAWOPS_{name.upper()}")
    if text is None or not (isinstance(default, bool) or name in _TRISTATE):
        return default
    value = text.strip().lower()
    if name in _TRISTATE and value in ("auto", "none"):
        return None
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"RAWOPS_{name.upper()}={text!r}: expected one of 1/true/yes/on or 0/false/no/off"
                     + (" or auto" if name in _TRISTATE else ""))


def _check(name, value):
    if name not in SWITCHES:
        raise AttributeError(f"rawops.config has no switch {name!r}; the switches: {', '.join(SWITCHES)}")
    default = SWITCHES[name][0]
    if name in _TRISTATE:
        if value is not None and not isinstance(value, bool):
            raise TypeError(f"rawops.config.{name} must be None, True or False, got {value!r}")
    elif isinstance(default, bool):
        if not isinstance(value, bool):
            raise TypeError(f"rawops.config.{name} must be True or False, got {value!r}")
    elif name == "gemm_sm90_shape" and value is not None:
        if (not isinstance(value, tuple) or len(value) != 2 or value[0] not in (256, 128, 64)
                or not isinstance(value[1], int) or value[1] < 1):
            raise ValueError(f"rawops.config.gemm_sm90_shape must be None or (256|128|64, splits >= 1), got {value!r}")
    return value


class _Config(types.ModuleType):
    """The module's class: assignments to a switch are checked; reads are plain attributes."""

    def __setattr__(self, name, value):
        if name.startswith("_") or name not in SWITCHES and name in self.__dict__:
            return super().__setattr__(name, value)
        super().__setattr__(name, _check(name, value))
        # Launch plans cached under other values are stale: their caches compare this.
        super().__setattr__("_generation", self.__dict__.get("_generation", 0) + 1)

    def __repr__(self):
        return "rawops.config(" + ", ".join(f"{name}={getattr(self, name)!r}" for name in SWITCHES) + ")"

    def describe(self):
        """Each switch with its value, its environment variable and what it does."""
        return "\n".join(f"{name} = {getattr(self, name)!r}  (RAWOPS_{name.upper()})\n    {doc}"
                         for name, (_, doc) in SWITCHES.items())

    @contextlib.contextmanager
    def override(self, **values):
        """Set switches for the duration of a `with` block; restored after it (also on an error)."""
        saved = {name: getattr(self, name) for name in values}
        try:
            for name, value in values.items():
                setattr(self, name, value)
            yield self
        finally:
            for name, value in saved.items():
                setattr(self, name, value)

    def reset(self):
        """Every switch back to its environment value, else its default."""
        for name, (default, _) in SWITCHES.items():
            setattr(self, name, _from_environment(name, default))


sys.modules[__name__].__class__ = _Config
sys.modules[__name__].reset()
