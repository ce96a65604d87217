#!/usr/bin/env bash
# Cubins for bench/explore_matmul.py, built where nvcc is (sm_90): the current kernels plus
# extra variants, v3 (the matrix family before the float4 FFMA / new small-batch kernels) and v5
# (linear_small staging all of x before its first FMA).
set -e
cd "$(dirname "$0")"
nvcc -std=c++17 -O3 -arch=sm_90 -cubin -I../../kernels/include matmul_variants.cu -o matmul_variants.cubin
git -C ../.. show 47f7af2:kernels/matmul.cu > /tmp/rawops_matmul_v3.cu
nvcc -std=c++17 -O3 -arch=sm_90 -cubin -I../../kernels/include /tmp/rawops_matmul_v3.cu -o matmul_v3.cubin
git -C ../.. show fa59f87:kernels/matmul.cu > /tmp/rawops_matmul_v5.cu
nvcc -std=c++17 -O3 -arch=sm_90 -cubin -I../../kernels/include /tmp/rawops_matmul_v5.cu -o matmul_v5.cubin
