// A blockwise-FP8 mainloop whose scale promotion overlaps the tensor cores (issue 16).
//
// CUTLASS's blockwise mainloop (sm90_mma_tma_gmma_ss_warpspecialized_fp8_blockwise_scaling.hpp) runs
// each 128-K block as: issue its WGMMAs into a temporary accumulator, wait for them
// (warpgroup_wait<0>), then promote on the CUDA cores, accum += temp * scale. The tensor pipe has
// nothing queued while a warpgroup promotes, and in the cooperative schedule both consumer warpgroups
// promote the same k-block at the same time, so every k-block leaves a bubble in the tensor pipe.
//
// Here each warpgroup keeps two temporary accumulators and runs one k-block ahead:
//
//     issue k-tile 0 into T0
//     for k = 1 ..:  issue k into T[k%2];  wait until one batch is left (k-1 done);
//                    promote T[(k-1)%2] with k-1's scales;  release k-1's shared-memory stage
//     wait for the last batch; promote it; release its stage
//
// so k's WGMMAs run while k-1 is promoted, and the tensor pipe always has a batch queued. The
// arithmetic is the reference mainloop's, term for term (the same k order, the same roundings:
// act_weight folds the block's B scale into the row scales, then accum = fma(temp, s, accum);
// act_act computes fma(temp * sa, sb, accum)), so results equal it and cuBLAS bit for bit.
//
// Cost: registers. A warpgroup holds its accumulator and two temporaries, 3 x 64 fp32 values a
// thread for its 64 x 128 share of a 128 x 128 tile; the scales are read from shared memory at
// promotion time (the stage is released only after it). So this mainloop takes tile M = 128 (one
// m64 GMMA per consumer warpgroup of the cooperative schedule) and tile N <= 128.
//
// It derives from CUTLASS's collective and replaces only mma(): loads, shared-memory layouts, TMA
// descriptors and the kernel schedule (KernelTmaWarpSpecializedCooperativeFP8Blockwise) are CUTLASS's.

#pragma once

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"

namespace purokit_fp8 {

template <class Base>
struct PipelinedPromotionMma : Base {
  using TileShape = typename Base::TileShape;
  using TiledMma = typename Base::TiledMma;
  using ElementBlockScale = typename Base::ElementBlockScale;
  using MainloopPipeline = typename Base::MainloopPipeline;
  using PipelineState = typename Base::PipelineState;
  using TensorStorage = typename Base::TensorStorage;
  using Params = typename Base::Params;
  using SmemLayoutA = typename Base::SmemLayoutA;
  using SmemLayoutB = typename Base::SmemLayoutB;
  using SmemLayoutSFA = typename Base::SmemLayoutSFA;
  using SmemLayoutSFB = typename Base::SmemLayoutSFB;

