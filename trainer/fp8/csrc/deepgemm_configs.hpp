// DeepGEMM's Hopper blockwise-FP8 kernels (github.com/deepseek-ai/DeepGEMM, MIT licence) as configs of
// this library, beside CUTLASS's: included by blockwise_gemm.cu, compiled only where the build finds a
// DeepGEMM checkout ($DEEPGEMM_DIR, which defines PUROKIT_WITH_DEEPGEMM); without one their configs
// answer PUROKIT_FP8_NOT_BUILT and the table never picks them.
//
// What DeepGEMM does differently from CUTLASS's blockwise mainloop (why it is here): each of the two
// math warpgroups owns 64 rows of the tile and runs its WGMMAs and its promotion independently of the
// other, so one's promotion FMAs overlap the other's tensor-core work; a 256-row tile is two "waves"
// of 128 rows through ONE temporary accumulator (64 + 2 x 64 registers a thread, where CUTLASS's
// 256 x 128 cooperative tile holds two 128 x 128 ones); the weight's 128 x 128 block scales are read
// once a tile from global memory into shared memory, the activations' per-row scales by TMA with the
// operands; the output leaves through shared memory and TMA (Wgrad: a TMA reduce-add into the fp32
// gradient, so accumulating costs no extra pass).
//
// The kernels are templates DeepGEMM compiles just in time for each (N, K); compiled ahead of time
// here, with N and K as constants for the act_weight kind (with them at run time ptxas spills 1.9 KB
// a thread in the 256-row tile) and at run time for act_act (0 spills). A config compiled for one
// (N, K) refuses every other shape (PUROKIT_FP8_WRONG_SHAPE); the measured table maps each shape of a
// preset to the config built for it. The persistent grid is kSms CTAs (an H100/H200 SXM's SM count)
// on any device: correct everywhere, tuned for those.
//
// Layouts are the library's (blockwise_gemm.cu's header), which are DeepGEMM's: A and B K-major,
// SFA (M, K/128) M-contiguous, act_weight's SFB (N/128, K/128) K-contiguous, act_act's SFB
// (N, K/128) N-contiguous.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include "cutlass/cuda_host_adapter.hpp"
#include "status.h"

#if defined(PUROKIT_WITH_DEEPGEMM)
#include <deep_gemm/impls/sm90_fp8_gemm_1d1d.cuh>
#include <deep_gemm/impls/sm90_fp8_gemm_1d2d.cuh>
#endif

