// Programmatic dependent launch (sm_90+): a kernel launched with it (rawops/_launch/driver.pyx,
// launch_dependent) may be scheduled while the stream's previous kernel still runs, hiding
// its launch latency; it must call wait_for_previous_grid() before reading that kernel's
// output (the previous grid complete, its memory visible). allow_dependent_launch() in the
// previous kernel lets the dependent grid be scheduled before its blocks exit. Both compile
// to nothing below sm_90, where launches stay ordered as usual.
#pragma once

namespace rawops {

__device__ __forceinline__ void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

}  // namespace rawops
