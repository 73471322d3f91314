// Blockwise-FP8 GEMMs for Hopper (sm_90a) on CUTLASS's warp-specialized FP8 blockwise mainloop
// (`KernelTmaWarpSpecialized{Cooperative,Pingpong}FP8Blockwise`), exported as a plain C library
// together with the activation quantizers of quantize.cu (the purokit_fp8_*quant* entry points).
//
// No torch headers and no pybind: the library is loaded with ctypes (trainer/fp8/cutlass_gemm.py), so
// it does not depend on torch's C++ ABI. Every entry point takes raw device pointers, sizes, a
// workspace and a cudaStream_t, and returns an int status (0 ok, see purokit_fp8_status_string).
// Nothing here throws or aborts: a problem the kernel cannot run is refused through can_implement.
//
// Notation is CUTLASS's: D (M, N) = A (M, K) B (N, K)^T, A and B both K-major (row-major in
// memory, "TN"), D row-major. The scale layouts are trainer.fp8's (trainer/fp8/triton_kernels.py):
//
//   kind          A scales (SFA)                   B scales (SFB)                     D
//   act_weight    1x128 along K: (M, K/128)        128x128 blocks: (N/128, K/128)     bf16
//                 column-major (M contiguous)      row-major (K/128 contiguous)
//   act_act       1x128 along K: (M, K/128)        1x128 along K: (N, K/128)          fp32, + beta C
//                 column-major                     column-major
//   act_act_bf16  as act_act                       as act_act                         bf16
//
// act_weight serves Fprop (A = x, B = w) and Dgrad (A = dy, B = w^T copy (K, N) row-major, whose
// block scales are ws^T: pass ws.t().contiguous()); act_act serves Wgrad (A = dy^T, B = x^T, both
// quantized along the tokens), with C = D = an fp32 gradient buffer and beta = 1 to accumulate.
//
// The build (trainer/fp8/csrc/build.py) compiles this file once per config with
// -DPUROKIT_FP8_CONFIG=<index> (each object instantiates one kernel, so they compile in parallel)
// and once with -DPUROKIT_FP8_CONFIG=-1 for the exported API; without the macro one object holds all.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/detail/blockwise_scale_layout.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/dispatch_policy.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/gemm/kernel/tile_scheduler_params.h"
#include "cutlass/numeric_types.h"
#include "cutlass/util/packed_stride.hpp"

#include "pipelined_promotion.hpp"
#include "status.h"

// ------------------------------------------------------------------------------------------------
// The exported API: one table, mirrored by trainer/fp8/cutlass_gemm.py (_API), which compares it
// with purokit_fp8_abi() (the same table, stringified here) when it loads the library.
// ------------------------------------------------------------------------------------------------

#define PUROKIT_FP8_ABI_VERSION 4

#define PUROKIT_FP8_API(X)                                                                          \
  X(int, purokit_fp8_abi_version, (void))                                                           \
  X(const char*, purokit_fp8_abi, (void))                                                           \
  X(int, purokit_fp8_config_count, (void))                                                          \
  X(const char*, purokit_fp8_config_name, (int config))                                             \
  X(const char*, purokit_fp8_config_kind, (int config))                                             \
  X(int, purokit_fp8_config_shape, (int config, int* n, int* k))                                    \
  X(const char*, purokit_fp8_status_string, (int status))                                           \
  X(int, purokit_fp8_workspace_size,                                                                \
    (int config, int m, int n, int k, int raster, int swizzle, size_t* out))                        \
  X(int, purokit_fp8_act_weight,                                                                    \
    (int config, const void* a, const void* b, const float* sa, const float* sb, void* d, int m,   \
     int n, int k, int raster, int swizzle, void* workspace, size_t workspace_size,                 \
     cudaStream_t stream))                                                                          \
  X(int, purokit_fp8_act_act,                                                                       \
    (int config, const void* a, const void* b, const float* sa, const float* sb, const float* c,   \
     void* d, float beta, int m, int n, int k, int raster, int swizzle, void* workspace,            \
     size_t workspace_size, cudaStream_t stream))                                                   \
  X(int, purokit_fp8_quant_act,                                                                     \
    (const void* x, int m, int k, long ldx, int pow2, void* q, float* s, void* qt, float* st,        \
     int m_pad, cudaStream_t stream))                                                               \
  X(int, purokit_fp8_swiglu_quant,                                                                  \
    (const void* gu, int m, int f, long ldg, int pow2, void* q, float* s, void* qt, float* st,       \
     int m_pad, cudaStream_t stream))                                                               \
  X(int, purokit_fp8_swiglu_bwd_quant,                                                              \
    (const void* gu, const void* dh, int m, int f, long ldg, long ldd, int pow2, void* q, float* s, \
     void* qt, float* st, int m_pad, cudaStream_t stream))


