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
        assert callable(getattr(rawops, name)) or getattr(rawops, name) is rawops.config, name
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
    # What can be said without a GPU still is: the package and how each family gets its kernels.
    assert done.stdout.startswith(f"rawops {rawops.__version__} at ")
    for family in _modules.families():
        kind, line = info_status_line(family)
        assert f"\n{line}\n" in done.stdout
    assert "  elementwise: " in done.stdout


def info_status_line(family, arch=None):
    from rawops.__main__ import status_line

    return status_line(family, arch)


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


# ------------------------------------------------------------------------------ each family's status (info)
def _fatbin_bytes(entries):
    """A fatbin the reader accepts: [(kind 1 PTX / 2 ELF, sm)], empty payloads."""
    import struct

    body = b"".join(struct.pack("<HHIQ", kind, 0x101, 64, 0) + bytes(12) + struct.pack("<I", sm) + bytes(32)
                    for kind, sm in entries)
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


@pytest.fixture
def installation(tmp_path, monkeypatch):
    """A fake installed package: kernel sources `plain`, `gemm` and `gemm_sm90` (arch-specific)."""
    package = tmp_path / "rawops"
    kernels = package / "_kernels"
    (kernels / "include" / "rawops").mkdir(parents=True)
    (kernels / "plain.cu").write_text("")
    (kernels / "gemm.cu").write_text("")
    (kernels / "gemm_sm90.cu").write_text("// rawops-arch: 90a\n")
    fatbins = package / "_fatbin"
    fatbins.mkdir()
    monkeypatch.setattr(_modules, "PACKAGE_DIR", str(package))
    monkeypatch.setattr(_modules, "FATBIN_DIR", str(fatbins))
    monkeypatch.setattr(_modules, "CHECKOUT_KERNELS", str(tmp_path / "no-checkout"))
    monkeypatch.setattr(rawops.config, "force_nvrtc", False)
    monkeypatch.setattr(rawops.config, "dev_kernels", False)
    return fatbins


def test_status_of_a_build_without_nvcc_is_nvrtc_and_the_arch_specific_family_unavailable(installation):
    assert _modules.family_status("plain")[0] == "nvrtc"
    assert "NVRTC compiles the shipped source at first use" in _modules.family_status("plain")[1]
    assert _modules.family_status("gemm_sm90") == ("unavailable", "this installation was built without nvcc")
    assert _modules.portable_family("gemm_sm90") == "gemm" and _modules.portable_family("gemm") is None
    kind, line = info_status_line("gemm_sm90")
    assert line == ("  gemm_sm90: unavailable (this installation was built without nvcc); "
                    "its ops run the portable gemm kernels")


def test_status_of_prebuilt_fatbins_and_what_a_gpu_can_run(installation):
    (installation / "plain.fatbin").write_bytes(_fatbin_bytes([(2, 80), (2, 90), (1, 90)]))
    (installation / "gemm_sm90.fatbin").write_bytes(_fatbin_bytes([(2, 90)]))
    (installation / "manifest.json").write_text('{"specific": {"gemm_sm90": ["sm_90a"]}}')
    assert _modules.family_status("plain") == ("fatbin", "prebuilt fatbin [sm_80 sm_90 compute_90]")
    assert _modules.family_status("gemm_sm90") == ("fatbin", "prebuilt fatbin [sm_90a]")
    assert _modules.family_status("plain", 86)[0] == "fatbin"  # sm_80 SASS runs on sm_86
    assert _modules.family_status("plain", 120)[0] == "fatbin"  # PTX compute_90 is JIT-compiled
    assert _modules.family_status("plain", 75) == (
        "unavailable", "its fatbin holds no code for sm_75 (sm_80 sm_90 compute_90)")
    assert _modules.family_status("gemm_sm90", 90)[0] == "fatbin"
    assert _modules.family_status("gemm_sm90", 80) == ("unavailable", "its kernels are for sm_90a only, not sm_80")
    assert info_status_line("gemm_sm90", 80)[1].endswith("; its ops run the portable gemm kernels")


