// Blockwise-FP8 activation quantizers for the CUDA path: one read of a 128 x 128 tile writes both
// copies the three GEMMs of a linear need (issue 16).
//
//   q  (M, K)      E4M3, one scale per 1x128 group along K       (Fprop's, or Dgrad's, A operand)
//   qt (K, M_pad)  E4M3, one scale per 1x128 group along tokens   (Wgrad's operands)
//
// with the scales stored as trainer.fp8.triton_kernels stores them: s as the (K/128, M) storage of the
// column-major (M, K/128) operand, st as the (M_pad/128, K) storage of the column-major (K, M_pad/128)
// one. Scales and codes are computed as trainer.fp8.quantize computes them (power-of-two scales from the
// group's amax, or amax / 448 correctly rounded; x * (1 / scale) rounded to nearest even, saturated), so
// quant_act equals the Triton kernel and the torch reference bit for bit.
//
// The Triton kernels read each tile twice (rows, then columns from L2) and reach about half the copy
// bandwidth. Here a CTA holds its tile in registers once: a thread owns kRows consecutive rows x 8
// consecutive columns, loaded as 16-byte vectors (a warp reads 2 rows of 256 bytes per instruction);
// row amaxes are reduced by shuffles within the 16 lanes that share a row; column amaxes by a shuffle
// and a pass through shared memory; the transposed copy is written through a 128 x 128 byte shared tile
// whose 8-byte (kRows = 8) or 4-byte (kRows = 4) slots are XOR-swizzled by the column's 8-group, so that
// both the scattered writes (one column's kRows tokens) and the row reads (16 bytes a thread) are
// conflict-free, and leaves it as 128-byte rows.
//
// swiglu_quant computes h = silu(gate) * up in float32 from the stacked (M, 2F) gate-up output and
// quantizes h (M, F); swiglu_bwd_quant computes d(gate), d(up) of h given dh (M, F) and quantizes them
// as the (M, 2F) output gradient of the stacked linear: neither h nor d[gate | up] is written in BF16.
// Their sigmoid is the fast one (ex2.approx, approximate division), as Triton's and Inductor's are.
//
// Plain C entry points (status 0, or one of status.h), declared in blockwise_gemm.cu's PUROKIT_FP8_API.

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "status.h"

namespace purokit_quant {

constexpr int kTile = 128;

struct Scale {
  float s, inv;
};

// the scale of a group from its amax (trainer.fp8.quantize.scales_from_amax)
__device__ __forceinline__ Scale group_scale(float amax, bool pow2) {
  amax = fmaxf(amax, 5.421010862427522e-20f);  // AMAX_FLOOR = 2**-64
  if (pow2) {
    int bits = __float_as_int(amax);
    int e = ((bits >> 23) & 0xFF) - 135 + ((bits & 0x7FFFFF) > 0x600000 ? 1 : 0);
    return {__int_as_float((e + 127) << 23), __int_as_float((127 - e) << 23)};
  }
  return {__fdiv_rn(amax, 448.f), __fdiv_rn(448.f, amax)};
}

__device__ __forceinline__ uint32_t fp8x4(float a, float b, float c, float d) {
  uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
  uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, __NV_E4M3);
  return lo | (hi << 16);
}