// The config table: index, kind, name, mainloop schedule, tile M/N/K, cluster M/N, tile scheduler.
// Schedules: Coop = two consumer warpgroups sharing one tile (each owns half its rows);
// Pingpong = two consumer warpgroups on alternate tiles, so one's promotion FMAs and epilogue
// overlap the other's WGMMAs; CoopPipelined = Coop whose warpgroups each run one k-block ahead of
// their promotion (pipelined_promotion.hpp: tile 128 x 128 only). The blockwise mainloop takes tile
// M 128 or 256 and K = 128.
// Tile schedulers: Persistent (data-parallel tiles, CTA swizzle) or StreamK (cooperative only:
// splits the long K of Wgrad over CTAs where the tile count leaves SMs idle in the last wave).
// A cluster of 2 along M multicasts the B tile (the weight, or x^T in Wgrad) to both CTAs, one of
// 2 along N the A tile (the activations, or dy^T).
// Kinds: 0 act_weight (bf16 out), 1 act_act (fp32 out, + beta C), 2 act_act_bf16.
// DeepGemm rows (deepgemm_configs.hpp) run DeepGEMM's kernels instead: their schedule names the (N, K)
// the kernel is compiled for (DgAny: any), the tile scheduler column is ignored (always persistent) and
// so are raster and swizzle (DeepGEMM swizzles its tiles itself). act_weight rows exist for each (N, K)
// of the 1.7B preset's Fprop and Dgrad (192-column tiles where N is a multiple of 192: a tile then spans
// two weight-scale blocks); act_act rows take any shape.
#define PUROKIT_FP8_CONFIGS(X)                                                              \
  X(0, 0, "coop_128x128_c1x1", Coop, 128, 128, 128, 1, 1, Persistent)                                \
  X(1, 0, "coop_256x128_c2x1", Coop, 256, 128, 128, 2, 1, Persistent)                                \
  X(2, 0, "pingpong_128x128_c1x1", Pingpong, 128, 128, 128, 1, 1, Persistent)                        \
  X(3, 0, "coop_128x256_c1x1", Coop, 128, 256, 128, 1, 1, Persistent)                                \
  X(4, 0, "coop_128x128_c2x1", Coop, 128, 128, 128, 2, 1, Persistent)                                \
  X(5, 1, "coop_128x128_c1x1", Coop, 128, 128, 128, 1, 1, Persistent)                                \
  X(6, 1, "coop_256x128_c2x1", Coop, 256, 128, 128, 2, 1, Persistent)                                \
  X(7, 1, "pingpong_128x128_c1x1", Pingpong, 128, 128, 128, 1, 1, Persistent)                        \
  X(8, 1, "coop_128x128_c2x1", Coop, 128, 128, 128, 2, 1, Persistent)                                \
  X(9, 1, "coop_128x128_c1x1_streamk", Coop, 128, 128, 128, 1, 1, StreamK)                           \
  X(10, 1, "coop_256x128_c2x1_streamk", Coop, 256, 128, 128, 2, 1, StreamK)                          \
  X(11, 2, "coop_128x128_c1x1", Coop, 128, 128, 128, 1, 1, Persistent)                               \
  X(12, 0, "coop_256x128_c1x1", Coop, 256, 128, 128, 1, 1, Persistent)                               \
  X(13, 0, "coop_256x128_c1x2", Coop, 256, 128, 128, 1, 2, Persistent)                               \
  X(14, 1, "coop_256x128_c1x1", Coop, 256, 128, 128, 1, 1, Persistent)                               \
  X(15, 0, "pipelined_128x128_c1x1", CoopPipelined, 128, 128, 128, 1, 1, Persistent)                 \
  X(16, 0, "pipelined_128x128_c2x1", CoopPipelined, 128, 128, 128, 2, 1, Persistent)                 \
  X(17, 0, "pipelined_128x128_c1x2", CoopPipelined, 128, 128, 128, 1, 2, Persistent)                 \
  X(18, 1, "pipelined_128x128_c1x1", CoopPipelined, 128, 128, 128, 1, 1, Persistent)                 \
  X(19, 1, "pipelined_128x128_c2x1", CoopPipelined, 128, 128, 128, 2, 1, Persistent)                 \
  X(20, 0, "deepgemm_256x128_c1x1_n4096_k2048", DgN4096K2048, 256, 128, 128, 1, 1, Persistent)       \
  X(21, 0, "deepgemm_256x128_c2x1_n4096_k2048", DgN4096K2048, 256, 128, 128, 2, 1, Persistent)       \
  X(22, 0, "deepgemm_256x128_c1x2_n4096_k2048", DgN4096K2048, 256, 128, 128, 1, 2, Persistent)       \
  X(23, 0, "deepgemm_128x128_c1x1_n4096_k2048", DgN4096K2048, 128, 128, 128, 1, 1, Persistent)       \
  X(24, 0, "deepgemm_256x128_c1x1_n2048_k2048", DgN2048K2048, 256, 128, 128, 1, 1, Persistent)       \
  X(25, 0, "deepgemm_256x128_c2x1_n2048_k2048", DgN2048K2048, 256, 128, 128, 2, 1, Persistent)       \
  X(26, 0, "deepgemm_256x128_c1x2_n2048_k2048", DgN2048K2048, 256, 128, 128, 1, 2, Persistent)       \
  X(27, 0, "deepgemm_128x128_c1x1_n2048_k2048", DgN2048K2048, 128, 128, 128, 1, 1, Persistent)       \
  X(28, 0, "deepgemm_256x128_c1x1_n12288_k2048", DgN12288K2048, 256, 128, 128, 1, 1, Persistent)     \
  X(29, 0, "deepgemm_256x128_c2x1_n12288_k2048", DgN12288K2048, 256, 128, 128, 2, 1, Persistent)     \
  X(30, 0, "deepgemm_256x128_c1x2_n12288_k2048", DgN12288K2048, 256, 128, 128, 1, 2, Persistent)     \
  X(31, 0, "deepgemm_128x128_c1x1_n12288_k2048", DgN12288K2048, 128, 128, 128, 1, 1, Persistent)     \
  X(32, 0, "deepgemm_256x128_c1x1_n2048_k6144", DgN2048K6144, 256, 128, 128, 1, 1, Persistent)       \
  X(33, 0, "deepgemm_256x128_c2x1_n2048_k6144", DgN2048K6144, 256, 128, 128, 2, 1, Persistent)       \
  X(34, 0, "deepgemm_256x128_c1x2_n2048_k6144", DgN2048K6144, 256, 128, 128, 1, 2, Persistent)       \
  X(35, 0, "deepgemm_128x128_c1x1_n2048_k6144", DgN2048K6144, 128, 128, 128, 1, 1, Persistent)       \
  X(36, 0, "deepgemm_256x128_c1x1_n2048_k4096", DgN2048K4096, 256, 128, 128, 1, 1, Persistent)       \
  X(37, 0, "deepgemm_256x128_c2x1_n2048_k4096", DgN2048K4096, 256, 128, 128, 2, 1, Persistent)       \
  X(38, 0, "deepgemm_256x128_c1x2_n2048_k4096", DgN2048K4096, 256, 128, 128, 1, 2, Persistent)       \
  X(39, 0, "deepgemm_128x128_c1x1_n2048_k4096", DgN2048K4096, 128, 128, 128, 1, 1, Persistent)       \
  X(40, 0, "deepgemm_256x128_c1x1_n2048_k12288", DgN2048K12288, 256, 128, 128, 1, 1, Persistent)     \
  X(41, 0, "deepgemm_256x128_c2x1_n2048_k12288", DgN2048K12288, 256, 128, 128, 2, 1, Persistent)     \
  X(42, 0, "deepgemm_256x128_c1x2_n2048_k12288", DgN2048K12288, 256, 128, 128, 1, 2, Persistent)     \
  X(43, 0, "deepgemm_128x128_c1x1_n2048_k12288", DgN2048K12288, 128, 128, 128, 1, 1, Persistent)     \
  X(44, 0, "deepgemm_256x128_c1x1_n6144_k2048", DgN6144K2048, 256, 128, 128, 1, 1, Persistent)       \
  X(45, 0, "deepgemm_256x128_c2x1_n6144_k2048", DgN6144K2048, 256, 128, 128, 2, 1, Persistent)       \
  X(46, 0, "deepgemm_256x128_c1x2_n6144_k2048", DgN6144K2048, 256, 128, 128, 1, 2, Persistent)       \
  X(47, 0, "deepgemm_128x128_c1x1_n6144_k2048", DgN6144K2048, 128, 128, 128, 1, 1, Persistent)       \
  X(48, 1, "deepgemm_128x128_c1x1", DgAny, 128, 128, 128, 1, 1, Persistent)                          \
  X(49, 1, "deepgemm_128x128_c2x1", DgAny, 128, 128, 128, 2, 1, Persistent)                          \
  X(50, 1, "deepgemm_128x128_c1x2", DgAny, 128, 128, 128, 1, 2, Persistent)                          \
  X(51, 0, "deepgemm_128x192_c1x1_n12288_k2048", DgN12288K2048, 128, 192, 128, 1, 1, Persistent)     \
  X(52, 0, "deepgemm_128x192_c2x1_n12288_k2048", DgN12288K2048, 128, 192, 128, 2, 1, Persistent)     \
  X(53, 0, "deepgemm_128x192_c1x1_n6144_k2048", DgN6144K2048, 128, 192, 128, 1, 1, Persistent)       \
  X(54, 0, "deepgemm_128x192_c2x1_n6144_k2048", DgN6144K2048, 128, 192, 128, 2, 1, Persistent)

