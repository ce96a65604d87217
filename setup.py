"""Build rawops: nvcc compiles kernels/*.cu into rawops/_fatbin/<family>.fatbin, Cython
builds the launcher. Without nvcc the build still succeeds and ships the sources, which
rawops then compiles at first use through NVRTC (see rawops/_modules.py)."""
import concurrent.futures
import glob
import importlib.util
import os
import shutil

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))


def _load_nvcc_helpers():
    # By path: rawops itself is not importable while it is being built.
    spec = importlib.util.spec_from_file_location("_rawops_nvcc", os.path.join(HERE, "rawops", "_nvcc.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildKernelsAndExtensions(build_ext):
    """build_ext that first compiles every kernel family and copies its sources."""

    def run(self):
        package_dir = os.path.join(HERE if self.inplace else self.build_lib, "rawops")
        self._ship_sources(package_dir)
        self._build_fatbins(package_dir)
        super().run()

    def _ship_sources(self, package_dir):
        # Sources travel with the package: the NVRTC fallback and `rawops info` need them.
        target = os.path.join(package_dir, "_kernels")
        if os.path.abspath(target) != os.path.join(HERE, "kernels"):
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(os.path.join(HERE, "kernels"), target)

    def _build_fatbins(self, package_dir):
        nvcc_helpers = _load_nvcc_helpers()
        fatbin_dir = os.path.join(package_dir, "_fatbin")
        nvcc = nvcc_helpers.find_nvcc()
        if nvcc is None:
            # Fatbins left by an earlier build would otherwise ship as if freshly built.
            shutil.rmtree(fatbin_dir, ignore_errors=True)
            print("rawops: WARNING nvcc not found; shipping kernel sources only, "
                  "they will be compiled with NVRTC at first use")
            return
        archs = nvcc_helpers.target_archs()
        include_dir = os.path.join(HERE, "kernels", "include")
        sources = sorted(glob.glob(os.path.join(HERE, "kernels", "*.cu")))
        families = {os.path.splitext(os.path.basename(path))[0] for path in sources}
        for stale in glob.glob(os.path.join(fatbin_dir, "*.fatbin")):  # a removed kernel family
            if os.path.splitext(os.path.basename(stale))[0] not in families:
                os.remove(stale)
        only = nvcc_helpers.selected_families()
        if only is not None:
            print(f"rawops: {nvcc_helpers.FAMILIES_ENV} set: building only {sorted(only)}")
            sources = [path for path in sources if os.path.splitext(os.path.basename(path))[0] in only]
        # Families built for their own targets; kept for those this build leaves as they are.
        specific = dict((nvcc_helpers.read_manifest(fatbin_dir) or {}).get("specific", {}))
        if only is not None:  # the other families' fatbins stay: the manifest must still be true of them
            kept = {f for f in families - only - set(specific) if os.path.exists(os.path.join(fatbin_dir, f"{f}.fatbin"))}
            conflict = nvcc_helpers.kept_fatbins_conflict(fatbin_dir, archs, kept)
            if conflict:
                raise SystemExit(f"rawops: {conflict}")
        jobs = []
        for cu_path in sources:
            family = os.path.splitext(os.path.basename(cu_path))[0]
            out_path = os.path.join(fatbin_dir, f"{family}.fatbin")
            directive = nvcc_helpers.arch_directive(cu_path)
            targets = nvcc_helpers.specific_targets(directive, archs) if directive else None
            cutlass = nvcc_helpers.cutlass_include() if nvcc_helpers.uses_cutlass(cu_path) else None
            skip = None
            if directive and not targets:
                skip = f"the build targets none of {directive}"
            elif nvcc_helpers.uses_cutlass(cu_path) and cutlass is None:
                skip = (f"no CuTe/CUTLASS headers (pip install nvidia-cutlass, or set "
                        f"{nvcc_helpers.CUTLASS_ENV}); rawops uses its portable kernels instead")
            if skip:
                if os.path.exists(out_path):
                    os.remove(out_path)  # never ship a stale fatbin as if freshly built
                specific.pop(family, None)
                print(f"rawops: skipping {family}: {skip}")
                continue
            jobs.append((cu_path, out_path, targets, cutlass))
            if targets:
                specific[family] = [f"sm_{t}" for t in targets]
        # One nvcc per family, side by side: each compiles its architectures in turn.
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(len(jobs), os.cpu_count() or 1))) as pool:
            for done in [pool.submit(nvcc_helpers.compile_fatbin, nvcc, cu_path, include_dir, out_path, archs,
                                     targets=targets, cutlass=cutlass)
                         for cu_path, out_path, targets, cutlass in jobs]:
                done.result()  # nvcc's error, if any, surfaces here
        specific = {f: t for f, t in specific.items() if os.path.exists(os.path.join(fatbin_dir, f"{f}.fatbin"))}
        nvcc_helpers.write_manifest(fatbin_dir, archs, nvcc, specific)


# The launcher's layers (rawops/_launch/__init__.py), lowest first; each cimports those below it.
LAUNCH_LAYERS = ("driver", "arrays", "streams", "launch", "torch_fast")

extensions = cythonize(
    [Extension(f"rawops._launch.{layer}", [f"rawops/_launch/{layer}.pyx"]) for layer in LAUNCH_LAYERS],
    compiler_directives={"language_level": "3", "boundscheck": False, "wraparound": False},
)

setup(
    ext_modules=extensions,
    cmdclass={"build_ext": BuildKernelsAndExtensions},
    # The generated C of the launcher is a build intermediate, not package data.
    exclude_package_data={"rawops": ["*.c"], "rawops._launch": ["*.c"]},
    package_data={"rawops": ["_fatbin/*.fatbin", "_fatbin/manifest.json", "_kernels/*.cu", "_kernels/include/rawops/*.cuh"],
                  "rawops._launch": ["*.pxd"]},
)
