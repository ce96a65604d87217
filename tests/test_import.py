"""Importing rawops and its command line, without a GPU (and without torch)."""
import json
import os
import subprocess
import sys

import pytest

import rawops
from rawops import _modules


def _run_python(*args, env_extra=None, timeout=60):
    env = dict(os.environ)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, env=env)


def _gpu_usable():
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no driver, no device, or a driver older than the runtime
        return False


# ------------------------------------------------------------------------------ no torch
IMPORT_PROBE = """
import builtins, json, sys
import rawops
import rawops.elementwise
from rawops import gelu, bias_gelu, column_sum, as_array
print(json.dumps({"in_sys_modules": "torch" in sys.modules,
                  "attempted": getattr(builtins, "_rawops_test_torch_imported", False)}))
"""


def test_import_rawops_never_imports_torch(tmp_path):
    # A decoy `torch` first on sys.path records any import attempt, so the test can fail
    # whether or not the real torch is installed.
    decoy = tmp_path / "decoy" / "torch"
    decoy.mkdir(parents=True)
    (decoy / "__init__.py").write_text("import builtins\nbuiltins._rawops_test_torch_imported = True\n")
    path = os.pathsep.join([str(tmp_path / "decoy"), os.environ.get("PYTHONPATH", "")])
    done = _run_python("-c", IMPORT_PROBE, env_extra={"PYTHONPATH": path})
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"in_sys_modules": False, "attempted": False}


