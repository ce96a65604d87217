"""The build produced what the runtime will look up: every kernel, for every architecture.

Checked with NVIDIA's cuobjdump (PyPI: nvidia-cuda-cuobjdump, or on PATH) against the
Python tables in rawops.elementwise and the architecture list in rawops._nvcc; no GPU needed.
"""
import collections
import glob
import importlib.util
import os
import re
import shutil
import subprocess

import pytest

import rawops.elementwise as elementwise
from rawops import _fatbin_info, _modules, _nvcc

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SUFFIXES = ("f32", "f16", "bf16")
EXPECTED_KERNELS = {
    f"{base}_{suffix}"
    for base in (*elementwise.KERNELS, *elementwise.STRIDED.values(), *elementwise.COLUMN_SUM_KERNELS,
                 *elementwise.BIAS_BWD_PARTIAL.values(),
                 *elementwise.GELU_BWD_PARTIAL.values(), *elementwise.BIAS_BWD_TILE.values(),
                 *elementwise.GELU_BWD_TILE.values())
    for suffix in SUFFIXES
} | {f"{name}_f16" for name in (*elementwise.BIAS_BWD_TILE_EXACT.values(), *elementwise.GELU_BWD_TILE_EXACT.values())
     } | set(elementwise.FIXED_SUM_KERNELS) | {
    f"{name}_x{unroll}_{suffix}" for name, unrolls in elementwise.FAST_UNROLL.items()
    for unroll, suffixes in zip(unrolls, (SUFFIXES[:1], SUFFIXES[1:])) if unroll > 1 for suffix in suffixes}


def _find_tool(name):
    """A CUDA binary tool: the pip wheels' (nvidia/cu*/bin), else PATH's."""
    try:
        import nvidia

        for root in nvidia.__path__:
            for candidate in sorted(glob.glob(os.path.join(root, "cu*", "bin", name))):
                if os.access(candidate, os.X_OK):
                    return candidate
    except ImportError:
        pass
    return shutil.which(name)


CUOBJDUMP = _find_tool("cuobjdump")
# `cuobjdump --dump-sass` runs nvdisasm, found beside cuobjdump, on PATH or in $NVDISASM_PATH.
NVDISASM = _find_tool("nvdisasm")
needs_cuobjdump = pytest.mark.skipif(
    CUOBJDUMP is None,
    reason="cuobjdump not found: pip install nvidia-cuda-cuobjdump (or put CUDA's bin/ on PATH)",
)
needs_nvdisasm = pytest.mark.skipif(
    NVDISASM is None,
    reason="nvdisasm not found (cuobjdump --dump-sass runs it): pip install nvidia-cuda-nvdisasm",
)
needs_nvcc = pytest.mark.skipif(_nvcc.find_nvcc() is None,
                                reason="nvcc not found (CUDA_HOME, CUDA_PATH, PATH or pip install nvidia-cuda-nvcc)")


