"""The Cython launcher, one layer a module (each .pyx with a .pxd, as CuPy layers its own):

  driver      libcuda resolved at first use: launches, the current-device query, pointer
              attributes, events, TMA descriptors
  arrays      device arrays from CuPy, __cuda_array_interface__ or DLPack, zero-copy, and the
              checks every launch makes (dtype, alignment, device)
  streams     which stream a launch goes on, producer ordering, scratch held during capture
  launch      the generic launcher and the elementwise map kernels (the CuPy API's entries)
  torch_fast  tensors launched from data_ptr() on torch's current stream (the adapter's
              no-grad entries, the GEMM and MLP fast paths); torch is never imported here

Policy (which kernel, what shape) lives in the Python family modules; this package checks and
launches. The names below are what those modules use.
"""
from .arrays import (DTYPE_NAMES, FLOAT_SUFFIXES, NUMPY_DTYPES, DeviceArray, as_array, dtype_name, real_scalar,
                     require_str, resolve_device)
from .driver import (TENSOR_MAP_BFLOAT16, TENSOR_MAP_FLOAT16, TENSOR_MAP_FLOAT32, TENSOR_MAP_SWIZZLE_128B,
                     TENSOR_MAP_TFLOAT32, NoDeviceError, encode_tensor_map_2d, sm_count)
from .launch import (MAP_CAPPED_SHAPE, MAP_SHAPE, CupyMapEntry, MapKernel, launch, map_launch_config, map_shape,
                     map_unroll)
from .streams import allocating_on, hold_if_capturing, release_captured_scratch, stream_pointer, wait_for_producer
from .torch_fast import (TorchLinearEntry, TorchMapEntry, TorchMatmulEntry, map_call, register_torch,
                         register_torch_gemm, register_torch_modules, tensor_code, torch_linear, torch_matmul,
                         torch_source_forward, torch_source_module_call, torch_source_train_backward,
                         torch_source_train_forward)