def test_import_rawops_leaves_the_real_torch_unimported():
    pytest.importorskip("torch")  # only meaningful where torch could be imported
    done = _run_python("-c", "import sys, rawops, rawops.elementwise; print('torch' in sys.modules)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_public_api_is_importable_and_versioned():
    for name in rawops.__all__:
        assert callable(getattr(rawops, name)) or name == "config", name
    assert rawops.config is __import__("rawops.config").config, "the module is the configuration object"
    assert rawops.__version__.count(".") == 2


# ------------------------------------------------------------------------------ python -m rawops
@pytest.mark.skipif(_gpu_usable(), reason="a usable GPU is present; this checks the no-GPU message")
def test_info_without_a_gpu_fails_with_one_line_and_no_traceback():
    done = _run_python("-m", "rawops", "info")
    assert done.returncode != 0
    assert "Traceback" not in done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, f"stderr should be one line, got:\n{done.stderr}"
    assert lines[0].startswith("rawops: ") and ("GPU" in lines[0] or "driver" in lines[0])
    # What can be said without a GPU still is: the package and each family.
    assert done.stdout.startswith(f"rawops {rawops.__version__} at ")
    assert "  elementwise: " in done.stdout


@pytest.mark.parametrize("argv", [[], ["inf"], ["info", "extra"], ["--help"]])
def test_module_without_the_info_command_prints_usage_and_exits_2(argv):
    done = _run_python("-m", "rawops", *argv)
    assert done.returncode == 2
    assert done.stderr.strip() == "usage: python -m rawops info"
    assert "Traceback" not in done.stderr


# ------------------------------------------------------------------------------ module discovery
def test_families_include_elementwise():
    assert "elementwise" in _modules.families()


def test_kernel_sources_for_the_nvrtc_fallback_are_present():
    source_dir = _modules.kernel_source_dir()
    assert os.path.isfile(os.path.join(source_dir, "elementwise.cu"))
    assert os.path.isfile(os.path.join(source_dir, "include", "rawops", "dtype.cuh"))


def test_kernel_source_dir_is_the_checkout_in_a_source_tree_and_the_package_copy_otherwise(tmp_path, monkeypatch):
    assert _modules.kernel_source_dir() in (_modules.CHECKOUT_KERNELS, os.path.join(_modules.PACKAGE_DIR, "_kernels"))
    monkeypatch.setattr(_modules, "CHECKOUT_KERNELS", str(tmp_path / "no-such-dir"))
    assert _modules.kernel_source_dir() == os.path.join(_modules.PACKAGE_DIR, "_kernels")


def test_kernel_source_dir_ignores_an_unrelated_kernels_package_next_to_rawops(tmp_path, monkeypatch):
    # Installed, CHECKOUT_KERNELS is <site-packages>/kernels, which is where other
    # distributions install a top-level `kernels` package (e.g. PyPI's `kernels`). It must not
    # be mistaken for rawops' sources, or the NVRTC fallback opens a missing <family>.cu.
    unrelated = tmp_path / "kernels"
    unrelated.mkdir()
    (unrelated / "__init__.py").write_text("")
    monkeypatch.setattr(_modules, "CHECKOUT_KERNELS", str(unrelated))
    assert _modules.kernel_source_dir() == os.path.join(_modules.PACKAGE_DIR, "_kernels")


def test_families_list_fatbins_and_sources(tmp_path, monkeypatch):
    fatbins = tmp_path / "_fatbin"
    fatbins.mkdir()
    (fatbins / "alpha.fatbin").write_bytes(b"")
    (fatbins / "notes.txt").write_text("")
    sources = tmp_path / "kernels"
    sources.mkdir()
    (sources / "beta.cu").write_text("")
    (sources / "alpha.cu").write_text("")
    (sources / "include" / "rawops").mkdir(parents=True)
    (sources / "include" / "rawops" / "dtype.cuh").write_text("")
    (tmp_path / "setup.py").write_text("")  # a source checkout: kernels/ beside setup.py
    monkeypatch.setattr(_modules, "FATBIN_DIR", str(fatbins))
    monkeypatch.setattr(_modules, "CHECKOUT_KERNELS", str(sources))
    assert _modules.families() == ["alpha", "beta"]
    assert _modules.fatbin_path("alpha") == str(fatbins / "alpha.fatbin")


def test_a_kernels_dynamic_shared_memory_limit_is_only_raised_and_checked_against_the_device(monkeypatch):
    # One kernel serves launches of different sizes: a smaller launch must not lower the limit
    # a larger one set (its next launch would fail with CUDA_ERROR_INVALID_VALUE), and a size
    # the device cannot hold is refused before any launch.
    import cupy

    kernel = type("Kernel", (), {"max_dynamic_shared_size_bytes": 0, "shared_size_bytes": 1024})()
    monkeypatch.setattr(_modules, "get_function", lambda family, name, device: kernel)
    monkeypatch.setattr(cupy.cuda.runtime, "deviceGetAttribute", lambda attribute, device: 232448)
    monkeypatch.setattr(_modules, "_shared_allowed", {})
    assert _modules.allow_dynamic_shared("f", "k", 0, 40000) and kernel.max_dynamic_shared_size_bytes == 0
    for nbytes in (196096, 100000, 196096, 200000):
        assert _modules.allow_dynamic_shared("f", "k", 0, nbytes)
        assert kernel.max_dynamic_shared_size_bytes >= nbytes
    assert kernel.max_dynamic_shared_size_bytes == 200000
    assert not _modules.allow_dynamic_shared("f", "k", 0, 232448)  # + 1 KB static: over the opt-in
    assert kernel.max_dynamic_shared_size_bytes == 200000
    # 48 KB of dynamic memory beside 1 KB of static storage is over the default: it opts in
    fresh = type("Kernel", (), {"max_dynamic_shared_size_bytes": 0, "shared_size_bytes": 1024})()
    monkeypatch.setattr(_modules, "get_function", lambda family, name, device: fresh)
    assert _modules.allow_dynamic_shared("f", "k2", 0, 48 * 1024 - 1024) and fresh.max_dynamic_shared_size_bytes == 0
    assert _modules.allow_dynamic_shared("f", "k2", 0, 48 * 1024) and fresh.max_dynamic_shared_size_bytes == 48 * 1024