def cuobjdump(*args):
    env = {**os.environ, "NVDISASM_PATH": os.path.dirname(NVDISASM)} if NVDISASM else None
    done = subprocess.run([CUOBJDUMP, *args], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, f"cuobjdump {' '.join(args)} failed:\n{done.stdout}{done.stderr}"
    return done.stdout


def list_elf_archs(path):
    """['sm_75', ...] from `cuobjdump --list-elf`, one per ELF, in file order."""
    out = cuobjdump("--list-elf", path)
    return re.findall(r"^ELF file\s+\d+:\s+\S*?\.(sm_\d+[a-z]?)\.cubin\s*$", out, flags=re.M)


def list_ptx_archs(path):
    """['sm_120', ...] from `cuobjdump --list-ptx` (the PTX's virtual architecture)."""
    out = cuobjdump("--list-ptx", path)
    return re.findall(r"^PTX file\s+\d+:\s+\S*?\.(sm_\d+[a-z]?)\.ptx\s*$", out, flags=re.M)


def elf_entry_symbols(path):
    """{'sm_75': {kernel names}, ...}: the ENTRY (extern "C" __global__) functions of each ELF.

    `cuobjdump --dump-elf-symbols` prints one block per ELF ("Fatbin elf code:", then
    "arch = sm_XX", then "symbols:" and one line per symbol: TYPE BINDING VISIBILITY
    SECTION NAME); kernels are the FUNC symbols in the ENTRY section.
    """
    out = cuobjdump("--dump-elf-symbols", path)
    per_arch = {}
    current = kind = None
    for line in out.splitlines():
        if line.startswith("Fatbin "):
            current = None
            kind = line.split()[1]
        elif line.startswith("arch = ") and kind == "elf":
            current = line.split("=", 1)[1].strip()
            assert current not in per_arch, f"two ELF blocks for {current}"
            per_arch[current] = set()
        elif current is not None:
            # cuobjdump 13.5 prints "FUNC GLOBAL DEFAULT ENTRY name"; 13.0 prefixes the
            # columns (STT_FUNC STB_GLOBAL ...) and may print no section: entries are the
            # global functions (the compiler's helpers are weak).
            fields = [f.removeprefix("STT_").removeprefix("STB_") for f in line.split()]
            if len(fields) >= 4 and fields[0] == "FUNC" and fields[1] == "GLOBAL":
                per_arch[current].add(fields[-1])
    return per_arch


def _requested_archs():
    """What the installed build was asked to compile: its manifest (a device round builds
    for its own GPU only), else the architecture list in force now."""
    manifest = _nvcc.read_manifest(_modules.FATBIN_DIR)
    if manifest is None:
        return _nvcc.target_archs()
    ptx = set(manifest["ptx"])
    return [(int(a[3:]), f"compute_{a[3:]}" in ptx) for a in manifest["archs"]]


def expected_elf_archs():
    return sorted(f"sm_{sm}" for sm, _ in _requested_archs())


def expected_ptx_archs():
    return sorted(f"sm_{sm}" for sm, ptx in _requested_archs() if ptx)


@pytest.mark.skipif(not os.environ.get("CI"), reason="CI builds the default list; a device round builds one arch")
def test_ci_build_compiled_every_default_architecture():
    manifest = _nvcc.read_manifest(_modules.FATBIN_DIR)
    assert manifest is not None, "the build wrote no manifest"
    default = _nvcc.parse_arch_list(_nvcc.DEFAULT_ARCHS)
    assert manifest["archs"] == [f"sm_{sm}" for sm, _ in default]
    assert manifest["ptx"] == [f"compute_{sm}" for sm, ptx in default if ptx]


@pytest.fixture(scope="module")
def fatbin():
    path = _modules.fatbin_path(elementwise.FAMILY)
    if not os.path.exists(path):
        if _nvcc.find_nvcc() is None:
            pytest.skip(f"{path} absent and no nvcc here: the package was built from sources only")
        pytest.fail(f"{path} is missing although nvcc is available: the build did not compile the kernels "
                    "(rerun `pip install --no-build-isolation --no-deps -e .`)")
    return path


# ------------------------------------------------------------------------------ the shipped fatbin
@needs_cuobjdump
def test_fatbin_holds_one_elf_per_target_architecture_and_nothing_else(fatbin):
    found = list_elf_archs(fatbin)
    assert found, "cuobjdump --list-elf listed no ELF at all"
    assert sorted(found) == expected_elf_archs(), (
        f"ELFs in {fatbin}: {found}; {_nvcc.ARCH_ENV} / default asks for {expected_elf_archs()}")


@needs_cuobjdump
def test_fatbin_holds_ptx_exactly_for_the_plus_ptx_architectures(fatbin):
    assert sorted(list_ptx_archs(fatbin)) == expected_ptx_archs()


@needs_cuobjdump
def test_every_elf_has_every_kernel_entry_point_and_no_unlisted_one(fatbin):
    per_arch = elf_entry_symbols(fatbin)
    assert sorted(per_arch) == expected_elf_archs(), "symbol dump and --list-elf disagree on the ELFs"
    for arch, names in sorted(per_arch.items()):
        missing = sorted(EXPECTED_KERNELS - names)
        extra = sorted(names - EXPECTED_KERNELS)
        assert not missing, f"{arch}: kernels the launcher needs but the ELF lacks: {missing}"
        assert not extra, (f"{arch}: entry points absent from rawops.elementwise.KERNELS / STRIDED / "
                           f"COLUMN_SUM_KERNELS / BIAS_BWD_PARTIAL / GELU_BWD_PARTIAL / BIAS_BWD_TILE / GELU_BWD_TILE "
                           f"(unreachable from Python): "
                           f"{extra}")


@needs_cuobjdump
def test_embedded_ptx_has_every_kernel_entry_point(fatbin):
    if not expected_ptx_archs():
        pytest.skip("no +PTX architecture requested")
    entries = set(re.findall(r"\.entry\s+(\w+)\s*\(", cuobjdump("--dump-ptx", fatbin)))
    assert entries == EXPECTED_KERNELS


@needs_cuobjdump
@needs_nvdisasm
def test_backward_tiles_store_dx_as_one_16_byte_vector_on_every_architecture(fatbin):
    """bias_bwd_tile's dx goes out by one 128-bit STG a vector (dtype.cuh store16_pinned): nvcc had
    split store16 there into four 32-bit STG at offsets +4, +8, +12 of one address. (The sm_90
    fatbin before the change fails it; a build for all seven default architectures passes.)"""
    tiles = sorted(name for name in EXPECTED_KERNELS if "_bwd_tile_" in name)
    assert len(tiles) == 16
    sections = re.split(r"\n\s*Function : ", cuobjdump("--dump-sass", fatbin))[1:]
    seen = collections.Counter()
    for section in sections:
        name = section.split(None, 1)[0]
        if name not in tiles:
            continue
        seen[name] += 1
        assert re.search(r"\bSTG\.E(\.\w+)*\.128\b", section), f"{name}: no 128-bit store"
        split = re.findall(r"\bSTG\.E(?:\.SYS)? +(?:desc\[\w+\])?\[R\d+(?:\.64)?\+0x[4c]\]", section)
        assert not split, f"{name}: 32-bit stores at +4 / +12 of one address (a split vector store): {split}"
    assert seen == {name: len(list_elf_archs(fatbin)) for name in tiles}


@needs_cuobjdump
@pytest.mark.parametrize("family", _modules.families())
def test_every_kernel_info_loads_is_an_entry_point_of_the_familys_fatbin(family):
    from rawops.__main__ import entry_points

    path = _modules.fatbin_path(family)
    if not os.path.exists(path):
        pytest.skip(f"{path} absent (not built here)")
    names = entry_points(family)
    assert names, f"no Python table lists the kernels of {family}"
    for arch, symbols in elf_entry_symbols(path).items():
        missing = sorted(set(names) - symbols)
        assert not missing, f"{family} {arch}: `rawops info` would look up kernels the fatbin lacks: {missing}"


def test_map_kernels_ask_for_names_the_fatbin_table_lists():
    # MapKernel builds '<name>_<suffix>' at launch; those must be among the names checked above.
    asked = {name for kernel in elementwise.MAP.values() for name in kernel.kernel_names()}
    unrolled = {name for name in EXPECTED_KERNELS if re.search(r"_x\d+_", name)}
    assert len(unrolled) == 8
    assert asked == {f"{b}_{s}" for b in (*elementwise.KERNELS, *elementwise.STRIDED.values())
                     for s in SUFFIXES} | unrolled
    assert asked < EXPECTED_KERNELS


@needs_cuobjdump
def test_fatbin_info_reader_agrees_with_cuobjdump_on_the_shipped_fatbin(fatbin):
    ours = collections.Counter(_fatbin_info.fatbin_architectures(fatbin))
    theirs = collections.Counter(list_elf_archs(fatbin))
    theirs.update(arch.replace("sm_", "compute_") for arch in list_ptx_archs(fatbin))
    assert ours == theirs


def test_fatbin_info_reader_matches_the_target_architectures(fatbin):
    expected = expected_elf_archs() + [a.replace("sm_", "compute_") for a in expected_ptx_archs()]
    assert sorted(_fatbin_info.fatbin_architectures(fatbin)) == sorted(expected)


@needs_cuobjdump
def test_build_manifest_records_what_the_fatbin_really_holds(fatbin):
    manifest = _nvcc.read_manifest(_modules.FATBIN_DIR)
    if manifest is None:
        pytest.skip("no build manifest (built before manifests existed)")
    assert sorted(manifest["archs"]) == sorted(list_elf_archs(fatbin))
    assert sorted(manifest["ptx"]) == sorted(a.replace("sm_", "compute_") for a in list_ptx_archs(fatbin))
    assert manifest["flags"] == list(_nvcc.NVCC_FLAGS)


def test_manifest_round_trips_and_is_absent_when_not_written(tmp_path):
    assert _nvcc.read_manifest(str(tmp_path)) is None
    fake_nvcc = tmp_path / "nvcc"
    fake_nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools'\necho 'Build cuda_99.9'\n")
    fake_nvcc.chmod(0o755)
    _nvcc.write_manifest(str(tmp_path), [(80, False), (90, True)], str(fake_nvcc))
    assert _nvcc.read_manifest(str(tmp_path)) == {
        "archs": ["sm_80", "sm_90"], "ptx": ["compute_90"], "nvcc": "Build cuda_99.9", "flags": list(_nvcc.NVCC_FLAGS),
        "specific": {}, "unavailable": {}, "digests": {}}
    _nvcc.write_manifest(str(tmp_path), [(90, False)], str(fake_nvcc), {"gemm_sm90": ["sm_90a"]},
                         {"other_sm100": "the build targets none of 100a"}, {"gemm_sm90": "0123456789abcdef"})
    manifest = _nvcc.read_manifest(str(tmp_path))
    assert (manifest["specific"], manifest["unavailable"], manifest["digests"]) == (
        {"gemm_sm90": ["sm_90a"]}, {"other_sm100": "the build targets none of 100a"}, {"gemm_sm90": "0123456789abcdef"})


def test_a_partial_build_keeps_other_families_only_when_built_for_the_same_targets(tmp_path):
    """RAWOPS_FAMILIES rebuilds some families and keeps the other fatbins: the manifest written
    afterwards names one set of targets, so a build for other targets stops and says why."""
    fake_nvcc = tmp_path / "nvcc"
    fake_nvcc.write_text("#!/bin/sh\necho 'Build cuda_99.9'\n")
    fake_nvcc.chmod(0o755)
    archs = [(80, False), (90, True)]
    assert _nvcc.kept_fatbins_conflict(str(tmp_path), [(90, False)], set()) is None  # nothing kept
    message = _nvcc.kept_fatbins_conflict(str(tmp_path), archs, {"norm"})
    assert "norm" in message and "unrecorded targets" in message  # no manifest: cannot know
    _nvcc.write_manifest(str(tmp_path), archs, str(fake_nvcc))
    assert _nvcc.kept_fatbins_conflict(str(tmp_path), archs, {"norm", "mlp"}) is None
    message = _nvcc.kept_fatbins_conflict(str(tmp_path), [(90, False)], {"norm", "mlp"})
    assert message == (f"{_nvcc.FAMILIES_ENV} keeps mlp, norm as built for ['sm_80', 'sm_90'] + PTX ['compute_90'], "
                       f"but this build targets ['sm_90'] + PTX []: set {_nvcc.ARCH_ENV} as for that build, "
                       "or build every family")


def test_fatbin_info_reader_rejects_a_file_that_is_not_a_fatbin(tmp_path):
    junk = tmp_path / "junk.fatbin"
    junk.write_bytes(b"\x7fELF" + bytes(60))
    with pytest.raises(ValueError, match="not a fatbin"):
        _fatbin_info.fatbin_architectures(str(junk))


TINY_KERNEL = r"""
#include "rawops/dtype.cuh"
extern "C" __global__ void tiny_f32(float* p) { p[threadIdx.x] = rawops::to_float(1.f); }
"""


@needs_nvcc
@needs_cuobjdump
@pytest.mark.parametrize("arch_list", ["8.0", "9.0+PTX", "7.5;8.6+PTX;12.0"])
def test_compile_fatbin_builds_exactly_the_requested_archs_and_the_reader_agrees(tmp_path, arch_list):
    cu = tmp_path / "tiny.cu"
    cu.write_text(TINY_KERNEL)
    out = tmp_path / "out" / "tiny.fatbin"
    archs = _nvcc.parse_arch_list(arch_list)
    logged = []
    _nvcc.compile_fatbin(_nvcc.find_nvcc(), str(cu), os.path.join(_modules.kernel_source_dir(), "include"),
                         str(out), archs, log=logged.append)
    assert out.exists() and len(logged) == 1
    assert sorted(list_elf_archs(str(out))) == sorted(f"sm_{sm}" for sm, _ in archs)
    assert sorted(list_ptx_archs(str(out))) == sorted(f"sm_{sm}" for sm, ptx in archs if ptx)
    expected = [f"sm_{sm}" for sm, _ in archs] + [f"compute_{sm}" for sm, ptx in archs if ptx]
    assert sorted(_fatbin_info.fatbin_architectures(str(out))) == sorted(expected)
    symbols = elf_entry_symbols(str(out))
    assert sorted(symbols) == sorted(f"sm_{sm}" for sm, _ in archs)
    assert all(names == {"tiny_f32"} for names in symbols.values()), symbols


@needs_nvcc
def test_compile_fatbin_reports_nvcc_errors_with_its_output(tmp_path):
    cu = tmp_path / "broken.cu"
    cu.write_text('extern "C" __global__ void broken() { this is not cuda; }\n')
    with pytest.raises(RuntimeError, match=r"nvcc failed on .*broken\.cu"):
        _nvcc.compile_fatbin(_nvcc.find_nvcc(), str(cu), str(tmp_path), str(tmp_path / "b.fatbin"),
                             [(80, False)], log=lambda *_: None)


# ------------------------------------------------------------------------------ families
def test_every_kernel_source_has_its_fatbin(fatbin):
    sources = sorted(glob.glob(os.path.join(_modules.kernel_source_dir(), "*.cu")))
    assert sources, f"no kernels/*.cu under {_modules.kernel_source_dir()}"
    for cu in sources:
        family = os.path.splitext(os.path.basename(cu))[0]
        assert family in _modules.families()
        assert os.path.isfile(_modules.fatbin_path(family)), f"family {family!r} has no fatbin"


def test_families_are_exactly_the_kernel_sources_and_fatbins():
    sources = {os.path.splitext(os.path.basename(p))[0]
               for p in glob.glob(os.path.join(_modules.kernel_source_dir(), "*.cu"))}
    fatbins = {os.path.splitext(os.path.basename(p))[0]
               for p in glob.glob(os.path.join(_modules.FATBIN_DIR, "*.fatbin"))}
    assert _modules.families() == sorted(sources | fatbins)
    assert "elementwise" in _modules.families()


# ------------------------------------------------------------------------------ source <-> table
def _kernel_source():
    with open(os.path.join(_modules.kernel_source_dir(), "elementwise.cu")) as f:
        return f.read()


def test_python_table_matches_the_kernels_defined_in_the_source():
    source = _kernel_source()
    defined = re.findall(r"^\s*RAWOPS_MAP\((\w+),\s*(\w+),\s*T,\s*suffix\)", source, flags=re.M)
    assert sorted(name for name, _ in defined) == sorted(elementwise.KERNELS)
    for name in elementwise.COLUMN_SUM_KERNELS:
        assert re.search(rf'extern "C" __global__ void (__launch_bounds__\([^)]*\)\s*)?\\?\s*{name}_##suffix\(',
                         source), name
    fused = dict(re.findall(r"^\s*RAWOPS_BIAS_BWD_PARTIAL\((\w+),\s*(\w+),\s*T,\s*suffix\)", source, flags=re.M))
    assert fused == {"bias_gelu_tanh_bwd_partial": "BiasGeluTanhBwd", "bias_gelu_erf_bwd_partial": "BiasGeluErfBwd",
                     "gelu_tanh_bwd_partial": "GeluTanhBwd", "gelu_erf_bwd_partial": "GeluErfBwd"}
    assert set(fused) == {*elementwise.BIAS_BWD_PARTIAL.values(), *elementwise.GELU_BWD_PARTIAL.values()}
    tiles = dict(re.findall(r"^\s*RAWOPS_BIAS_BWD_TILE\((\w+),\s*(\w+),\s*T,\s*suffix,\s*TILE_BOUNDS\)", source,
                            flags=re.M))
    assert tiles == {"bias_gelu_tanh_bwd_tile": "BiasGeluTanhBwd", "bias_gelu_erf_bwd_tile": "BiasGeluErfBwd",
                     "gelu_tanh_bwd_tile": "GeluTanhBwd", "gelu_erf_bwd_tile": "GeluErfBwd"}
    assert set(tiles) == {*elementwise.BIAS_BWD_TILE.values(), *elementwise.GELU_BWD_TILE.values()}
    exact = dict(re.findall(r"^RAWOPS_BIAS_BWD_TILE_EXACT\((\w+),\s*(\w+)\)", source, flags=re.M))
    assert exact == {f"{name}_exact": op for name, op in tiles.items()}
    assert set(exact) == {*elementwise.BIAS_BWD_TILE_EXACT.values(), *elementwise.GELU_BWD_TILE_EXACT.values()}
    for name in elementwise.FIXED_SUM_KERNELS:
        assert re.search(rf'extern "C" __global__ void __launch_bounds__\(RAWOPS_FIXED_SUM_THREADS\) {name}\(',
                         source), name
    # each RAWOPS_MAP stamps out the strided entry beside the contiguous one
    assert "name##_strided_##suffix(" in source
    assert set(elementwise.STRIDED) == set(elementwise.KERNELS)
    assert all(strided == f"{name}_strided" for name, strided in elementwise.STRIDED.items())
    instantiated = re.findall(r"^RAWOPS_ELEMENTWISE\(([\w ]+),\s*(\w+),", source, flags=re.M)
    assert [suffix for _, suffix in instantiated] == list(SUFFIXES)


def test_fused_bias_backward_plan_uses_the_kernels_launch_bounds_and_vector():
    # The plan sizes its one wave by the blocks the launch bounds guarantee resident, and its
    # alignment checks by the kernel's vector: both come from rawops/_constants.py, compiled in
    # per storage size.
    from rawops import _constants

    source = _kernel_source()
    assert ("static constexpr int bytes = sizeof(T) == 4 ? RAWOPS_BIAS_BWD_F32_BYTES : RAWOPS_BIAS_BWD_HALF_BYTES;"
            in source)
    assert ("static constexpr int blocks = sizeof(T) == 4 ? RAWOPS_BIAS_BWD_F32_BLOCKS : RAWOPS_BIAS_BWD_HALF_BLOCKS;"
            in source)
    assert elementwise.BIAS_BWD_SHAPE == {4: (_constants.BIAS_BWD_F32_BYTES, _constants.BIAS_BWD_F32_BLOCKS),
                                          2: (_constants.BIAS_BWD_HALF_BYTES, _constants.BIAS_BWD_HALF_BLOCKS)}
    assert "constexpr int kBiasBwdThreads = RAWOPS_BIAS_BWD_THREADS;" in source
    assert elementwise.BIAS_BWD_THREADS == _constants.BIAS_BWD_THREADS
    assert "__launch_bounds__(rawops::kBiasBwdThreads, rawops::BiasBwdShape<T>::blocks)" in source


def test_tile_backward_plan_uses_the_kernels_tile_shapes():
    # The plan's grid, block and partial rows follow BiasBwdTile<T> (threads, rows a tile, rows a
    # thread), compiled per type; a mismatch would leave rows or columns without a thread.
    from rawops import _constants

    source = re.sub(r"\s+", " ", _kernel_source())
    types = {"float": (0, "F32"), "__half": (1, "F16"), "__nv_bfloat16": (2, "BF16")}
    found = {}
    for t, threads, rows, per in re.findall(
            r"template <> struct BiasBwdTile<(\w+)> \{ static constexpr int threads = RAWOPS_(\w+), "
            r"rows = RAWOPS_(\w+), per = RAWOPS_(\w+)[;,]", source):
        code, name = types[t]
        assert (threads, rows, per) == tuple(f"BIAS_BWD_TILE_{name}_{part}" for part in ("THREADS", "ROWS", "PER"))
        found[code] = tuple(getattr(_constants, macro) for macro in (threads, rows, per))
    assert found == elementwise.BIAS_BWD_TILE_SHAPE
    # Each type's tiles launch at most its threads; bfloat16's keep BIAS_BWD_TILE_BF16_BLOCKS an SM.
    for t in ("float", "__half"):
        assert f"RAWOPS_ELEMENTWISE({t}, {dict(float='f32', __half='f16')[t]}, " \
               f"__launch_bounds__(rawops::BiasBwdTile<{t}>::threads))" in source
    assert ("RAWOPS_ELEMENTWISE(__nv_bfloat16, bf16, __launch_bounds__(rawops::BiasBwdTile<__nv_bfloat16>::threads, "
            "rawops::BiasBwdTile<__nv_bfloat16>::blocks))") in source
    assert "blocks = RAWOPS_BIAS_BWD_TILE_BF16_BLOCKS;" in source


def test_python_table_reads_the_operands_each_kernel_reads():
    # The launcher passes b / c only where KERNELS says so; the kernel reads them where its
    # Op struct says B / C = true. A mismatch reads a null pointer or ignores an operand.
    source = _kernel_source()
    flags = {op: (b == "true", c == "true") for op, b, c in re.findall(
        r"struct (\w+)\s*\{\s*static constexpr bool B = (true|false),\s*C = (true|false);", source)}
    ops = dict(re.findall(r"^\s*RAWOPS_MAP\((\w+),\s*(\w+),", source, flags=re.M))
    for name, (arg_names, reads_b, reads_c) in elementwise.KERNELS.items():
        assert flags[ops[name]] == (reads_b, reads_c), f"{name}: table {(reads_b, reads_c)}, kernel {flags[ops[name]]}"
        assert len(arg_names) == 1 + reads_b + reads_c, f"{name}: one argument name per operand"
        if reads_c:
            assert arg_names[-1] == "bias"


# ------------------------------------------------------------------------------ arch lists
@pytest.mark.parametrize("text, expected", [
    ("7.5;8.0", [(75, False), (80, False)]),
    ("75,90", [(75, False), (90, False)]),
    ("9.0+PTX", [(90, True)]),
    ("8.6+ptx", [(86, True)]),
    ("7.5 8.0  9.0+PTX", [(75, False), (80, False), (90, True)]),
    (" 8.0 ; 9.0 ;", [(80, False), (90, False)]),
    ("10.0;12.0+PTX", [(100, False), (120, True)]),
    ("100,120", [(100, False), (120, False)]),
])
def test_parse_arch_list_reads_torch_style_lists(text, expected):
    assert _nvcc.parse_arch_list(text) == expected


def test_default_arch_list_is_turing_to_blackwell_with_ptx_for_the_newest():
    assert _nvcc.parse_arch_list(_nvcc.DEFAULT_ARCHS) == [
        (75, False), (80, False), (86, False), (89, False), (90, False), (100, False), (120, True)]


@pytest.mark.parametrize("text", ["", " ; ,", "sm_80", "8", "eight", "9.0+", "+PTX", "8.x", "8.0;abc"])
def test_parse_arch_list_rejects_unreadable_input_naming_the_variable(text):
    with pytest.raises(ValueError, match=_nvcc.ARCH_ENV):
        _nvcc.parse_arch_list(text)


def test_target_archs_follows_the_environment_and_falls_back_to_the_default(monkeypatch):
    monkeypatch.setenv(_nvcc.ARCH_ENV, "8.0;9.0+PTX")
    assert _nvcc.target_archs() == [(80, False), (90, True)]
    monkeypatch.setenv(_nvcc.ARCH_ENV, "")
    assert _nvcc.target_archs() == _nvcc.parse_arch_list(_nvcc.DEFAULT_ARCHS)
    monkeypatch.delenv(_nvcc.ARCH_ENV)
    assert _nvcc.target_archs() == _nvcc.parse_arch_list(_nvcc.DEFAULT_ARCHS)


def test_gencode_flags_give_sass_for_each_arch_and_ptx_only_where_asked():
    assert _nvcc.gencode_flags([(75, False), (90, True)]) == [
        "-gencode=arch=compute_75,code=[sm_75]",
        "-gencode=arch=compute_90,code=[sm_90,compute_90]",
    ]
    assert _nvcc.gencode_flags([]) == []


def _fake_tool(path, script="#!/bin/sh\n"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(script)
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def no_nvcc_anywhere(tmp_path, monkeypatch):
    """An environment where locate_nvcc finds nothing until a test puts an nvcc somewhere."""
    import sys

    for variable in (_nvcc.NVCC_ENV, "CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    monkeypatch.setattr(sys, "path", [str(tmp_path / "empty-site")])
    assert _nvcc.locate_nvcc()[0] is None


def test_find_nvcc_prefers_cuda_home(tmp_path, monkeypatch, no_nvcc_anywhere):
    fake = _fake_tool(tmp_path / "bin" / "nvcc")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    assert _nvcc.find_nvcc() == fake
    monkeypatch.delenv("CUDA_HOME")
    assert _nvcc.find_nvcc() is None


def test_nvcc_discovery_order_is_override_cuda_home_cuda_path_path_then_the_wheel(tmp_path, monkeypatch,
                                                                                 no_nvcc_anywhere):
    import sys

    wheel = _fake_tool(tmp_path / "site" / "nvidia" / "cu13" / "bin" / "nvcc")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "empty-site"), str(tmp_path / "site")])
    assert _nvcc.locate_nvcc() == (wheel, _nvcc.NVCC_WHEEL_ORIGIN)
    on_path = _fake_tool(tmp_path / "path-bin" / "nvcc")
    monkeypatch.setenv("PATH", str(tmp_path / "path-bin"))
    assert _nvcc.locate_nvcc() == (on_path, "PATH")
    cuda_path = _fake_tool(tmp_path / "cuda-path" / "bin" / "nvcc")
    monkeypatch.setenv("CUDA_PATH", str(tmp_path / "cuda-path"))
    assert _nvcc.locate_nvcc() == (cuda_path, "CUDA_PATH")
    cuda_home = _fake_tool(tmp_path / "cuda-home" / "bin" / "nvcc")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda-home"))
    assert _nvcc.locate_nvcc() == (cuda_home, "CUDA_HOME")
    chosen = _fake_tool(tmp_path / "chosen" / "nvcc")
    monkeypatch.setenv(_nvcc.NVCC_ENV, chosen)
    assert _nvcc.locate_nvcc() == (chosen, _nvcc.NVCC_ENV)
    monkeypatch.setenv(_nvcc.NVCC_ENV, "none")  # build the sources-only package though nvcc is there
    assert _nvcc.locate_nvcc() == (None, f"{_nvcc.NVCC_ENV}=none")
    monkeypatch.setenv(_nvcc.NVCC_ENV, str(tmp_path / "missing" / "nvcc"))
    with pytest.raises(FileNotFoundError, match=_nvcc.NVCC_ENV):
        _nvcc.locate_nvcc()