def test_status_follows_the_config_switches(installation, monkeypatch):
    (installation / "plain.fatbin").write_bytes(_fatbin_bytes([(2, 90)]))
    monkeypatch.setattr(rawops.config, "force_nvrtc", True)
    assert _modules.family_status("plain") == (
        "nvrtc", "NVRTC compiles the shipped source at first use (config.force_nvrtc)")
    monkeypatch.setattr(rawops.config, "dev_kernels", True)
    assert _modules.family_status("plain")[0] == "dev"
    assert _modules.family_status("gemm_sm90", 80)[0] == "unavailable"


def test_status_names_why_the_build_left_a_family_out(installation):
    (installation / "manifest.json").write_text(
        '{"unavailable": {"gemm_sm90": "no CuTe/CUTLASS headers (pip install nvidia-cutlass)"}}')
    assert _modules.family_status("gemm_sm90") == (
        "unavailable", "no CuTe/CUTLASS headers (pip install nvidia-cutlass)")
    (installation / "manifest.json").write_text('{"unavailable": {}}')  # a partial build left it out
    assert _modules.family_status("gemm_sm90") == ("unavailable", "not built in this installation")
    (installation.parent / "_kernels" / "plain.cu").unlink()
    assert _modules.family_status("plain") == ("unavailable", "neither a fatbin nor its source in this installation")


def test_info_on_a_gpu_prints_each_familys_status_and_its_loaded_kernels(monkeypatch, capsys):
    """The GPU half of `info`, with the driver faked: an sm_80 GPU, on which the Hopper GEMM is unavailable."""
    import ctypes

    import cupy

    from rawops import __main__ as cli

    monkeypatch.setattr(ctypes, "CDLL", lambda name: object())
    monkeypatch.setattr(cupy.cuda.runtime, "getDeviceCount", lambda: 1)
    monkeypatch.setattr(cupy.cuda.runtime, "driverGetVersion", lambda: 13000)
    monkeypatch.setattr(cupy.cuda.runtime, "getDeviceProperties", lambda device: {
        "name": b"Fake A100", "major": 8, "minor": 0, "multiProcessorCount": 108, "totalGlobalMem": 80 << 30})
    monkeypatch.setattr(_modules, "compute_capability", lambda device: 80)
    loaded = []
    monkeypatch.setattr(_modules, "get_function", lambda family, name, device: loaded.append((family, name)))
    assert cli.info() == 0
    out = capsys.readouterr().out
    assert "device 0: Fake A100 sm_80, 108 SMs, 80.0 GiB\non device 0 (sm_80):\n" in out
    families = _modules.families()
    for family in families:
        kind, line = cli.status_line(family, 80)
        if kind == "unavailable":
            assert f"\n{line}\n" in out
        else:
            count = len(cli.entry_points(family))
            assert count and f"\n{line}; {count} kernels loaded\n" in out
    if "gemm_sm90" in families:
        assert "  gemm_sm90: unavailable (its kernels are for sm_90a only, not sm_80); its ops run the portable " \
               "gemm kernels" in out
        assert not [name for family, name in loaded if family == "gemm_sm90"]


def test_info_reports_a_family_whose_kernels_fail_to_load_and_exits_1(monkeypatch, capsys):
    import ctypes

    import cupy

    from rawops import __main__ as cli

    monkeypatch.setattr(ctypes, "CDLL", lambda name: object())
    monkeypatch.setattr(cupy.cuda.runtime, "getDeviceCount", lambda: 1)
    monkeypatch.setattr(cupy.cuda.runtime, "driverGetVersion", lambda: 13000)
    monkeypatch.setattr(cupy.cuda.runtime, "getDeviceProperties", lambda device: {
        "name": b"Fake H100", "major": 9, "minor": 0, "multiProcessorCount": 132, "totalGlobalMem": 80 << 30})
    monkeypatch.setattr(_modules, "compute_capability", lambda device: 90)

    def get_function(family, name, device):
        if family == "elementwise":
            raise RuntimeError("NVRTC rejected elementwise.cu\nlog ...")

    monkeypatch.setattr(_modules, "get_function", get_function)
    assert cli.info() == 1
    out = capsys.readouterr().out
    assert "; loading failed: RuntimeError: NVRTC rejected elementwise.cu\n" in out