__device__ __forceinline__ void bf16x8(uint4 raw, float (&out)[8]) {
  const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 f = __bfloat1622float2(p[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

// 8 bf16 of row `row` from column `col` (zeros past the last row M)
__device__ __forceinline__ void load8(const __nv_bfloat16* base, long ld, int row, int col, int M, float (&out)[8]) {
  uint4 raw = make_uint4(0, 0, 0, 0);
  if (row < M) raw = *reinterpret_cast<const uint4*>(base + static_cast<long>(row) * ld + col);
  bf16x8(raw, out);
}

__device__ __forceinline__ float fast_sigmoid(float g) { return __fdividef(1.f, 1.f + __expf(-g)); }

// How a kernel is launched: rows a thread holds (threads = 16 * 128 / kRows), CTAs an SM should keep
// (the register budget), and which tile index runs fastest through the grid.
template <int kRows_, int kMinBlocks_, bool kKFastest_>
struct Launch {
  static constexpr int kRows = kRows_, kMinBlocks = kMinBlocks_;
  static constexpr bool kKFastest = kKFastest_;
  __device__ static int m_tile() { return kKFastest ? blockIdx.y : blockIdx.x; }
  __device__ static int k_tile() { return kKFastest ? blockIdx.x : blockIdx.y; }
  static dim3 grid(int m, int k) {
    dim3 g((m + kTile - 1) / kTile, k / kTile);
    return kKFastest ? dim3(g.y, g.x) : g;
  }
  static constexpr int threads() { return 16 * (kTile / kRows); }
};

// One CTA quantizes one 128 x 128 tile held as v[i][e] = tile[kRows * g + i][8 * c + e] by thread
// (g, c) = (tid / 16, tid % 16).
template <int kRows>
struct Tile {
  static constexpr int kThreads = 16 * (kTile / kRows);
  static constexpr int kWarps = kThreads / 32;
  struct Smem {
    alignas(16) uint8_t t[kTile * kTile];  // the transposed codes, slots swizzled
    float cmax[kWarps][kTile];
    float inv[kTile];
  };

  struct Out {
    uint8_t* q;       // (M, K) codes, or null
    float* s;         // (K/128, M) storage of the row scales
    uint8_t* qt;      // (K, M_pad) codes, or null
    float* st;        // (M_pad/128, K) storage of the token scales
    int M, M_pad, K;  // K: the width of q (and the height of qt)
    bool pow2;
  };

  // the tile at rows m0.., output columns k0.. (of q; rows k0.. of qt)
  __device__ static void quantize(float (&v)[kRows][8], Smem& sm, Out const& o, int m0, int k0) {
    const int tid = threadIdx.x, c = tid % 16, g = tid / 16, lane = tid % 32, warp = tid / 32;
    if (o.q != nullptr) {
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        float amax = 0.f;
#pragma unroll
        for (int e = 0; e < 8; ++e) amax = fmaxf(amax, fabsf(v[i][e]));
#pragma unroll
        for (int off = 1; off < 16; off <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
        Scale sc = group_scale(amax, o.pow2);
        const int row = m0 + kRows * g + i;
        if (row < o.M) {
          uint2 packed = make_uint2(fp8x4(v[i][0] * sc.inv, v[i][1] * sc.inv, v[i][2] * sc.inv, v[i][3] * sc.inv),
                                    fp8x4(v[i][4] * sc.inv, v[i][5] * sc.inv, v[i][6] * sc.inv, v[i][7] * sc.inv));
          *reinterpret_cast<uint2*>(o.q + static_cast<long>(row) * o.K + k0 + 8 * c) = packed;
          if (c == 0) o.s[static_cast<long>(k0 / kTile) * o.M + row] = sc.s;
        }
      }
    }
    if (o.qt == nullptr) return;
    // column amaxes: over the thread's rows, the two row groups of the warp, then the warps
    float cm[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      cm[e] = 0.f;
#pragma unroll
      for (int i = 0; i < kRows; ++i) cm[e] = fmaxf(cm[e], fabsf(v[i][e]));
      cm[e] = fmaxf(cm[e], __shfl_xor_sync(0xffffffffu, cm[e], 16));
    }
    if (lane < 16) {
#pragma unroll
      for (int e = 0; e < 8; ++e) sm.cmax[warp][8 * c + e] = cm[e];
    }
    __syncthreads();
    if (tid < kTile) {
      float amax = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) amax = fmaxf(amax, sm.cmax[w][tid]);
      Scale sc = group_scale(amax, o.pow2);
      sm.inv[tid] = sc.inv;
      o.st[static_cast<long>(m0 / kTile) * o.K + k0 + tid] = sc.s;
    }
    __syncthreads();
    // column 8c+e's kRows tokens as one slot of the shared tile's row 8c+e, at slot g ^ F,
    // F = c * (8 / kRows): consecutive c land in different banks
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const int j = 8 * c + e;
      const float inv = sm.inv[j];
      uint8_t* dst = sm.t + j * kTile + ((g ^ (c * (8 / kRows))) * kRows);
      if constexpr (kRows == 8) {
        *reinterpret_cast<uint2*>(dst) =
            make_uint2(fp8x4(v[0][e] * inv, v[1][e] * inv, v[2][e] * inv, v[3][e] * inv),
                       fp8x4(v[4][e] * inv, v[5][e] * inv, v[6][e] * inv, v[7][e] * inv));
      } else {
        static_assert(kRows == 4, "kRows: 4 or 8");
        *reinterpret_cast<uint32_t*>(dst) = fp8x4(v[0][e] * inv, v[1][e] * inv, v[2][e] * inv, v[3][e] * inv);
      }
    }
    __syncthreads();
    // rows of the transposed tile, 16 bytes a thread: logical chunk qq of row j sits at chunk
    // qq ^ (c_j / 2), its 8-byte halves swapped when c_j is odd (c_j = j / 8)
#pragma unroll
    for (int p = 0; p < kTile * kTile / 16 / kThreads; ++p) {
      const int idx = tid + p * kThreads, j = idx / 8, qq = idx % 8, cj = j / 8;
      uint4 w = *reinterpret_cast<const uint4*>(sm.t + j * kTile + 16 * (qq ^ (cj >> 1)));
      if (cj & 1) w = make_uint4(w.z, w.w, w.x, w.y);
      *reinterpret_cast<uint4*>(o.qt + static_cast<long>(k0 + j) * o.M_pad + m0 + 16 * qq) = w;
    }
    __syncthreads();  // the shared tile is free for the next quantize() of this CTA
  }
};

template <class L, int kRows = L::kRows>
__global__ void __launch_bounds__(Tile<kRows>::kThreads, L::kMinBlocks)
act_kernel(const __nv_bfloat16* __restrict__ x, long ldx, typename Tile<kRows>::Out o) {
  __shared__ typename Tile<kRows>::Smem sm;
  const int m0 = L::m_tile() * kTile, k0 = L::k_tile() * kTile;
  const int c = threadIdx.x % 16, g = threadIdx.x / 16;
  float v[kRows][8];
#pragma unroll
  for (int i = 0; i < kRows; ++i) load8(x, ldx, m0 + kRows * g + i, k0 + 8 * c, o.M, v[i]);
  Tile<kRows>::quantize(v, sm, o, m0, k0);
}

// h = silu(gate) * up, gate = gu[:, :F], up = gu[:, F:]
template <class L, int kRows = L::kRows>
__global__ void __launch_bounds__(Tile<kRows>::kThreads, L::kMinBlocks)
swiglu_kernel(const __nv_bfloat16* __restrict__ gu, long ldg, int F, typename Tile<kRows>::Out o) {
  __shared__ typename Tile<kRows>::Smem sm;
  const int m0 = L::m_tile() * kTile, k0 = L::k_tile() * kTile;
  const int c = threadIdx.x % 16, g = threadIdx.x / 16;
  float v[kRows][8];
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    float gate[8], up[8];
    load8(gu, ldg, m0 + kRows * g + i, k0 + 8 * c, o.M, gate);
    load8(gu, ldg, m0 + kRows * g + i, F + k0 + 8 * c, o.M, up);
#pragma unroll
    for (int e = 0; e < 8; ++e) v[i][e] = gate[e] * fast_sigmoid(gate[e]) * up[e];
  }
  Tile<kRows>::quantize(v, sm, o, m0, k0);
}

