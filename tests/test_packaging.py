"""Packaging: what a wheel built from a clean checkout contains, with and without nvcc.

Wheels are built with `pip wheel --no-build-isolation --no-deps` from a copy of the source
tree (no build outputs), with RAWOPS_CUDA_ARCH_LIST=9.0 so nvcc compiles one architecture
only: about 20 s per wheel on two cores. Set RAWOPS_SKIP_WHEEL_TESTS=1 to skip the builds.
"""
import email.parser
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import rawops
from rawops import _fatbin_info, _nvcc

REPO = Path(__file__).resolve().parents[1]
FATBIN = "rawops/_fatbin/elementwise.fatbin"
MANIFEST = "rawops/_fatbin/manifest.json"
SOURCES = ("rawops/_kernels/elementwise.cu", "rawops/_kernels/include/rawops/dtype.cuh")
MODULES = ("__init__", "__main__", "_modules", "_nvcc", "_fatbin_info", "elementwise")
EXTENSION = re.compile(r"^rawops/_launch\.[^/]*\.so$")
BUILD_OUTPUTS = shutil.ignore_patterns(
    ".git", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".whl", "tests",
    "_fatbin", "_kernels", "*.so", "_launch.c")

needs_source_tree = pytest.mark.skipif(
    not (REPO / "setup.py").is_file() or not (REPO / "kernels").is_dir(),
    reason="not running from a source checkout")
wheel_builds = pytest.mark.skipif(os.environ.get("RAWOPS_SKIP_WHEEL_TESTS") == "1",
                                  reason="RAWOPS_SKIP_WHEEL_TESTS=1")


def _clean_copy(dst):
    shutil.copytree(REPO, dst, ignore=BUILD_OUTPUTS)
    return dst


def _build_wheel(src, out, env):
    env = {**env, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-v", str(src), "-w", str(out)],
        capture_output=True, text=True, timeout=300, env=env)
    log = done.stdout + done.stderr
    assert done.returncode == 0, f"pip wheel failed:\n{log[-6000:]}"
    wheels = list(Path(out).glob("rawops-*.whl"))
    assert len(wheels) == 1, f"expected one wheel in {out}, got {wheels}"
    return wheels[0], log


def _names(wheel):
    with zipfile.ZipFile(wheel) as zf:
        return set(zf.namelist())


def _env_without_nvcc():
    """os.environ with a PATH that has Python and the C compiler but no nvcc, or None."""
    dirs = [os.path.dirname(sys.executable), "/usr/bin", "/bin"]
    path = os.pathsep.join(d for d in dirs if os.path.isdir(d))
    if shutil.which("nvcc", path=path) or not (shutil.which("cc", path=path) or shutil.which("gcc", path=path)):
        return None
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH")}
    env["PATH"] = path
    return env


@pytest.fixture(scope="module")
def nvcc_wheel(tmp_path_factory):
    if _nvcc.find_nvcc() is None:
        pytest.skip("nvcc not found: cannot build the kernels")
    root = tmp_path_factory.mktemp("nvcc_wheel")
    src = _clean_copy(root / "src")
    return _build_wheel(src, root / "dist", {**os.environ, _nvcc.ARCH_ENV: "9.0"})


@pytest.fixture(scope="module")
def no_nvcc_env():
    env = _env_without_nvcc()
    if env is None:
        pytest.skip("cannot build a PATH with a C compiler but without nvcc on this machine")
    return env


# ------------------------------------------------------------------------------ metadata, no build
@needs_source_tree
def test_project_version_matches_the_package_and_torch_is_only_an_extra():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["version"] == rawops.__version__
    assert not any(re.match(r"torch\b", dep) for dep in project["dependencies"])


