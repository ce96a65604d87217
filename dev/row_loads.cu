// The row kernels (kernels/norm.cu, or kernels/softmaxes.cu with -DROW_LOADS_SOFTMAXES) with each row's
// 16-byte slice loads marked L1::no_allocate, so that the streamed rows do not evict the weight and bias
// lines that every row of an SM reads again after its reduction (load_row: cached as shipped). An
// experiment for dev/time_row_fwd_variants.py.
#include "rawops/dtype.cuh"
namespace rawops {
template <typename T>
__device__ __forceinline__ Vec16<T> load16_no_l1(const T* p) {
  uint4 r;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(p));
  Vec16<T> out;
  *reinterpret_cast<uint4*>(&out) = r;
  return out;
}
}  // namespace rawops
#define RAWOPS_ROW_SLICE_LOAD load16_no_l1
#ifdef ROW_LOADS_SOFTMAXES
#include "../kernels/softmaxes.cu"
#else
#include "../kernels/norm.cu"
#endif