// d(gate) = dh * up * sig * (1 + gate * (1 - sig)), d(up) = dh * gate * sig, as the (M, 2F) gradient
template <class L, int kRows = L::kRows>
__global__ void __launch_bounds__(Tile<kRows>::kThreads, L::kMinBlocks)
swiglu_bwd_kernel(const __nv_bfloat16* __restrict__ gu, long ldg, const __nv_bfloat16* __restrict__ dh, long ldd,
                  int F, typename Tile<kRows>::Out o) {
  __shared__ typename Tile<kRows>::Smem sm;
  const int m0 = L::m_tile() * kTile, k0 = L::k_tile() * kTile;
  const int c = threadIdx.x % 16, g = threadIdx.x / 16;
  float dg[kRows][8], du[kRows][8];
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const int row = m0 + kRows * g + i;
    float gate[8], up[8], d[8];
    load8(gu, ldg, row, k0 + 8 * c, o.M, gate);
    load8(gu, ldg, row, F + k0 + 8 * c, o.M, up);
    load8(dh, ldd, row, k0 + 8 * c, o.M, d);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float sig = fast_sigmoid(gate[e]);
      dg[i][e] = d[e] * up[e] * sig * (1.f + gate[e] * (1.f - sig));
      du[i][e] = d[e] * gate[e] * sig;
    }
  }
  Tile<kRows>::quantize(dg, sm, o, m0, k0);
  Tile<kRows>::quantize(du, sm, o, m0, F + k0);
}

