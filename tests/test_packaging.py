"""Packaging: what a wheel built from a clean checkout contains: with the machine's nvcc, with
the nvidia-cuda-nvcc wheel's where the machine has none, and without nvcc.

Wheels are built with `pip wheel --no-build-isolation --no-deps` from a copy of the source
tree (no build outputs), with RAWOPS_CUDA_ARCH_LIST=9.0 so nvcc compiles one architecture
only. The builds share the user's build cache (rawops/_nvcc.py cache_dir) like any build, so a
second run of the tests reuses the fatbins; the tests of the toolkit-less build and of the cache
itself use a fresh cache of their own. Set RAWOPS_SKIP_WHEEL_TESTS=1 to skip the builds.
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
from test_build import CUOBJDUMP, NVDISASM, cuobjdump

REPO = Path(__file__).resolve().parents[1]
FATBIN = "rawops/_fatbin/elementwise.fatbin"
MANIFEST = "rawops/_fatbin/manifest.json"
SOURCES = ("rawops/_kernels/elementwise.cu", "rawops/_kernels/include/rawops/dtype.cuh")
MODULES = ("__init__", "__main__", "_modules", "_nvcc", "_fatbin_info", "elementwise")
EXTENSION = re.compile(r"^rawops/_launch/\w+\.[^/]*\.so$")
BUILD_OUTPUTS = shutil.ignore_patterns(
    ".git", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".whl", "tests",
    "_fatbin", "_kernels", "*.so", "*.c")

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
        capture_output=True, text=True, timeout=900, env=env)
    log = done.stdout + done.stderr
    assert done.returncode == 0, f"pip wheel failed:\n{log[-6000:]}"
    wheels = list(Path(out).glob("rawops-*.whl"))
    assert len(wheels) == 1, f"expected one wheel in {out}, got {wheels}"
    return wheels[0], log


def _names(wheel):
    with zipfile.ZipFile(wheel) as zf:
        return set(zf.namelist())


def _path_without_nvcc():
    """A PATH with Python and the C compiler but no nvcc, or None."""
    dirs = [os.path.dirname(sys.executable), "/usr/bin", "/bin"]
    path = os.pathsep.join(d for d in dirs if os.path.isdir(d))
    if shutil.which("nvcc", path=path) or not (shutil.which("cc", path=path) or shutil.which("gcc", path=path)):
        return None
    return path


def _env_without_nvcc():
    """os.environ with no nvcc to find: none on PATH, no CUDA_HOME / CUDA_PATH, and RAWOPS_NVCC=none
    (the nvidia-cuda-nvcc wheel of the test extra would be found otherwise); or None."""
    path = _path_without_nvcc()
    if path is None:
        return None
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH")}
    env.update(PATH=path, **{_nvcc.NVCC_ENV: "none"})
    return env


def _env_without_a_cuda_toolkit():
    """os.environ where the only nvcc is the nvidia-cuda-nvcc wheel's, or None."""
    path = _path_without_nvcc()
    if path is None or _nvcc._wheel_nvcc() is None:
        return None
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH", _nvcc.NVCC_ENV)}
    env["PATH"] = path
    return env


def _fatbin_of(wheel, family, folder):
    path = Path(folder) / f"{family}.{wheel.stem}.fatbin"
    with zipfile.ZipFile(wheel) as zf:
        path.write_bytes(zf.read(f"rawops/_fatbin/{family}.fatbin"))
    return path


def _sass(fatbin):
    """cuobjdump --dump-sass without the lines naming the source file (its path in the checkout)."""
    return [line for line in cuobjdump("--dump-sass", str(fatbin)).splitlines() if "identifier" not in line]


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
    layers = {n.split("/")[-1].split(".")[0] for n in names if EXTENSION.match(n)}
    assert layers == {"driver", "arrays", "streams", "launch", "torch_fast"}, sorted(names)
    assert not [n for n in names if n.endswith(".c")], "the launcher's generated C is a build intermediate"


@needs_source_tree
@wheel_builds
def test_wheel_build_says_for_every_family_whether_it_compiled_or_reused_it(nvcc_wheel):
    _, log = nvcc_wheel
    families = sorted(p.stem for p in (REPO / "kernels").glob("*.cu"))
    for family in families:
        lines = [line.strip() for line in log.splitlines() if re.match(
            rf"\s*rawops: (nvcc {family}\.cu -> {family}\.fatbin \[sm_90a?\], to the build cache as "
            rf"|reused {family}\.fatbin \[sm_90a?\] from the build cache: |skipping {family}: )", line)]
        assert len(lines) == 1, f"{family}: {lines}"


