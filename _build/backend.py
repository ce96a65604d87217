"""The build backend: setuptools' own, plus a CUDA compiler where the machine has none.

pyproject.toml names this module (`backend-path = ["_build"]`). Where rawops/_nvcc.py's
locate_nvcc finds no nvcc (RAWOPS_NVCC, CUDA_HOME, CUDA_PATH, PATH), building a wheel or an
editable install also requires the nvidia-cuda-nvcc wheel and the headers the kernels include
(rawops/_nvcc.py NVCC_WHEELS), pinned to the toolkit that built the shipped fatbins; setup.py
then finds that nvcc in the build environment. With RAWOPS_NVCC=none nothing is added and the
build ships the kernel sources only (NVRTC compiles them at first use).
"""
import importlib.util
import os

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F401,F403  (every hook this module does not override)


def _nvcc_helpers():
    # By path, as setup.py loads it: rawops is not importable while it is being built.
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "rawops", "_nvcc.py")
    spec = importlib.util.spec_from_file_location("_rawops_nvcc", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def toolkit_requirements():
    """The CUDA wheels this build needs: none where an nvcc is found or RAWOPS_NVCC=none."""
    helpers = _nvcc_helpers()
    nvcc, why = helpers.locate_nvcc()
    if nvcc is not None or why.startswith(helpers.NVCC_ENV):
        return []
    return list(helpers.NVCC_WHEELS)


def get_requires_for_build_wheel(config_settings=None):
    return _setuptools.get_requires_for_build_wheel(config_settings) + toolkit_requirements()


def get_requires_for_build_editable(config_settings=None):
    return _setuptools.get_requires_for_build_editable(config_settings) + toolkit_requirements()
