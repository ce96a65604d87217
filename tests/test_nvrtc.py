"""The no-nvcc path: every shipped kernel source compiles with NVRTC and the options rawops
gives it (rawops._modules.nvrtc_options), for the GPU the device tool lends. No GPU needed:
NVRTC is a host library."""
import glob
import os

import pytest

from rawops import _modules, _nvcc


def _nvrtc():
    try:
        from cupy_backends.cuda.libs import nvrtc

        nvrtc.getVersion()
        return nvrtc
    except Exception:  # library not installed: pip install nvidia-cuda-nvrtc
        return None


def _cuda_include():
    """cuda_fp16.h / cuda_bf16.h: from the toolkit here, else the nvidia-cuda-runtime wheel's (on a
    user's machine, from CuPy's)."""
    import sys

    nvcc = _nvcc.find_nvcc()
    wheels = [os.path.dirname(path) for entry in sys.path
              for path in sorted(glob.glob(os.path.join(entry or ".", "nvidia", "cu*", "include")))]
    for root in (os.environ.get("CUDA_HOME"), os.path.dirname(os.path.dirname(os.path.realpath(nvcc or ""))),
                 "/usr/local/cuda", *wheels):
        if root and os.path.exists(os.path.join(root, "include", "cuda_bf16.h")):
            return os.path.join(root, "include")
    return None


NVRTC = _nvrtc()
ALL_SOURCES = sorted(glob.glob(os.path.join(_modules.kernel_source_dir(), "*.cu")))
# A family built for specific targets (the Hopper GEMM, CuTe headers) has no NVRTC fallback:
# without its fatbin its callers use the portable kernels (tests/test_gemm_sm90.py).
SOURCES = [s for s in ALL_SOURCES if _nvcc.arch_directive(s) is None]


def test_only_the_arch_specific_families_lack_the_nvrtc_fallback():
    skipped = sorted(os.path.basename(s) for s in ALL_SOURCES if s not in SOURCES)
    assert skipped == ["gemm_sm90.cu"]


@pytest.mark.skipif(NVRTC is None, reason="NVRTC not installed (pip install nvidia-cuda-nvrtc)")
@pytest.mark.skipif(_cuda_include() is None,
                    reason="no CUDA headers (cuda_bf16.h): pip install nvidia-cuda-runtime (the test extra has it)")
@pytest.mark.parametrize("source", SOURCES, ids=[os.path.basename(s) for s in SOURCES])
def test_kernel_source_compiles_with_nvrtc(source):
    with open(source) as f:
        program = NVRTC.createProgram(f.read(), os.path.basename(source), (), ())
    options = [*_modules.nvrtc_options(), f"-I{_cuda_include()}", "--gpu-architecture=sm_90"]
    try:
        NVRTC.compileProgram(program, options)
    except Exception:
        pytest.fail(f"NVRTC rejected {source}:\n{NVRTC.getProgramLog(program)}")
    finally:
        NVRTC.destroyProgram(program)


def test_every_kernel_family_is_covered():
    assert {os.path.basename(s)[:-3] for s in ALL_SOURCES} == set(_modules.families())
