// The library's statuses past CUTLASS's own (cutlass::Status, 1..11), shared by blockwise_gemm.cu (the
// GEMMs) and quantize.cu (the activation quantizers); purokit_fp8_status_string names them.
#pragma once

#define PUROKIT_FP8_BAD_CONFIG 100   // no config of that index, or of another kind
#define PUROKIT_FP8_BAD_SHAPE 101    // sizes not positive multiples of 128 (or a row stride under the width)
#define PUROKIT_FP8_SMALL_WORKSPACE 102
#define PUROKIT_FP8_CUDA_ERROR 103   // a CUDA runtime error (launch, attribute), see cudaGetLastError
#define PUROKIT_FP8_EXCEPTION 104    // a C++ exception inside CUTLASS's host code
#define PUROKIT_FP8_BAD_ARGUMENT 105 // null pointer, C with a bf16 output, bad raster/swizzle
#define PUROKIT_FP8_MISALIGNED 106   // an operand, scale or output address not 16-byte aligned
#define PUROKIT_FP8_WRONG_SHAPE 107  // a config compiled for another (N, K) (DeepGEMM configs)
#define PUROKIT_FP8_NOT_BUILT 108    // a DeepGEMM config in a library built without DeepGEMM