namespace purokit_fp8 {

// Schedule tag of a DeepGEMM config: the kernel compiled for one (N, K), 0 = any.
template <int N, int K>
struct DeepGemm {
  static constexpr int kN = N;
  static constexpr int kK = K;
};

namespace deepgemm {

constexpr int kSms = 132;                 // persistent CTAs (one an SM on an H100/H200 SXM)
constexpr int kSmemCapacity = 232448;     // Hopper's dynamic shared memory per CTA
constexpr int kBarrierBytes = 16 * 8 * 2; // full + empty barriers of up to 16 stages
constexpr int kMaxScaleBlocksK = 256;     // act_weight: K <= 32,768 (the weight scales of a tile sit in smem)

constexpr int align_up(int x, int a) { return (x + a - 1) / a * a; }

// The largest TMA swizzle (128, 64, 32 or 16 bytes) dividing a row of `bytes`.
constexpr int swizzle_bytes(int bytes) {
  return bytes % 128 == 0 ? 128 : bytes % 64 == 0 ? 64 : bytes % 32 == 0 ? 32 : 16;
}

// Shared memory of DeepGEMM's two kernels, laid out as they lay it out, and the stages that fit.
template <int BM, int BN>
struct ActWeightSmem {  // sm90_fp8_gemm_1d2d: bf16 D tile, then per stage A, B and A's scales
  static constexpr int kD = align_up(BM * BN * 2, 1024);
  static constexpr int kPerStage = BM * 128 + BN * 128 + align_up(BM * 4, 128);
  static constexpr int kWeightScales = align_up(kMaxScaleBlocksK * (128 % BN == 0 ? 1 : 2) * 4, 8);
  static constexpr int kStages =
      (kSmemCapacity - kD - kBarrierBytes - kWeightScales) / kPerStage < 16
          ? (kSmemCapacity - kD - kBarrierBytes - kWeightScales) / kPerStage : 16;
  static int bytes(int k) { return kD + kStages * kPerStage + align_up(k / 128 * (128 % BN == 0 ? 1 : 2) * 4, 8) + kBarrierBytes; }
};
template <int BM, int BN>
struct ActActSmem {  // sm90_fp8_gemm_1d1d: fp32 D tile, then per stage A, B and both scale rows
  static constexpr int kD = BM * BN * 4;
  static constexpr int kPerStage = BM * 128 + BN * 128 + BM * 4 + align_up(BN * 4, 128);
  static constexpr int kStages = (kSmemCapacity - kD - kBarrierBytes) / kPerStage < 16
                                     ? (kSmemCapacity - kD - kBarrierBytes) / kPerStage : 16;
  static int bytes() { return kD + kStages * kPerStage + kBarrierBytes; }
};

// A 2-D TMA descriptor: `inner` contiguous elements a row, `outer` rows `stride` elements apart, boxes
// of box_inner x box_outer.
inline bool tma_2d(CUtensorMap* map, CUtensorMapDataType type, int elem_bytes, const void* base, int inner,
                   int outer, long stride, int box_inner, int box_outer, int swizzle) {
  cuuint64_t dims[2] = {static_cast<cuuint64_t>(inner), static_cast<cuuint64_t>(outer)};
  cuuint64_t strides[1] = {static_cast<cuuint64_t>(stride) * elem_bytes};
  cuuint32_t box[2] = {static_cast<cuuint32_t>(box_inner), static_cast<cuuint32_t>(box_outer)};
  cuuint32_t elem_strides[2] = {1, 1};
  CUtensorMapSwizzle sw = swizzle == 128  ? CU_TENSOR_MAP_SWIZZLE_128B
                          : swizzle == 64 ? CU_TENSOR_MAP_SWIZZLE_64B
                          : swizzle == 32 ? CU_TENSOR_MAP_SWIZZLE_32B
                                          : CU_TENSOR_MAP_SWIZZLE_NONE;
  CUresult r = CUTLASS_CUDA_DRIVER_WRAPPER_CALL(cuTensorMapEncodeTiled)(
      map, type, 2, const_cast<void*>(base), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, sw,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS;
}

// The kernel's dynamic shared memory limit, raised once a device (the attribute is per device context).
// `done` belongs to the config (one bit a device): every instantiation of a DeepGEMM kernel has the
// same function-pointer type, so a static here would be shared by all of them.
template <class Kernel>
bool allow_smem(Kernel kernel, int bytes, unsigned long long& done) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  unsigned long long bit = device < 64 ? 1ull << device : 0;
  if (bit != 0 && (done & bit)) return true;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) != cudaSuccess) return false;
  done |= bit;
  return true;
}

// Launch a persistent grid of kSms CTAs in clusters of `cluster` along x.
// `smem_max`: what any call of this kernel may take (the attribute is set once).
template <class Kernel, class... Args>
int launch(Kernel kernel, unsigned long long& smem_done, int threads, int smem, int smem_max, int cluster,
           cudaStream_t stream, Args... args) {
  if (!allow_smem(kernel, smem_max, smem_done)) return PUROKIT_FP8_CUDA_ERROR;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(kSms, 1, 1);
  config.blockDim = dim3(threads, 1, 1);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = cluster;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  config.attrs = attr;
  config.numAttrs = 1;
  if (cudaLaunchKernelEx(&config, kernel, args...) != cudaSuccess) return PUROKIT_FP8_CUDA_ERROR;
  return cudaPeekAtLastError() == cudaSuccess ? 0 : PUROKIT_FP8_CUDA_ERROR;
}

}  // namespace deepgemm

// One DeepGEMM config: tile BM x BN, a cluster of CM x CN CTAs (2 along M multicasts the B tile to
// both, 2 along N the A tile), compiled for (N, K) of Sched (0 = any).
template <int Kind, class Sched, int BM, int BN, int CM, int CN>
struct DeepGemmConfig {
  static_assert(Kind == 0 || Kind == 1, "DeepGEMM configs: act_weight (bf16 out) or act_act (fp32 out) only");
  static_assert(CM * CN <= 2, "DeepGEMM multicasts to 2 CTAs at most");
  static constexpr int kN = Sched::kN;
  static constexpr int kK = Sched::kK;
  static constexpr int kMathThreads = BM <= 64 ? 128 : 256;
  static constexpr int kThreads = 128 + kMathThreads;