namespace purokit_fp8 {

using namespace cute;

constexpr int kGroup = 128;

// Everything an entry point passes to a kernel config.
struct Problem {
  int m, n, k;
  const void* a;
  const void* b;
  const float* sa;
  const float* sb;
  const float* c;
  void* d;
  float beta;
  int raster, swizzle;
  void* workspace;
  size_t workspace_size;
  cudaStream_t stream;
  size_t* workspace_query;  // non-null: only report the workspace size
};

struct Coop {
  using Mainloop = cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8Blockwise;
  using Epilogue = cutlass::epilogue::TmaWarpSpecializedCooperative;
  static constexpr bool kPipelinedPromotion = false;
};
struct CoopPipelined : Coop {
  static constexpr bool kPipelinedPromotion = true;
};
struct Pingpong {
  using Mainloop = cutlass::gemm::KernelTmaWarpSpecializedPingpongFP8Blockwise;
  using Epilogue = cutlass::epilogue::TmaWarpSpecialized;
  static constexpr bool kPipelinedPromotion = false;
};

using Persistent = cutlass::gemm::PersistentScheduler;
using StreamK = cutlass::gemm::StreamKScheduler;

// Kind traits: B-scale granularity along N and its major mode, C and D element types.
template <int Kind> struct KindTraits;
template <> struct KindTraits<0> {  // act_weight
  static constexpr int GranN = kGroup;
  static constexpr auto MajorSFB = cute::GMMA::Major::K;
  using ElementC = void;
  using ElementD = cutlass::bfloat16_t;
};
template <> struct KindTraits<1> {  // act_act, fp32 out
  static constexpr int GranN = 1;
  static constexpr auto MajorSFB = cute::GMMA::Major::MN;
  using ElementC = float;
  using ElementD = float;
};
template <> struct KindTraits<2> {  // act_act, bf16 out
  static constexpr int GranN = 1;
  static constexpr auto MajorSFB = cute::GMMA::Major::MN;
  using ElementC = void;
  using ElementD = cutlass::bfloat16_t;
};

// The SM count of a device, queried once (the persistent schedulers size their grids by it).
inline int sm_count(int device) {
  static int counts[64] = {};
  if (device < 0 || device >= 64) return cutlass::KernelHardwareInfo::query_device_multiprocessor_count(device);
  if (counts[device] <= 0) counts[device] = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(device);
  return counts[device];
}

template <int Kind, class Schedule, int TM, int TN, int TK, int CM, int CN, class TileScheduler>
struct BlockwiseGemm {
  using KT = KindTraits<Kind>;
  using ElementA = cutlass::float_e4m3_t;
  using ElementB = cutlass::float_e4m3_t;
  using ElementC = typename KT::ElementC;
  using ElementD = typename KT::ElementD;
  using LayoutA = cutlass::layout::RowMajor;     // (M, K), K contiguous
  using LayoutB = cutlass::layout::ColumnMajor;  // (K, N) column-major == (N, K) row-major
  using LayoutCD = cutlass::layout::RowMajor;
  static constexpr int AlignmentAB = 16;
  static constexpr int AlignmentD = 128 / cutlass::sizeof_bits<ElementD>::value;
  static constexpr int AlignmentC = cute::is_void_v<ElementC> ? AlignmentD : 128 / cutlass::sizeof_bits<
      cute::conditional_t<cute::is_void_v<ElementC>, float, ElementC>>::value;

