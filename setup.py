"""Build rawops: nvcc compiles kernels/*.cu into rawops/_fatbin/<family>.fatbin, Cython
builds the launcher. The nvcc is the machine's, else the nvidia-cuda-nvcc wheel's (which the
in-tree backend _build/backend.py requires where the machine has none); a fatbin whose
inputs are unchanged is copied from the build cache (rawops/_nvcc.py build_fatbin). Without
nvcc the build still succeeds and ships the sources, which rawops then compiles at first use
through NVRTC (see rawops/_modules.py)."""
import concurrent.futures
import glob
import importlib.util
import os
import shutil
import sys
import threading

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

    def finalize_options(self):
        super().finalize_options()
        if self.parallel is None:  # the launcher's layers compile side by side, as the kernels do
            self.parallel = os.cpu_count() or 1

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
        include_dir = os.path.join(HERE, "kernels", "include")
        sources = sorted(glob.glob(os.path.join(HERE, "kernels", "*.cu")))
        families = {os.path.splitext(os.path.basename(path))[0] for path in sources}
        nvcc, origin = nvcc_helpers.locate_nvcc()
        if nvcc is None:
            # Fatbins left by an earlier build would otherwise ship as if freshly built.
            shutil.rmtree(fatbin_dir, ignore_errors=True)
            specific = sorted(os.path.splitext(os.path.basename(path))[0] for path in sources
                              if nvcc_helpers.arch_directive(path))
            print(f"rawops: WARNING nvcc not found ({origin}); shipping kernel sources only: NVRTC compiles them "
                  f"at first use" + (f", and {', '.join(specific)} is unavailable (its ops run portable kernels)"
                                     if specific else ""))
            return
        archs = nvcc_helpers.target_archs()
        cache = nvcc_helpers.cache_dir()
        version = nvcc_helpers.nvcc_version(nvcc).splitlines()[-1]
        print(f"rawops: nvcc {version} at {nvcc} ({origin}); build cache {cache} ({nvcc_helpers.CACHE_ENV})")
        for stale in glob.glob(os.path.join(fatbin_dir, "*.fatbin")):  # a removed kernel family
            if os.path.splitext(os.path.basename(stale))[0] not in families:
                os.remove(stale)
        only = nvcc_helpers.selected_families()
        if only is not None:
            print(f"rawops: {nvcc_helpers.FAMILIES_ENV} set: building only {sorted(only)}")
            sources = [path for path in sources if os.path.splitext(os.path.basename(path))[0] in only]
        # What the manifest says of families this build leaves as they are (RAWOPS_FAMILIES).
        old = nvcc_helpers.read_manifest(fatbin_dir) or {}
        specific = dict(old.get("specific", {}))
        unavailable = dict(old.get("unavailable", {})) if only is not None else {}
        digests = dict(old.get("digests", {})) if only is not None else {}
        if only is not None:  # the other families' fatbins stay: the manifest must still be true of them
            kept = {f for f in families - only - set(specific)
                    if os.path.exists(os.path.join(fatbin_dir, f"{f}.fatbin"))}
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
                skip = f"the build targets none of {' '.join(directive)}"
            elif nvcc_helpers.uses_cutlass(cu_path) and cutlass is None:
                skip = (f"no CuTe/CUTLASS headers (pip install nvidia-cutlass, or set "
                        f"{nvcc_helpers.CUTLASS_ENV})")
            if skip:
                if os.path.exists(out_path):
                    os.remove(out_path)  # never ship a stale fatbin as if freshly built
                specific.pop(family, None)
                digests.pop(family, None)
                unavailable[family] = skip
                print(f"rawops: skipping {family}: {skip}; its ops run portable kernels")
                continue
            unavailable.pop(family, None)
            jobs.append((family, cu_path, out_path, targets, cutlass))
            if targets:
                specific[family] = [f"sm_{t}" for t in targets]
        # One nvcc per family, side by side: each compiles its architectures in turn. Their log lines are
        # written whole under a lock (print writes the text and the newline apart: two threads' lines
        # interleaved, and a family's line went missing from the packaging test's reading of the log).
        lock = threading.Lock()

        def log(line):
            with lock:
                sys.stdout.write(line + "\n")
                sys.stdout.flush()

        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(len(jobs), os.cpu_count() or 1))) as pool:
            for family, done in [(family, pool.submit(nvcc_helpers.build_fatbin, nvcc, cu_path, include_dir, out_path,
                                                      archs, targets=targets, cutlass=cutlass, cache=cache, log=log))
                                 for family, cu_path, out_path, targets, cutlass in jobs]:
                digests[family] = done.result()[0]  # nvcc's error, if any, surfaces here
        present = {f for f in families if os.path.exists(os.path.join(fatbin_dir, f"{f}.fatbin"))}
        specific = {f: t for f, t in specific.items() if f in present}
        digests = {f: d for f, d in digests.items() if f in present}
        os.makedirs(fatbin_dir, exist_ok=True)
        nvcc_helpers.write_manifest(fatbin_dir, archs, nvcc, specific, unavailable, digests)


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
    package_data={"rawops": ["_fatbin/*.fatbin", "_fatbin/manifest.json", "_kernels/*.cu",
                             "_kernels/include/rawops/*.cuh"],
                  "rawops._launch": ["*.pxd"]},
)