  static constexpr int ScaleMsPerTile = Base::ScaleMsPerTile;
  static constexpr int ScaleNsPerTile = Base::ScaleNsPerTile;
  static_assert(cute::size<0>(TileShape{}) == 128, "pipelined promotion: tile M = 128 (one m64 GMMA a warpgroup)");
  static_assert(cute::size<1>(TileShape{}) <= 128, "pipelined promotion: three accumulators fit tile N <= 128");
  static_assert(ScaleMsPerTile == cute::size<0>(TileShape{}), "pipelined promotion: A scaled per row (1x128)");
  static_assert(Base::ScalePromotionInterval == 4, "pipelined promotion: one promotion per 128-K tile");

  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState smem_pipe_read, FrgTensorC& accum,
                          int k_tile_count, int thread_idx, TensorStorage& shared_tensors, Params const&) {
    using namespace cute;
    static_assert(is_rmem<FrgTensorC>::value, "C tensor must be rmem resident.");

    Tensor sA = make_tensor(make_smem_ptr(shared_tensors.smem_A.data()), SmemLayoutA{});  // (BLK_M,BLK_K,PIPE)
    Tensor sB = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()), SmemLayoutB{});  // (BLK_N,BLK_K,PIPE)
    // the scales as (BLK_M, BLK_N, (BLK_K, PIPE)) views, broadcast along the mode they do not vary in
    Tensor sSFA = make_tensor(
        make_smem_ptr(shared_tensors.smem_SFA.data()),
        make_layout(make_shape(get<0>(shape(SmemLayoutSFA{})), get<1>(TileShape{}),
                               make_shape(get<1>(shape(SmemLayoutSFA{})), get<2>(shape(SmemLayoutSFA{})))),
                    make_stride(get<0>(stride(SmemLayoutSFA{})), _0{},
                                make_stride(get<1>(stride(SmemLayoutSFA{})), get<2>(stride(SmemLayoutSFA{}))))));
    Tensor sSFB = make_tensor(
        make_smem_ptr(shared_tensors.smem_SFB.data()),
        make_layout(make_shape(get<0>(TileShape{}), get<0>(shape(SmemLayoutSFB{})),
                               make_shape(get<1>(shape(SmemLayoutSFB{})), get<2>(shape(SmemLayoutSFB{})))),
                    make_stride(_0{}, get<0>(stride(SmemLayoutSFB{})),
                                make_stride(get<1>(stride(SmemLayoutSFB{})), get<2>(stride(SmemLayoutSFB{}))))));

    constexpr int MmaWarpGroups = size(TiledMma{}) / cutlass::NumThreadsPerWarpGroup;
    Layout warp_group_thread_layout = make_layout(Int<MmaWarpGroups>{}, Int<cutlass::NumThreadsPerWarpGroup>{});
    int warp_group_idx = __shfl_sync(0xFFFFFFFF, thread_idx / cutlass::NumThreadsPerWarpGroup, 0);

    TiledMma tiled_mma;
    auto thread_mma = tiled_mma.get_slice(warp_group_thread_layout(warp_group_idx));
    Tensor tCsSFA = tiled_mma.get_slice(thread_idx).partition_C(sSFA);  // (MMA,MMA_M,MMA_N,(MMA_K,PIPE))
    Tensor tCsSFB = tiled_mma.get_slice(thread_idx).partition_C(sSFB);  // (MMA,MMA_M,MMA_N,(MMA_K,PIPE))
    Tensor tCrA = thread_mma.make_fragment_A(thread_mma.partition_A(sA));  // (MMA,MMA_M,MMA_K,PIPE)
    Tensor tCrB = thread_mma.make_fragment_B(thread_mma.partition_B(sB));  // (MMA,MMA_N,MMA_K,PIPE)
    CUTE_STATIC_ASSERT_V(size<1>(tCrA) == size<1>(accum));  // M
    CUTE_STATIC_ASSERT_V(size<1>(tCrB) == size<2>(accum));  // N

    Tensor temp0 = make_fragment_like(accum);
    Tensor temp1 = make_fragment_like(accum);
    clear(accum);

    // one 128-K tile's GMMAs into `temp`, as one committed batch
    auto issue = [&](auto& temp, int stage) {
      tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
      warpgroup_fence_operand(temp);
      warpgroup_arrive();
      CUTLASS_PRAGMA_UNROLL
      for (int k_block = 0; k_block < size<2>(tCrA); ++k_block) {
        cute::gemm(tiled_mma, tCrA(_, _, k_block, stage), tCrB(_, _, k_block, stage), temp);
        tiled_mma.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      warpgroup_fence_operand(temp);
    };
    // accum += temp * (that tile's scales), read from its shared-memory stage, which is still held
    auto promote = [&](auto& temp, int stage) {
      warpgroup_fence_operand(temp);
      warpgroup_fence_operand(accum);
      Tensor sfa = tCsSFA(_, _, _, make_coord(_0{}, stage));
      Tensor sfb = tCsSFB(_, _, _, make_coord(_0{}, stage));
      if constexpr (ScaleNsPerTile == 1) {
        Tensor scale = make_tensor_like<ElementBlockScale>(sfa);
        copy(sfa, scale);
        ElementBlockScale scale_b = sfb(_0{});
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < size(filter_zeros(scale)); ++i) {
          filter_zeros(scale)(i) = filter_zeros(scale)(i) * scale_b;
        }
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < size(accum); ++i) {
          accum(i) += temp(i) * scale(i);
        }
      } else {
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < size(accum); ++i) {
          accum(i) += temp(i) * sfa(i) * sfb(i);
        }
      }
      warpgroup_fence_operand(accum);
    };

    PipelineState smem_pipe_release = smem_pipe_read;
    // the next k-tile's GMMAs into `temp`, then the promotion of the one before (in `previous`) while
    // they run. ptxas keeps GMMA batches in flight only through straight-line code: with the promotion
    // behind a run-time condition it serializes every GMMA (C7514), so the first tile is issued ahead of
    // the loop (which costs one drain a tile: ptxas waits for it before entering the loop, C7517)
    auto issue_next = [&](auto& temp) {
      pipeline.consumer_wait(smem_pipe_read);
      issue(temp, smem_pipe_read.index());
      ++smem_pipe_read;
    };
    auto promote_previous = [&](auto& previous) {
      promote(previous, smem_pipe_release.index());
      pipeline.consumer_release(smem_pipe_release);
      ++smem_pipe_release;
    };

    issue_next(temp0);
    // two k-tiles an iteration, so that each temporary is a fixed set of registers
    int k = 1;
    CUTLASS_PRAGMA_NO_UNROLL
    for (; k + 1 < k_tile_count; k += 2) {
      issue_next(temp1);
      warpgroup_wait<1>();
      promote_previous(temp0);
      issue_next(temp0);
      warpgroup_wait<1>();
      promote_previous(temp1);
    }
    if (k < k_tile_count) {  // an even count: the last k-tile goes into temp1
      issue_next(temp1);
      warpgroup_wait<1>();
      promote_previous(temp0);
      warpgroup_wait<0>();
      promote_previous(temp1);
    } else {
      warpgroup_wait<0>();
      promote_previous(temp0);
    }
  }
};

}  // namespace purokit_fp8