  using TileShape = Shape<Int<TM>, Int<TN>, Int<TK>>;
  using ClusterShape = Shape<Int<CM>, Int<CN>, _1>;
  using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, KT::GranN, kGroup, cute::GMMA::Major::MN,
                                                                 KT::MajorSFB>;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());

  using Fusion = cutlass::epilogue::fusion::LinearCombination<ElementD, float, ElementC, float>;
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, ElementC, LayoutCD, AlignmentC, ElementD,
      LayoutCD, AlignmentD, typename Schedule::Epilogue, Fusion>::CollectiveOp;

  using BuiltMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA, cute::tuple<LayoutA, LayoutSFA>, AlignmentAB,
      ElementB, cute::tuple<LayoutB, LayoutSFB>, AlignmentAB, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      typename Schedule::Mainloop>::CollectiveOp;
  using CollectiveMainloop = cute::conditional_t<Schedule::kPipelinedPromotion,
                                                 PipelinedPromotionMma<BuiltMainloop>, BuiltMainloop>;

  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop,
                                                          CollectiveEpilogue, TileScheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

  static int run(Problem const& p) {
    using StrideA = typename Gemm::GemmKernel::StrideA;
    using StrideB = typename Gemm::GemmKernel::StrideB;
    using StrideC = typename Gemm::GemmKernel::StrideC;
    using StrideD = typename Gemm::GemmKernel::StrideD;
    using Raster = cutlass::gemm::kernel::detail::RasterOrderOptions;

    auto stride_a = cutlass::make_cute_packed_stride(StrideA{}, cute::make_shape(p.m, p.k, 1));
    auto stride_b = cutlass::make_cute_packed_stride(StrideB{}, cute::make_shape(p.n, p.k, 1));
    auto stride_c = cutlass::make_cute_packed_stride(StrideC{}, cute::make_shape(p.m, p.n, 1));
    auto stride_d = cutlass::make_cute_packed_stride(StrideD{}, cute::make_shape(p.m, p.n, 1));
    auto layout_sfa = ScaleConfig::tile_atom_to_shape_SFA(make_shape(p.m, p.n, p.k, 1));
    auto layout_sfb = ScaleConfig::tile_atom_to_shape_SFB(make_shape(p.m, p.n, p.k, 1));

    // without C (c == nullptr) D stands in for it with beta = 0, so it is never read
    float beta = 0.f;
    void const* c_ptr = nullptr;
    if constexpr (!cute::is_void_v<ElementC>) {
      c_ptr = p.c != nullptr ? static_cast<void const*>(p.c) : static_cast<void const*>(p.d);
      beta = p.c != nullptr ? p.beta : 0.f;
    }

    typename Gemm::Arguments args{};
    args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
    args.problem_shape = {p.m, p.n, p.k, 1};
    args.mainloop = {static_cast<ElementA const*>(p.a), stride_a, static_cast<ElementB const*>(p.b), stride_b,
                     p.sa, layout_sfa, p.sb, layout_sfb};
    args.epilogue = {{}, static_cast<typename Gemm::GemmKernel::ElementC const*>(c_ptr), stride_c,
                     static_cast<ElementD*>(p.d), stride_d};
    args.epilogue.thread.alpha = 1.f;
    args.epilogue.thread.beta = beta;
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) return PUROKIT_FP8_CUDA_ERROR;
    args.hw_info.device_id = device;
    args.hw_info.sm_count = sm_count(device);
    if (args.hw_info.sm_count <= 0) return PUROKIT_FP8_CUDA_ERROR;
    args.scheduler.raster_order = p.raster == 1 ? Raster::AlongM : p.raster == 2 ? Raster::AlongN : Raster::Heuristic;
    args.scheduler.max_swizzle_size = p.swizzle;