  static int run(Problem const& p) {
    if ((kN != 0 && p.n != kN) || (kK != 0 && p.k != kK)) return PUROKIT_FP8_WRONG_SHAPE;
    if (Kind == 0 && p.k / 128 > deepgemm::kMaxScaleBlocksK) return PUROKIT_FP8_WRONG_SHAPE;
    // act_act accumulates by a TMA reduce-add into D: C must be D itself (beta 1) or absent (beta 0)
    if (Kind == 1 && p.c != nullptr && p.beta != 0.f && (p.c != p.d || p.beta != 1.f)) return PUROKIT_FP8_BAD_ARGUMENT;
    if (p.workspace_query != nullptr) {
      *p.workspace_query = 0;
#if defined(PUROKIT_WITH_DEEPGEMM)
      return 0;
#else
      return PUROKIT_FP8_NOT_BUILT;
#endif
    }
#if !defined(PUROKIT_WITH_DEEPGEMM)
    return PUROKIT_FP8_NOT_BUILT;
#else
    if constexpr (Kind == 0) return run_act_weight(p);
    else return run_act_act(p);
#endif
  }

#if defined(PUROKIT_WITH_DEEPGEMM)
  static int run_act_weight(Problem const& p) {
    using Smem = deepgemm::ActWeightSmem<BM, BN>;
    constexpr int kSwizzleD = deepgemm::swizzle_bytes(BN * 2);
    auto kernel = &deep_gemm::sm90_fp8_gemm_1d2d_impl<
        cute::UMMA::Major::K, 0, kN, kK, 1, BM, BN, 128, 128, 128, kSwizzleD, Smem::kStages, 128, kMathThreads,
        CM * CN, (CN > 1), deepgemm::kSms, deep_gemm::GemmType::Normal, cutlass::bfloat16_t,
        deep_gemm::epilogue::transform::EpilogueIdentity>;
    CUtensorMap ta, tb, td, tsa;
    using deepgemm::tma_2d;
    if (!tma_2d(&ta, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, p.a, p.k, p.m, p.k, 128, BM, 128) ||
        !tma_2d(&tb, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, p.b, p.k, p.n, p.k, 128, BN, 128) ||
        !tma_2d(&td, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, p.d, p.n, p.m, p.n, kSwizzleD / 2, BM, kSwizzleD) ||
        !tma_2d(&tsa, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, p.sa, p.m, p.k / 128, p.m, BM, 1, 0))
      return PUROKIT_FP8_CUDA_ERROR;
    static unsigned long long smem_done = 0;
    return deepgemm::launch(kernel, smem_done, kThreads, Smem::bytes(p.k), Smem::bytes(128 * deepgemm::kMaxScaleBlocksK),
                            CM * CN, p.stream, const_cast<float*>(p.sb),
                            static_cast<int*>(nullptr), static_cast<uint32_t>(p.m), static_cast<uint32_t>(p.n),
                            static_cast<uint32_t>(p.k), ta, tb, td, tsa);
  }

  static int run_act_act(Problem const& p) {
    using Smem = deepgemm::ActActSmem<BM, BN>;
    auto kernel = &deep_gemm::sm90_fp8_gemm_1d1d_impl<
        0, kN, kK, 1, BM, BN, 128, 128, 128, Smem::kStages, 128, kMathThreads, CM * CN, (CN > 1), deepgemm::kSms,
        deep_gemm::GemmType::Normal, float>;
    if (p.c == nullptr || p.beta == 0.f) {
      if (cudaMemsetAsync(p.d, 0, static_cast<size_t>(p.m) * p.n * sizeof(float), p.stream) != cudaSuccess)
        return PUROKIT_FP8_CUDA_ERROR;
    }
    CUtensorMap ta, tb, tsa, tsb, td;
    using deepgemm::tma_2d;
    if (!tma_2d(&ta, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, p.a, p.k, p.m, p.k, 128, BM, 128) ||
        !tma_2d(&tb, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, p.b, p.k, p.n, p.k, 128, BN, 128) ||
        !tma_2d(&tsa, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, p.sa, p.m, p.k / 128, p.m, BM, 1, 0) ||
        !tma_2d(&tsb, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, p.sb, p.n, p.k / 128, p.n, BN, 1, 0) ||
        !tma_2d(&td, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, p.d, p.n, p.m, p.n, BN, 64, 0))
      return PUROKIT_FP8_CUDA_ERROR;
    static unsigned long long smem_done = 0;
    return deepgemm::launch(kernel, smem_done, kThreads, Smem::bytes(), Smem::bytes(), CM * CN, p.stream,
                            static_cast<__nv_fp8_e4m3*>(nullptr), static_cast<__nv_fp8_e4m3*>(nullptr),
                            static_cast<int*>(nullptr), static_cast<cute::TmaDescriptor*>(nullptr),
                            static_cast<uint32_t>(p.m), static_cast<uint32_t>(p.n), static_cast<uint32_t>(p.k), ta,
                            tb, tsa, tsb, td);
  }
#endif
};

}  // namespace purokit_fp8