# ------------------------------------------------------------------------------ with nvcc
@needs_source_tree
@wheel_builds
def test_wheel_ships_the_fatbin_kernel_sources_launcher_and_modules(nvcc_wheel):
    wheel, _ = nvcc_wheel
    names = _names(wheel)
    assert FATBIN in names
    for path in SOURCES:
        assert path in names
    assert [n for n in names if EXTENSION.match(n)], f"no compiled rawops/_launch*.so in {sorted(names)}"
    for module in MODULES:
        assert f"rawops/{module}.py" in names
    assert not [n for n in names if n.startswith(("tests/", "kernels/", "build/"))], sorted(names)
    assert "rawops/_launch.c" not in names, "the launcher's generated C is a build intermediate"


@needs_source_tree
@wheel_builds
def test_wheel_fatbin_holds_exactly_the_architectures_asked_for_at_build_time(nvcc_wheel, tmp_path):
    wheel, log = nvcc_wheel
    assert "rawops: nvcc elementwise.cu -> elementwise.fatbin [sm_90]" in log
    fatbin = tmp_path / "elementwise.fatbin"
    with zipfile.ZipFile(wheel) as zf:
        fatbin.write_bytes(zf.read(FATBIN))
    assert _fatbin_info.fatbin_architectures(str(fatbin)) == ["sm_90"]
    with zipfile.ZipFile(wheel) as zf:
        manifest = json.loads(zf.read(MANIFEST))
    assert (manifest["archs"], manifest["ptx"]) == (["sm_90"], [])


@needs_source_tree
@wheel_builds
def test_wheel_kernel_sources_are_the_checkouts(nvcc_wheel):
    wheel, _ = nvcc_wheel
    with zipfile.ZipFile(wheel) as zf:
        for path in SOURCES:
            original = REPO / "kernels" / path[len("rawops/_kernels/"):]
            assert zf.read(path) == original.read_bytes(), path


@needs_source_tree
@wheel_builds
def test_wheel_metadata_has_the_version_and_no_hard_torch_dependency(nvcc_wheel):
    wheel, _ = nvcc_wheel
    with zipfile.ZipFile(wheel) as zf:
        meta_name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        meta = email.parser.Parser().parsestr(zf.read(meta_name).decode())
    assert meta["Name"] == "rawops"
    assert meta["Version"] == rawops.__version__
    for requirement in meta.get_all("Requires-Dist") or []:
        if re.match(r"torch\b", requirement):
            assert "extra ==" in requirement, f"torch must stay optional: {requirement}"


# ------------------------------------------------------------------------------ without nvcc
@needs_source_tree
@wheel_builds
def test_wheel_without_nvcc_ships_sources_and_launcher_but_no_fatbin(tmp_path, no_nvcc_env):
    src = _clean_copy(tmp_path / "src")
    wheel, log = _build_wheel(src, tmp_path / "dist", no_nvcc_env)
    assert "rawops: WARNING nvcc not found; shipping kernel sources only" in log
    names = _names(wheel)
    assert not [n for n in names if n.startswith("rawops/_fatbin/")], sorted(names)
    for path in SOURCES:
        assert path in names
    assert [n for n in names if EXTENSION.match(n)], sorted(names)


@needs_source_tree
@wheel_builds
def test_wheel_without_nvcc_does_not_ship_a_stale_fatbin_left_in_the_source_tree(tmp_path, no_nvcc_env):
    # A checkout that was once built in place (`pip install -e .`) has rawops/_fatbin/; a later
    # build without nvcc must not package that old fatbin as if it matched the sources.
    src = _clean_copy(tmp_path / "src")
    (src / "rawops" / "_fatbin").mkdir()
    (src / "rawops" / "_fatbin" / "elementwise.fatbin").write_bytes(b"stale build output")
    (src / "rawops" / "_fatbin" / "manifest.json").write_text('{"archs": ["sm_70"], "ptx": []}')
    wheel, log = _build_wheel(src, tmp_path / "dist", no_nvcc_env)
    assert "nvcc not found" in log
    names = _names(wheel)
    assert FATBIN not in names and MANIFEST not in names, sorted(names)