def test_the_wheel_nvcc_is_the_newest_cuda_major_on_sys_path(tmp_path, monkeypatch, no_nvcc_anywhere):
    import sys

    _fake_tool(tmp_path / "a" / "nvidia" / "cu12" / "bin" / "nvcc")
    first13 = _fake_tool(tmp_path / "a" / "nvidia" / "cu13" / "bin" / "nvcc")
    _fake_tool(tmp_path / "b" / "nvidia" / "cu13" / "bin" / "nvcc")
    (tmp_path / "b" / "nvidia" / "cu14" / "bin").mkdir(parents=True)
    (tmp_path / "b" / "nvidia" / "cu14" / "bin" / "nvcc").write_text("not executable")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "a"), str(tmp_path / "b")])
    assert _nvcc.find_nvcc() == first13


def _backend():
    # Loaded at collection: the tests below replace sys.path, which setuptools must be imported from.
    path = os.path.join(REPO, "_build", "backend.py")
    if not os.path.isfile(path):
        return None
    spec = importlib.util.spec_from_file_location("_rawops_backend", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BACKEND = _backend()


@pytest.mark.skipif(BACKEND is None, reason="not a source checkout (no _build/backend.py)")
def test_build_backend_requires_the_nvcc_wheels_only_where_no_nvcc_is_found(tmp_path, monkeypatch, no_nvcc_anywhere):
    backend = BACKEND
    assert backend.toolkit_requirements() == list(_nvcc.NVCC_WHEELS)
    monkeypatch.setenv(_nvcc.NVCC_ENV, "none")
    assert backend.toolkit_requirements() == []
    monkeypatch.delenv(_nvcc.NVCC_ENV)
    _fake_tool(tmp_path / "path-bin" / "nvcc")
    monkeypatch.setenv("PATH", str(tmp_path / "path-bin"))
    assert backend.toolkit_requirements() == []
    # The PEP 517 hooks add them to setuptools' own requirements, for a wheel and an editable install.
    monkeypatch.setattr(backend._setuptools, "get_requires_for_build_wheel", lambda settings=None: ["wheel"])
    monkeypatch.setattr(backend._setuptools, "get_requires_for_build_editable", lambda settings=None: ["editables"])
    assert backend.get_requires_for_build_wheel() == ["wheel"]
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    assert backend.get_requires_for_build_wheel() == ["wheel", *_nvcc.NVCC_WHEELS]
    assert backend.get_requires_for_build_editable() == ["editables", *_nvcc.NVCC_WHEELS]


@pytest.mark.skipif(not os.path.isfile(os.path.join(REPO, "pyproject.toml")), reason="not a source checkout")
def test_pyproject_uses_the_in_tree_backend_and_the_test_extra_pins_the_same_toolkit():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        pyproject = tomllib.load(f)
    assert pyproject["build-system"]["build-backend"] == "backend"
    assert pyproject["build-system"]["backend-path"] == ["_build"]
    test_extra = pyproject["project"]["optional-dependencies"]["test"]
    assert set(_nvcc.NVCC_WHEELS) <= set(test_extra)
    assert {"nvidia-cuda-nvdisasm", "ruff"} <= {re.split(r"[=<>]", r)[0] for r in test_extra}
    versions = {r.split("==")[1].rsplit(".", 1)[0] for r in _nvcc.NVCC_WHEELS}
    assert len(versions) == 1, f"the toolkit wheels are of one CUDA release: {_nvcc.NVCC_WHEELS}"


# ------------------------------------------------------------------------------ the build cache
def _digest_inputs(tmp_path):
    cu = tmp_path / "k.cu"
    include = tmp_path / "include" / "rawops"
    include.mkdir(parents=True, exist_ok=True)
    cu.write_text("a")
    (include / "dtype.cuh").write_text("h")
    return cu, tmp_path / "include"


def test_source_digest_changes_with_the_kernel_and_with_any_shared_header(tmp_path):
    cu, include = _digest_inputs(tmp_path)
    args = ("nvcc 13.0", str(cu), str(include), [(90, False)])
    first = _nvcc.fatbin_digest(*args)
    assert first == _nvcc.fatbin_digest(*args)
    (include / "rawops" / "dtype.cuh").write_text("h2")
    second = _nvcc.fatbin_digest(*args)
    (include / "rawops" / "new.cuh").write_text("")
    third = _nvcc.fatbin_digest(*args)
    cu.write_text("b")
    fourth = _nvcc.fatbin_digest(*args)
    assert len({first, second, third, fourth}) == 4


def test_fatbin_digest_changes_with_targets_nvcc_flags_constants_and_cute_version(tmp_path, monkeypatch):
    cu, include = _digest_inputs(tmp_path)
    cutlass = tmp_path / "cutlass-include"
    (cutlass / "cutlass").mkdir(parents=True)
    (cutlass / "cutlass" / "version.h").write_text("#define CUTLASS_MAJOR 4")
    base = _nvcc.fatbin_digest("nvcc 13.0", str(cu), str(include), [(90, False)])
    keys = {
        base,
        _nvcc.fatbin_digest("nvcc 13.0", str(cu), str(include), [(90, True)]),
        _nvcc.fatbin_digest("nvcc 13.0", str(cu), str(include), [(80, False), (90, False)]),
        _nvcc.fatbin_digest("nvcc 13.0", str(cu), str(include), [(90, False)], targets=["90a"]),
        _nvcc.fatbin_digest("nvcc 13.1", str(cu), str(include), [(90, False)]),
        _nvcc.fatbin_digest("nvcc 13.0", str(cu), str(include), [(90, False)], cutlass=str(cutlass)),
    }
    (cutlass / "cutlass" / "version.h").write_text("#define CUTLASS_MAJOR 5")
    keys.add(_nvcc.fatbin_digest("nvcc 13.0", str(cu), str(include), [(90, False)], cutlass=str(cutlass)))
    monkeypatch.setattr(_nvcc, "NVCC_FLAGS", (*_nvcc.NVCC_FLAGS, "-G"))
    keys.add(_nvcc.fatbin_digest("nvcc 13.0", str(cu), str(include), [(90, False)]))
    monkeypatch.undo()
    monkeypatch.setattr(_nvcc, "CONSTANT_DEFINES", (*_nvcc.CONSTANT_DEFINES, "-DRAWOPS_NEW=1"))
    keys.add(_nvcc.fatbin_digest("nvcc 13.0", str(cu), str(include), [(90, False)]))
    assert len(keys) == 9
    # ...and not with where the sources are: another checkout of the same files shares the cache
    other = tmp_path / "other"
    other.mkdir()
    cu2, include2 = _digest_inputs(other)
    cu2.write_text(cu.read_text())
    monkeypatch.undo()
    assert _nvcc.fatbin_digest("nvcc 13.0", str(cu2), str(include2), [(90, False)]) == base


def test_the_digest_covers_every_constant_the_kernels_are_compiled_with():
    from rawops import _constants

    assert list(_nvcc.CONSTANT_DEFINES) == _constants.defines()
    assert set(_nvcc.CONSTANT_DEFINES) <= set(_nvcc.nvcc_arguments([(90, False)]))


FAKE_NVCC = """#!/bin/sh
# Stands in for nvcc: --version prints a version; a compile logs its call and writes its arguments as the fatbin.
if [ "$1" = "--version" ]; then echo "Cuda compilation tools, release 99.9"; echo "Build cuda_99.9"; exit 0; fi
echo "$@" >> "$(dirname "$0")/calls"
out=""; prev=""
for a in "$@"; do [ "$prev" = "-o" ] && out="$a"; prev="$a"; done
echo "$@" > "$out"
"""


@pytest.fixture
def fake_build(tmp_path, monkeypatch):
    """(nvcc, cu, include, cache, compiles()): a stand-in nvcc that counts its compiles."""
    nvcc = _fake_tool(tmp_path / "fake-bin" / "nvcc", FAKE_NVCC)
    monkeypatch.setattr(_nvcc, "_versions", {})
    cu, include = _digest_inputs(tmp_path / "src")

    def compiles():
        calls = tmp_path / "fake-bin" / "calls"
        return len(calls.read_text().splitlines()) if calls.exists() else 0

    return nvcc, cu, include, tmp_path / "cache", compiles


def test_build_fatbin_compiles_once_then_reuses_the_cached_fatbin(fake_build, tmp_path):
    nvcc, cu, include, cache, compiles = fake_build
    logged = []
    out = tmp_path / "pkg" / "_fatbin" / "k.fatbin"
    digest, how = _nvcc.build_fatbin(nvcc, str(cu), str(include), str(out), [(90, False)], cache=str(cache),
                                     log=logged.append)
    assert how == "compiled" and compiles() == 1 and out.exists()
    assert (cache / f"k-{digest}.fatbin").read_bytes() == out.read_bytes()
    out.unlink()
    again = _nvcc.build_fatbin(nvcc, str(cu), str(include), str(out), [(90, False)], cache=str(cache),
                               log=logged.append)
    assert again == (digest, "reused") and compiles() == 1
    assert out.read_bytes() == (cache / f"k-{digest}.fatbin").read_bytes()
    assert len(logged) == 2, "one line per family and build"
    assert logged[0].startswith("rawops: nvcc k.cu -> k.fatbin [sm_90], to the build cache as k-")
    assert logged[1] == f"rawops: reused k.fatbin [sm_90] from the build cache: {cache / f'k-{digest}.fatbin'}"


def test_build_fatbin_compiles_again_after_any_input_changes(fake_build, tmp_path):
    nvcc, cu, include, cache, compiles = fake_build
    out = str(tmp_path / "k.fatbin")

    def build(archs=((90, False),), **kw):
        return _nvcc.build_fatbin(nvcc, str(cu), str(include), out, list(archs), cache=str(cache),
                                  log=lambda *_: None, **kw)[1]

    assert build() == "compiled"
    assert build() == "reused"
    (include / "rawops" / "dtype.cuh").write_text("edited")
    assert build() == "compiled"
    assert build(archs=[(90, True)]) == "compiled"
    assert build(archs=[(90, True)]) == "reused"
    cu.write_text("edited too")
    assert build() == "compiled"
    assert compiles() == 4
    assert build(archs=[(80, False)]) == "compiled" and build() == "reused"  # older entries stay
    assert len(list(cache.glob("k-*.fatbin"))) == 5


def test_build_fatbin_without_a_cache_always_compiles(fake_build, tmp_path):
    nvcc, cu, include, _, compiles = fake_build
    for _ in range(2):
        how = _nvcc.build_fatbin(nvcc, str(cu), str(include), str(tmp_path / "k.fatbin"), [(90, False)],
                                 log=lambda *_: None)[1]
        assert how == "compiled"
    assert compiles() == 2


def test_a_build_cache_that_cannot_be_written_costs_a_compile_not_the_build(fake_build, tmp_path):
    nvcc, cu, include, _, compiles = fake_build
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    logged = []
    how = _nvcc.build_fatbin(nvcc, str(cu), str(include), str(tmp_path / "k.fatbin"), [(90, False)],
                             cache=str(blocker / "cache"), log=logged.append)[1]
    assert how == "compiled" and (tmp_path / "k.fatbin").exists()
    assert "could not store k.fatbin in the build cache" in logged[-1]


def test_prune_cache_keeps_the_most_recently_used_fatbins_of_a_family(tmp_path):
    for i in range(5):
        path = tmp_path / f"fam-{i:016x}.fatbin"
        path.write_bytes(b"")
        os.utime(path, (1000 + i, 1000 + i))
    (tmp_path / "fam_sm90-0000000000000000.fatbin").write_bytes(b"")  # another family
    os.utime(tmp_path / "fam-0000000000000000.fatbin", (2000, 2000))  # the oldest, used last
    _nvcc.prune_cache(str(tmp_path), "fam", keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "fam-0000000000000000.fatbin", "fam-0000000000000004.fatbin", "fam_sm90-0000000000000000.fatbin"]


def test_cache_dir_is_the_variable_else_xdg_cache_home_else_home(tmp_path, monkeypatch):
    monkeypatch.setenv(_nvcc.CACHE_ENV, str(tmp_path / "mine"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert _nvcc.cache_dir() == str(tmp_path / "mine")
    monkeypatch.delenv(_nvcc.CACHE_ENV)
    assert _nvcc.cache_dir() == str(tmp_path / "xdg" / "rawops" / "fatbin")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert _nvcc.cache_dir() == str(tmp_path / "home" / ".cache" / "rawops" / "fatbin")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert _nvcc.cache_dir() == str(tmp_path / "home" / ".cache" / "rawops" / "fatbin")


# ------------------------------------------------------------------------------ row families (norm, softmaxes)

import rawops.norm as norm  # noqa: E402
import rawops.softmaxes as softmaxes  # noqa: E402

import rawops.mlp as mlp  # noqa: E402
import rawops.image as image  # noqa: E402
import rawops.sorting as sorting  # noqa: E402
from rawops import _sorting_topk as sorting_topk  # noqa: E402
import rawops.glu as glu  # noqa: E402
import rawops.moe as moe  # noqa: E402
import rawops.rotary as rotary  # noqa: E402
import rawops.losses as losses  # noqa: E402

# family -> its Python table; the fatbin must hold <base>_<suffix> for each, on every arch
# (suffixes: the module's SUFFIXES where a family exists in fewer dtypes). mlp's kernels live in
# several fatbins (kernels/mlp_*.cu): its FAMILY_OF names each entry point's (image and sort list
# theirs the same way); topk's table is rawops._sorting_topk's (kernels/sorting_topk.cu).
ROW_FAMILIES = {"norm": norm, "softmaxes": softmaxes}
TABLE_FAMILIES = {**ROW_FAMILIES, "glu": glu, "image": image, "losses": losses, "moe": moe, "rotary": rotary,
                  "sorting": sorting, "sorting_topk": sorting_topk,
                  **{family: mlp for family in sorted(set(mlp.FAMILY_OF.values()))}}
# CUB's util_device.cuh defines one global kernel (EmptyKernel, for its PTX-version query)
# in every unit that includes it; it is not ours and nothing launches it.
# Not ours: CUB's empty kernel, and the toolkit's own functions that some instructions compile to
# (sm_120's cp.async.bulk calls __cuda_syscall_cp_async_bulk_unicast, a global FUNC of the ELF).
CUB_INTERNAL = re.compile(r"^(_ZN3cub\w*EmptyKernel|__cuda_syscall_\w+$)")


def _row_family_fatbin(family):
    path = _modules.fatbin_path(family)
    if not os.path.exists(path):
        if _nvcc.find_nvcc() is None:
            pytest.skip(f"{path} absent and no nvcc here: the package was built from sources only")
        pytest.fail(f"{path} is missing although nvcc is available (rerun the build)")
    return path


def _row_family_expected(family):
    module = TABLE_FAMILIES[family]
    if hasattr(module, "FAMILY_OF"):  # a family over several fatbins lists each entry point's
        return {name for name, home in module.FAMILY_OF.items() if home == family}
    if hasattr(module, "ENTRY_POINTS"):  # a family whose entries are not all built in every dtype
        return set(module.ENTRY_POINTS)
    return {f"{base}_{suffix}" for base in module.KERNELS for suffix in getattr(module, "SUFFIXES", SUFFIXES)}


@needs_cuobjdump
@pytest.mark.parametrize("family", sorted(TABLE_FAMILIES))
def test_row_family_fatbin_has_every_table_kernel_on_every_architecture(family):
    path = _row_family_fatbin(family)
    assert sorted(list_elf_archs(path)) == expected_elf_archs()
    assert sorted(list_ptx_archs(path)) == expected_ptx_archs()
    expected = _row_family_expected(family)
    per_arch = elf_entry_symbols(path)
    assert sorted(per_arch) == expected_elf_archs()
    for arch, names in sorted(per_arch.items()):
        ours = {n for n in names if not CUB_INTERNAL.match(n)}
        assert not sorted(expected - ours), f"{family} {arch}: kernels the launcher needs but the ELF lacks"
        assert not sorted(ours - expected), f"{family} {arch}: entry points absent from {family}.KERNELS"


@needs_cuobjdump
@pytest.mark.parametrize("family", sorted(TABLE_FAMILIES))
def test_row_family_ptx_has_every_table_kernel(family):
    path = _row_family_fatbin(family)
    if not expected_ptx_archs():
        pytest.skip("no +PTX architecture requested")
    entries = set(re.findall(r"\.entry\s+(\w+)\s*\(", cuobjdump("--dump-ptx", path)))
    assert {e for e in entries if not CUB_INTERNAL.match(e)} == _row_family_expected(family)


def _source(family):
    with open(os.path.join(_modules.kernel_source_dir(), f"{family}.cu")) as f:
        return f.read()


def test_norm_table_matches_the_kernels_defined_in_the_source():
    source = _source("norm")
    ops = re.findall(r"^\s*RAWOPS_NORM\((\w+),\s*(true|false),\s*T,\s*suffix\b", source, flags=re.M)
    defined = {f"{op}_{direction}" for op, _ in ops for direction in ("fwd", "bwd")}
    # entries bounded by __launch_bounds__(...) or by a macro argument (BWD_BOUNDS: __maxnreg__(...))
    helpers = set(re.findall(r'void (?:__launch_bounds__\([^)]*\)|BWD_BOUNDS)\s*\\?\s*(\w+)_##suffix\(', source))
    helpers -= {"name##_fwd", "name##_bwd"}
    assert defined | helpers == set(norm.KERNELS)
    assert dict(ops) == {"layer_norm": "false", "rms_norm": "true"}, "the RMS flag of each op"
    instantiated = re.findall(r"^RAWOPS_NORM_FAMILY\(([\w ]+),\s*(\w+)\b", source, flags=re.M)
    assert [suffix for _, suffix in instantiated] == list(SUFFIXES)


def test_softmax_table_matches_the_kernels_defined_in_the_source():
    source = _source("softmaxes")
    ops = re.findall(r"^\s*RAWOPS_SOFTMAX\((\w+),\s*(true|false),\s*T,\s*suffix,\s*[\w:]+\)", source, flags=re.M)
    assert {f"{op}_{d}" for op, _ in ops for d in ("fwd", "fwd_wide", "bwd")} == set(softmaxes.KERNELS)
    assert dict(ops) == {"softmax": "false", "log_softmax": "true"}, "the LOG flag of each op"
    instantiated = re.findall(r"^RAWOPS_SOFTMAX_FAMILY\(([\w ]+),\s*(\w+)\)", source, flags=re.M)
    assert [suffix for _, suffix in instantiated] == list(SUFFIXES)


def _kinds_key(kinds, name):
    return next(k for k in kinds if name.endswith(k) or name == k)


@pytest.mark.parametrize("family, kinds", [
    ("norm", {"add_rms_norm_fwd": norm.ADD_FWD_KINDS, "add_rms_norm_bwd": norm.ADD_BWD_KINDS, "_fwd": norm.FWD_KINDS,
              "_bwd": norm.BWD_KINDS, "layer_norm_bwd_full": norm.BWD_KINDS, "norm_param_grad": norm.PARAM_GRAD_KINDS}),
    ("softmaxes", {"_fwd": softmaxes.FWD_KINDS, "_fwd_wide": softmaxes.FWD_KINDS, "_bwd": softmaxes.BWD_KINDS}),
])
def test_row_family_launch_kinds_match_the_kernel_signatures(family, kinds):
    # The generic launcher marshals one slot per kind: a count or type mismatch passes
    # garbage to the kernel, so compare with the extern "C" parameter lists.
    source = re.sub(r"\\\n", " ", _source(family))
    table = ROW_FAMILIES[family].KERNELS
    # entries bounded by __launch_bounds__(...) or by a macro argument (BWD_BOUNDS: __maxnreg__(...))
    signatures = re.findall(r'extern "C" __global__ void (?:__launch_bounds__\([^)]*\)|BWD_BOUNDS)\s*([\w#]+?)'
                            r'_##suffix\(([^)]*)\)', source)
    assert {name for name, _ in signatures} >= {f"name##{k}" for k in kinds if k.startswith("_")}
    for name, params in signatures:  # name: "name##_fwd" inside a macro, or a plain helper name
        key = _kinds_key(kinds, name)  # the first that matches: the specific names listed first
        expected = "".join("p" if "*" in p else "f" if p.split()[0] == "float" else "q" for p in params.split(","))
        assert kinds[key] == expected, f"{name}: launch kinds {kinds[key]!r}, signature {expected!r}"
        for base in (b for b in table if _kinds_key(kinds, b) == key):
            assert len(table[base]) == len(expected), f"{base}: one argument name per kernel parameter"


def test_mlp_table_matches_the_kernels_defined_in_the_source_and_their_signatures():
    # The source network's float32 kernels (kernels/mlp_source.cu, mlp_source_tc.cu) are plain extern "C" functions;
    # the launch kinds must match each parameter list (a mismatch passes garbage to the kernel).
    # The per-dtype entries are stamped out by macros (RAWOPS_REDUCE, RAWOPS_TC_ENTRIES in
    # kernels/mlp_tiles.cu): their parameter lists are checked against the tables' lengths, and
    # every name must come from a macro in its file.
    source = _source("mlp_source") + _source("mlp_source_tc")
    signatures = dict(re.findall(r'extern "C" __global__ void __launch_bounds__\([^)]*\)\s*(\w+)\(([^)]*)\)', source))
    # the tensor pipe's weight-gradient entries, one a layer, stamped by RAWOPS_WGRAD_TC_ENTRY
    stamped = re.search(r"source_mlp_tc_wgrad##l##_bwd_f32\(([^)]*)\)", source).group(1).replace("\\", " ")
    for layer in re.findall(r"^RAWOPS_WGRAD_TC_ENTRY\((\d),", source, re.M):
        signatures[f"source_mlp_tc_wgrad{layer}_bwd_f32"] = stamped
    assert set(signatures) == {f"{base}_f32" for base in mlp.KERNELS}
    assert {f"{base}_f32" for base in mlp.KERNELS} == {n for n, f in mlp.FAMILY_OF.items()
                                                      if f in ("mlp_source", "mlp_source_tc")}
    kinds = {"source_mlp_fwd": mlp.SOURCE_FWD_KINDS, "source_mlp_small_fwd": mlp.SOURCE_FWD_KINDS,
             **{variant: mlp.SOURCE_FWD_KINDS for variant in mlp.plans.SOURCE_TC_VARIANTS},
             "source_mlp_small_bwd": mlp.SMALL_BWD_KINDS, "mlp_dgrad_bwd": mlp.DGRAD_KINDS,
             "mlp_wgrad_bwd": mlp.WGRAD_KINDS,
             "source_mlp_tc_dgrad_bwd": mlp.TC_DGRAD_KINDS,
             **{f"source_mlp_tc_wgrad{l}_bwd": mlp.WGRAD_KINDS for l in range(3)}}
    assert set(kinds) == set(mlp.KERNELS)
    for base, expected_kinds in kinds.items():
        params = signatures[f"{base}_f32"].split(",")
        got = "".join("p" if "*" in p else "f" if p.split()[0] == "float" else "q" for p in params)
        assert got == expected_kinds, f"{base}_f32: launch kinds {expected_kinds!r}, signature {got!r}"
        assert [p.split()[-1].lstrip("*") for p in params] == list(mlp.KERNELS[base]), "table names the parameters"
    tiles = _source("mlp_tiles")
    macro_kinds = {"mlp_wgrad_reduce_bwd": mlp.REDUCE_KINDS}
    for nf in mlp.plans.TC_NFS:
        macro_kinds.update({f"tc_mlp_nf{nf}_fwd": mlp.TC_FWD_KINDS, f"tc_mlp_nf{nf}_bwd": mlp.TC_BWD_KINDS,
                            f"tc_mlp_wgrad_nf{nf}_bwd": mlp.TC_WGRAD_KINDS})
    assert set(macro_kinds) == set(mlp.KERNELS_ALL_FLOATS) | set(mlp.TC_KERNELS)
    for stamp in ("mlp_wgrad_reduce_bwd_##suffix(", "tc_mlp_nf##NF##_fwd_##suffix(", "tc_mlp_nf##NF##_bwd_##suffix(",
                  "tc_mlp_wgrad_nf##NF##_bwd_##suffix("):
        assert stamp in tiles
    for base, expected_kinds in macro_kinds.items():
        table = {**mlp.KERNELS_ALL_FLOATS, **mlp.TC_KERNELS}[base]
        assert len(expected_kinds) == len(table), base
    assert "mlp_wgrad_reduce_layers_bwd_##suffix(" in _source("mlp_fused_bwd")