// the launch shapes: the fastest of benchmarks/fp8_quant_launch.py on the H200 (M = 32,768, 2026-12-03 12:04
// UTC; RESULTS.md): act 0.079 / 0.149 / 0.221 ms at K = 2048 / 4096 / 6144 (8 rows a thread, 3 CTAs an SM,
// K-fastest grid; was <8, 2, false>: 0.087 / 0.165 / 0.244), SwiGLU 0.312 (<4, 2, true>; was 0.376),
// its backward 0.679 (unchanged)
using ActLaunch = Launch<8, 3, true>;
using SwigluLaunch = Launch<4, 2, true>;
using SwigluBwdLaunch = Launch<4, 1, false>;

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <int kRows>
typename Tile<kRows>::Out outputs(void* q, float* s, void* qt, float* st, int m, int m_pad, int k, int pow2) {
  return {static_cast<uint8_t*>(q), s, static_cast<uint8_t*>(qt), st, m, m_pad, k, pow2 != 0};
}

// shape and alignment checks shared by the entry points: 16-byte vectors in, 8/16-byte codes out
inline int check_shape(int m, int width, int m_pad) {
  bool ok = m > 0 && width > 0 && width % kTile == 0 && m_pad == (m + kTile - 1) / kTile * kTile;
  return ok ? 0 : PUROKIT_FP8_BAD_SHAPE;
}

inline int check_input(const void* in, long ld, int width) {
  if (in == nullptr) return PUROKIT_FP8_BAD_ARGUMENT;
  if (ld < width) return PUROKIT_FP8_BAD_SHAPE;
  return aligned16(in) && ld % 8 == 0 ? 0 : PUROKIT_FP8_MISALIGNED;
}

inline int check_outputs(const void* q, const float* s, const void* qt, const float* st) {
  if ((q == nullptr && qt == nullptr) || (q != nullptr && s == nullptr) || (qt != nullptr && st == nullptr))
    return PUROKIT_FP8_BAD_ARGUMENT;
  return (q == nullptr || aligned16(q)) && (qt == nullptr || aligned16(qt)) ? 0 : PUROKIT_FP8_MISALIGNED;
}

inline int launched() { return cudaGetLastError() == cudaSuccess ? 0 : PUROKIT_FP8_CUDA_ERROR; }

}  // namespace purokit_quant

using namespace purokit_quant;

#define PUROKIT_QUANT_EXPORT extern "C" __attribute__((visibility("default")))

// x (M, K) bf16, row stride ldx (elements) -> q, s (write_row), qt, st (write_t); null q or qt: not written
PUROKIT_QUANT_EXPORT int purokit_fp8_quant_act(const void* x, int m, int k, long ldx, int pow2, void* q, float* s,
                                               void* qt, float* st, int m_pad, cudaStream_t stream) {
  int bad = check_shape(m, k, m_pad);
  if (!bad) bad = check_input(x, ldx, k);
  if (!bad) bad = check_outputs(q, s, qt, st);
  if (bad) return bad;
  using L = ActLaunch;
  act_kernel<L><<<L::grid(m, k), L::threads(), 0, stream>>>(static_cast<const __nv_bfloat16*>(x), ldx,
                                                           outputs<L::kRows>(q, s, qt, st, m, m_pad, k, pow2));
  return launched();
}

// gu (M, 2F) bf16 -> h = silu(gate) * up quantized as quant_act quantizes an (M, F) tensor
PUROKIT_QUANT_EXPORT int purokit_fp8_swiglu_quant(const void* gu, int m, int f, long ldg, int pow2, void* q, float* s,
                                                  void* qt, float* st, int m_pad, cudaStream_t stream) {
  int bad = check_shape(m, f, m_pad);
  if (!bad) bad = check_input(gu, ldg, 2 * f);
  if (!bad) bad = q == nullptr ? PUROKIT_FP8_BAD_ARGUMENT : check_outputs(q, s, qt, st);
  if (bad) return bad;
  using L = SwigluLaunch;
  swiglu_kernel<L><<<L::grid(m, f), L::threads(), 0, stream>>>(static_cast<const __nv_bfloat16*>(gu), ldg, f,
                                                              outputs<L::kRows>(q, s, qt, st, m, m_pad, f, pow2));
  return launched();
}

