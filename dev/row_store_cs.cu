// The row kernels (kernels/softmaxes.cu, or kernels/norm.cu with -DROW_STORE_CS_NORM) with every
// 16-byte output store evict-first (st.global.cs), as Liger's Triton softmax and rms_norm write their
// outputs (cache_modifier=".cs"); the loads as shipped. An experiment for dev/time_row_fwd_variants.py:
// the rows' only difference from the shipped kernels is the store instruction.
#include "rawops/dtype.cuh"
#define store16 store16_streaming
#ifdef ROW_STORE_CS_NORM
#include "../kernels/norm.cu"
#else
#include "../kernels/softmaxes.cu"
#endif
