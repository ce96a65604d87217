#!/usr/bin/env bash
# Cubins for bench/explore_matmul.py, built where nvcc is (sm_90): the current kernels plus
# extra variants (v6 of the small-batch kernel among them), and v3 (the matrix family before the
# float4 FFMA / new small-batch kernels).
set -e
cd "$(dirname "$0")"
nvcc -std=c++17 -O3 -arch=sm_90 -cubin -I../../kernels/include matmul_variants.cu -o matmul_variants.cubin
git -C ../.. show 47f7af2:kernels/matmul.cu > /tmp/rawops_matmul_v3.cu
nvcc -std=c++17 -O3 -arch=sm_90 -cubin -I../../kernels/include /tmp/rawops_matmul_v3.cu -o matmul_v3.cubin