// gu (M, 2F), dh (M, F) bf16 -> d[gate | up] (M, 2F) quantized as quant_act quantizes it
PUROKIT_QUANT_EXPORT int purokit_fp8_swiglu_bwd_quant(const void* gu, const void* dh, int m, int f, long ldg, long ldd,
                                                      int pow2, void* q, float* s, void* qt, float* st, int m_pad,
                                                      cudaStream_t stream) {
  int bad = check_shape(m, f, m_pad);
  if (!bad) bad = check_input(gu, ldg, 2 * f);
  if (!bad) bad = check_input(dh, ldd, f);
  if (!bad) bad = check_outputs(q, s, qt, st);
  if (bad) return bad;
  using L = SwigluBwdLaunch;
  swiglu_bwd_kernel<L><<<L::grid(m, f), L::threads(), 0, stream>>>(
      static_cast<const __nv_bfloat16*>(gu), ldg, static_cast<const __nv_bfloat16*>(dh), ldd, f,
      outputs<L::kRows>(q, s, qt, st, m, m_pad, 2 * f, pow2));
  return launched();
}

#ifdef PUROKIT_QUANT_VARIANTS
// Benchmark-only entry points (not in the library's API): every launch shape below for each kernel,
// selected by index, so that benchmarks/fp8_quant_launch.py can time them in one process. Built by that
// script with -DPUROKIT_QUANT_VARIANTS into a separate small library.
#define PUROKIT_QUANT_LAUNCHES(X) \
  X(0, 8, 2, false)               \
  X(1, 8, 2, true)                \
  X(2, 8, 3, false)               \
  X(3, 8, 3, true)                \
  X(4, 4, 1, false)               \
  X(5, 4, 2, false)               \
  X(6, 4, 2, true)

#define PUROKIT_QUANT_NAME(i, rows, blocks, kfast) "rows" #rows "_ctas" #blocks "_" #kfast,
PUROKIT_QUANT_EXPORT const char* purokit_quant_launch_name(int v) {
  static const char* names[] = {PUROKIT_QUANT_LAUNCHES(PUROKIT_QUANT_NAME)};
  return v >= 0 && v < static_cast<int>(sizeof(names) / sizeof(names[0])) ? names[v] : nullptr;
}

#define PUROKIT_QUANT_CASE(i, rows, blocks, kfast)                                                      \
  case i: {                                                                                            \
    using L = Launch<rows, blocks, kfast>;                                                             \
    auto o = outputs<rows>(q, s, qt, st, m, m_pad, kernel == 2 ? 2 * k : k, pow2);                       \
    if (kernel == 0)                                                                                   \
      act_kernel<L><<<L::grid(m, k), L::threads(), 0, stream>>>(static_cast<const __nv_bfloat16*>(in), \
                                                               ld, o);                                 \
    else if (kernel == 1)                                                                              \
      swiglu_kernel<L><<<L::grid(m, k), L::threads(), 0, stream>>>(                                    \
          static_cast<const __nv_bfloat16*>(in), ld, k, o);                                            \
    else                                                                                               \
      swiglu_bwd_kernel<L><<<L::grid(m, k), L::threads(), 0, stream>>>(                                \
          static_cast<const __nv_bfloat16*>(in), ld, static_cast<const __nv_bfloat16*>(in2), ld2, k, o); \
    return launched();                                                                                 \
  }

// kernel 0: quant_act of in (m, k); 1: swiglu_quant of in (m, 2k); 2: swiglu_bwd_quant of in (m, 2k), in2 (m, k).
// No argument checks: the benchmark passes what the library's checked entry points would accept.
PUROKIT_QUANT_EXPORT int purokit_quant_launch(int v, int kernel, const void* in, const void* in2, int m, int k,
                                              long ld, long ld2, int pow2, void* q, float* s, void* qt, float* st,
                                              int m_pad, cudaStream_t stream) {
  switch (v) {
    PUROKIT_QUANT_LAUNCHES(PUROKIT_QUANT_CASE)
    default:
      return PUROKIT_FP8_BAD_ARGUMENT;
  }
}
#endif  // PUROKIT_QUANT_VARIANTS