    Gemm gemm;
    cutlass::Status status = gemm.can_implement(args);
    if (status != cutlass::Status::kSuccess) return static_cast<int>(status);
    size_t need = Gemm::get_workspace_size(args);
    if (p.workspace_query != nullptr) {
      *p.workspace_query = need;
      return 0;
    }
    if (need > p.workspace_size || (need > 0 && p.workspace == nullptr)) return PUROKIT_FP8_SMALL_WORKSPACE;
    status = gemm.initialize(args, p.workspace, p.stream);
    if (status != cutlass::Status::kSuccess) return static_cast<int>(status);
    status = gemm.run(p.stream);
    if (status != cutlass::Status::kSuccess) return static_cast<int>(status);
    return cudaPeekAtLastError() == cudaSuccess ? 0 : PUROKIT_FP8_CUDA_ERROR;
  }
};

}  // namespace purokit_fp8

#include "deepgemm_configs.hpp"

namespace purokit_fp8 {

// A DeepGemm schedule takes DeepGEMM's kernel in place of CUTLASS's.
template <int Kind, int N, int K, int TM, int TN, int TK, int CM, int CN, class TileScheduler>
struct BlockwiseGemm<Kind, DeepGemm<N, K>, TM, TN, TK, CM, CN, TileScheduler>
    : DeepGemmConfig<Kind, DeepGemm<N, K>, TM, TN, CM, CN> {};

// The (N, K) shapes the DeepGemm rows of the table are compiled for.
using DgAny = DeepGemm<0, 0>;
using DgN4096K2048 = DeepGemm<4096, 2048>;    // qkv Fprop
using DgN2048K2048 = DeepGemm<2048, 2048>;    // o Fprop and Dgrad
using DgN12288K2048 = DeepGemm<12288, 2048>;  // gate-up Fprop
using DgN2048K6144 = DeepGemm<2048, 6144>;    // down Fprop
using DgN2048K4096 = DeepGemm<2048, 4096>;    // qkv Dgrad
using DgN2048K12288 = DeepGemm<2048, 12288>;  // gate-up Dgrad
using DgN6144K2048 = DeepGemm<6144, 2048>;    // down Dgrad

// The (N, K) a config only runs (0, 0: any).
template <class Schedule> struct CompiledShape { static constexpr int n = 0, k = 0; };
template <int N, int K> struct CompiledShape<DeepGemm<N, K>> { static constexpr int n = N, k = K; };

using RunFn = int (*)(Problem const&);

#define PUROKIT_FP8_DECLARE(id, kind, name, sched, tm, tn, tk, cm, cn, tile) int run_config_##id(Problem const& p);
PUROKIT_FP8_CONFIGS(PUROKIT_FP8_DECLARE)
#undef PUROKIT_FP8_DECLARE

// Each config's kernel type, by index (naming the type instantiates nothing).
template <int Id> struct Config;
#define PUROKIT_FP8_TYPE(id, kind, name, sched, tm, tn, tk, cm, cn, tile) \
  template <> struct Config<id> { using Gemm = BlockwiseGemm<kind, sched, tm, tn, tk, cm, cn, tile>; };
PUROKIT_FP8_CONFIGS(PUROKIT_FP8_TYPE)
#undef PUROKIT_FP8_TYPE

// The definitions: every config in one object, or only the one this object was compiled for.
#if !defined(PUROKIT_FP8_CONFIG)
#define PUROKIT_FP8_DEFINE(id, kind, name, sched, tm, tn, tk, cm, cn, tile) \
  int run_config_##id(Problem const& p) { return Config<id>::Gemm::run(p); }
PUROKIT_FP8_CONFIGS(PUROKIT_FP8_DEFINE)
#undef PUROKIT_FP8_DEFINE
#elif PUROKIT_FP8_CONFIG >= 0
#define PUROKIT_FP8_CAT2(a, b) a##b
#define PUROKIT_FP8_CAT(a, b) PUROKIT_FP8_CAT2(a, b)
int PUROKIT_FP8_CAT(run_config_, PUROKIT_FP8_CONFIG)(Problem const& p) {
  return Config<PUROKIT_FP8_CONFIG>::Gemm::run(p);
}
#endif

}  // namespace purokit_fp8