@needs_source_tree
@wheel_builds
def test_wheel_fatbin_holds_exactly_the_architectures_asked_for_at_build_time(nvcc_wheel, tmp_path):
    wheel, log = nvcc_wheel
    assert re.search(r"rawops: (nvcc elementwise\.cu -> elementwise\.fatbin|reused elementwise\.fatbin) \[sm_90\]",
                     log)
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
    assert "rawops: WARNING nvcc not found (RAWOPS_NVCC=none); shipping kernel sources only" in log
    warnings = [line for line in log.splitlines() if line.strip().startswith("rawops: WARNING")]
    assert len(warnings) == 1, "one line says what a build without nvcc ships"
    assert "gemm_sm90 is unavailable (its ops run portable kernels)" in warnings[0]
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


# ------------------------------------------------------------------------------ without a CUDA toolkit
@pytest.fixture(scope="module")
def toolkit_less_build(tmp_path_factory):
    """A wheel built where the only nvcc is the nvidia-cuda-nvcc wheel's: elementwise for sm_90, into
    a fresh build cache; (wheel, log, env)."""
    env = _env_without_a_cuda_toolkit()
    if env is None:
        pytest.skip("no nvidia-cuda-nvcc wheel installed (the test extra has it), or no PATH without nvcc")
    root = tmp_path_factory.mktemp("toolkit_less")
    env.update({_nvcc.ARCH_ENV: "9.0", _nvcc.FAMILIES_ENV: "elementwise", _nvcc.CACHE_ENV: str(root / "cache")})
    wheel, log = _build_wheel(_clean_copy(root / "src"), root / "dist", env)
    return wheel, log, env


@needs_source_tree
@wheel_builds
def test_wheel_without_a_cuda_toolkit_compiles_with_the_nvcc_wheel(toolkit_less_build):
    wheel, log, env = toolkit_less_build
    assert f"({_nvcc.NVCC_WHEEL_ORIGIN}); build cache {env[_nvcc.CACHE_ENV]}" in log
    assert "rawops: nvcc elementwise.cu -> elementwise.fatbin [sm_90], to the build cache as elementwise-" in log
    names = _names(wheel)
    assert FATBIN in names and MANIFEST in names
    with zipfile.ZipFile(wheel) as zf:
        manifest = json.loads(zf.read(MANIFEST))
    assert (manifest["archs"], manifest["ptx"]) == (["sm_90"], [])
    assert manifest["nvcc"] == _nvcc.nvcc_version(_nvcc._wheel_nvcc()).splitlines()[-1]


@needs_source_tree
@wheel_builds
@pytest.mark.skipif(CUOBJDUMP is None or NVDISASM is None, reason="needs cuobjdump and nvdisasm "
                    "(pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")
def test_the_nvcc_wheel_compiles_the_same_sass_as_the_machines_nvcc_of_its_version(toolkit_less_build, nvcc_wheel,
                                                                                   tmp_path):
    system = _nvcc.find_nvcc()
    wheel_nvcc = _nvcc._wheel_nvcc()
    if system == wheel_nvcc or _nvcc.nvcc_version(system) != _nvcc.nvcc_version(wheel_nvcc):
        pytest.skip("needs a machine nvcc of the nvidia-cuda-nvcc wheel's version beside it")
    theirs = _sass(_fatbin_of(nvcc_wheel[0], "elementwise", tmp_path))
    ours = _sass(_fatbin_of(toolkit_less_build[0], "elementwise", tmp_path))
    assert len(ours) > 1000 and ours == theirs


@needs_source_tree
@wheel_builds
def test_a_second_build_reuses_the_cached_fatbin_and_ships_the_same_bytes_and_manifest(toolkit_less_build, tmp_path):
    first, _, env = toolkit_less_build
    second, log = _build_wheel(_clean_copy(tmp_path / "src"), tmp_path / "dist", env)
    assert re.search(r"rawops: reused elementwise\.fatbin \[sm_90\] from the build cache: .*elementwise-\w{16}\.fatbin",
                     log)
    assert "rawops: nvcc elementwise.cu" not in log
    with zipfile.ZipFile(first) as a, zipfile.ZipFile(second) as b:
        assert a.read(FATBIN) == b.read(FATBIN)
        assert json.loads(a.read(MANIFEST)) == json.loads(b.read(MANIFEST))