// ------------------------------------------------------------------------------------------------
// The exported entry points (only in the API object, or in the single all-in-one object)
// ------------------------------------------------------------------------------------------------

#define PUROKIT_FP8_EXTERN(ret, name, params) extern "C" __attribute__((visibility("default"))) ret name params;
PUROKIT_FP8_API(PUROKIT_FP8_EXTERN)
#undef PUROKIT_FP8_EXTERN

#if !defined(PUROKIT_FP8_CONFIG) || PUROKIT_FP8_CONFIG < 0

namespace purokit_fp8 {

struct ConfigEntry {
  int kind;
  const char* name;
  RunFn run;
  int n, k;  // the only shape it runs, or 0, 0
};

#define PUROKIT_FP8_ENTRY(id, kind, name, sched, tm, tn, tk, cm, cn, tile) \
  {kind, name, &run_config_##id, CompiledShape<sched>::n, CompiledShape<sched>::k},
constexpr ConfigEntry kConfigs[] = {PUROKIT_FP8_CONFIGS(PUROKIT_FP8_ENTRY)};
#undef PUROKIT_FP8_ENTRY
constexpr int kConfigCount = sizeof(kConfigs) / sizeof(kConfigs[0]);
constexpr const char* kKindNames[] = {"act_weight", "act_act", "act_act_bf16"};

bool shape_ok(int m, int n, int k) {
  return m > 0 && n > 0 && k > 0 && m % kGroup == 0 && n % kGroup == 0 && k % kGroup == 0;
}

int guarded_run(int config, Problem const& p) {
  try {
    return kConfigs[config].run(p);
  } catch (...) {
    return PUROKIT_FP8_EXCEPTION;
  }
}

bool aligned16(const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0; }

int check_common(int config, int want_kind_lo, int want_kind_hi, Problem const& p) {
  if (config < 0 || config >= kConfigCount) return PUROKIT_FP8_BAD_CONFIG;
  int kind = kConfigs[config].kind;
  if (kind < want_kind_lo || kind > want_kind_hi) return PUROKIT_FP8_BAD_CONFIG;
  if (!shape_ok(p.m, p.n, p.k)) return PUROKIT_FP8_BAD_SHAPE;
  if (p.a == nullptr || p.b == nullptr || p.sa == nullptr || p.sb == nullptr || p.d == nullptr)
    return PUROKIT_FP8_BAD_ARGUMENT;
  // TMA reads and writes 16-byte aligned addresses; a misaligned one would make a bad descriptor
  // (CUTLASS only asserts, and NDEBUG removes that), so it is refused here
  if (!aligned16(p.a) || !aligned16(p.b) || !aligned16(p.sa) || !aligned16(p.sb) || !aligned16(p.d) ||
      (p.c != nullptr && !aligned16(p.c)))
    return PUROKIT_FP8_MISALIGNED;
  if (p.raster < 0 || p.raster > 2 || p.swizzle < 1 || p.swizzle > 8) return PUROKIT_FP8_BAD_ARGUMENT;
  if (kind == 2 && p.c != nullptr) return PUROKIT_FP8_BAD_ARGUMENT;
  return 0;
}

}  // namespace purokit_fp8

#define PUROKIT_FP8_STR(ret, name, params) #ret " " #name #params ";"
static const char kAbi[] = PUROKIT_FP8_API(PUROKIT_FP8_STR);
#undef PUROKIT_FP8_STR

extern "C" int purokit_fp8_abi_version(void) { return PUROKIT_FP8_ABI_VERSION; }

extern "C" const char* purokit_fp8_abi(void) { return kAbi; }

extern "C" int purokit_fp8_config_count(void) { return purokit_fp8::kConfigCount; }

extern "C" const char* purokit_fp8_config_name(int config) {
  return (config >= 0 && config < purokit_fp8::kConfigCount) ? purokit_fp8::kConfigs[config].name : nullptr;
}

extern "C" const char* purokit_fp8_config_kind(int config) {
  return (config >= 0 && config < purokit_fp8::kConfigCount)
             ? purokit_fp8::kKindNames[purokit_fp8::kConfigs[config].kind]
             : nullptr;
}

extern "C" int purokit_fp8_config_shape(int config, int* n, int* k) {
  if (n == nullptr || k == nullptr) return PUROKIT_FP8_BAD_ARGUMENT;
  if (config < 0 || config >= purokit_fp8::kConfigCount) return PUROKIT_FP8_BAD_CONFIG;
  *n = purokit_fp8::kConfigs[config].n;
  *k = purokit_fp8::kConfigs[config].k;
  return 0;
}

extern "C" const char* purokit_fp8_status_string(int status) {
  switch (status) {
    case 0: return "ok";
    case PUROKIT_FP8_BAD_CONFIG: return "no such config for this kind of GEMM";
    case PUROKIT_FP8_BAD_SHAPE: return "M, N and K must be positive multiples of 128";
    case PUROKIT_FP8_SMALL_WORKSPACE: return "workspace smaller than purokit_fp8_workspace_size";
    case PUROKIT_FP8_CUDA_ERROR: return "CUDA runtime error (launch or device query)";
    case PUROKIT_FP8_EXCEPTION: return "C++ exception in CUTLASS host code";
    case PUROKIT_FP8_BAD_ARGUMENT:
      return "null operand, C given for a bf16 output, raster/swizzle out of range, or (DeepGEMM act_act) C other "
             "than D with beta 1";
    case PUROKIT_FP8_MISALIGNED: return "an operand, scale or output address is not 16-byte aligned (TMA)";
    case PUROKIT_FP8_WRONG_SHAPE:
      return "this config is compiled for another (N, K) (purokit_fp8_config_shape), or K over 32,768";
    case PUROKIT_FP8_NOT_BUILT: return "the library was built without DeepGEMM ($DEEPGEMM_DIR), which this config runs";
    default:
      if (status > 0 && status <= static_cast<int>(cutlass::Status::kInvalid))
        return cutlassGetStatusString(static_cast<cutlass::Status>(status));
      return "unknown status";
  }
}

extern "C" int purokit_fp8_workspace_size(int config, int m, int n, int k, int raster, int swizzle, size_t* out) {
  if (out == nullptr || raster < 0 || raster > 2 || swizzle < 1 || swizzle > 8) return PUROKIT_FP8_BAD_ARGUMENT;
  if (config < 0 || config >= purokit_fp8::kConfigCount) return PUROKIT_FP8_BAD_CONFIG;
  if (!purokit_fp8::shape_ok(m, n, k)) return PUROKIT_FP8_BAD_SHAPE;
  // any non-null pointers: only the problem shape enters the size (aligned dummies pass can_implement)
  alignas(256) static unsigned char dummy[256];
  purokit_fp8::Problem p{m, n, k, dummy, dummy, reinterpret_cast<const float*>(dummy),
                         reinterpret_cast<const float*>(dummy), nullptr, dummy, 0.f, raster, swizzle, nullptr, 0, nullptr, out};
  return purokit_fp8::guarded_run(config, p);
}

extern "C" int purokit_fp8_act_weight(int config, const void* a, const void* b, const float* sa, const float* sb,
                                      void* d, int m, int n, int k, int raster, int swizzle, void* workspace,
                                      size_t workspace_size, cudaStream_t stream) {
  purokit_fp8::Problem p{m, n, k, a, b, sa, sb, nullptr, d, 0.f, raster, swizzle, workspace, workspace_size,
                         stream, nullptr};
  int bad = purokit_fp8::check_common(config, 0, 0, p);
  return bad != 0 ? bad : purokit_fp8::guarded_run(config, p);
}

extern "C" int purokit_fp8_act_act(int config, const void* a, const void* b, const float* sa, const float* sb,
                                   const float* c, void* d, float beta, int m, int n, int k, int raster, int swizzle,
                                   void* workspace, size_t workspace_size, cudaStream_t stream) {
  purokit_fp8::Problem p{m, n, k, a, b, sa, sb, c, d, beta, raster, swizzle, workspace, workspace_size, stream,
                         nullptr};
  int bad = purokit_fp8::check_common(config, 1, 2, p);
  return bad != 0 ? bad : purokit_fp8::guarded_run(config, p);
}

#endif  // API object
