#!/bin/bash
# One device call: build the FP8 GEMM library from packages, run benchmarks/gpu_loop.py on one or more trainer
# trees, then the GPU tests. The carried folders it reads (git-ignored, prepared on the developer's machine):
#   .gpu_data/shards (`benchmarks/gpu_loop.py prepare --out .gpu_data`), .whl (pydantic, universal_pathlib and
#   nvidia-cutlass wheels for the device's Python), .deepgemm (DeepGEMM's deep_gemm/include, optional),
#   .gpu_old (a `git archive` of an older trainer to run beside), .peer (the torchtitan peer, with PEER=).
#
#   bash benchmarks/device_call.sh [TREES]      TREES: comma list of trees relative to the repo root, default "."
#                                       ("." = the sent checkout, ".gpu_old" = git archive of 3349dbb)
# Environment knobs (defaults):
#   DEADLINE=540        seconds of this script's wall time after which no stage starts; timeouts shrink to fit
#   BUILD=1             build the library (0: use a carried .gpu_build/libpurokit_fp8_gemm.so of each tree)
#   BUILD_TIMEOUT=300   JOBS=16   DEEPGEMM=1 (use .deepgemm/ if present; a failed DeepGEMM build retries without)
#   BUILD_MODULE=trainer.fp8.csrc.build
#   BUILD_ONLY=         e.g. 6,8,14,24,30,36,42,44 = the configs gemm_table.json picks at 3349dbb: one nvcc wave instead
#                       of ~4 (others become stubs answering "no such config": do not run the GPU tests on such a build)
#   STEPS=5 SKIP=2 MB=8 VARIANTS=ours-bf16,ours-fp8-blockwise   VARIANT_TIMEOUT=170
#   PEER=""             e.g. titan-fp8-tensorwise: torchtitan peers (needs .peer carried), before the first tree
#   PEER_TIMEOUT=200
#   TESTS=1             pytest -m gpu tests/trainer -x in each tree that has tests/  TEST_TIMEOUT=200
#   TEST_MIN=60         skip the tests when less than this is left
#   RETURN_LIB=1        $OUT/gpu_build.tgz: the first build's .gpu_build/obj + library (else the library alone) if
#                       under 16 MB, to unpack here and carry as .gpu_build into a later call (objects cached by hash)
#   COMMIT=             label for gpu_loop.json's "commit" (default: git HEAD of the sent checkout)
set -u
ROOT=$(pwd)
T0=$(date +%s)
OUT=${OUT:-/tmp/call_out}
mkdir -p "$OUT"
RES=/tmp/call_res
rm -rf "$RES"; mkdir -p "$RES/logs"
TREES=${1:-${TREES:-.}}
DEADLINE=${DEADLINE:-540}
BUILD=${BUILD:-1}; BUILD_TIMEOUT=${BUILD_TIMEOUT:-300}; JOBS=${JOBS:-16}; DEEPGEMM=${DEEPGEMM:-1}
BUILD_MODULE=${BUILD_MODULE:-trainer.fp8.csrc.build}
STEPS=${STEPS:-5}; SKIP=${SKIP:-2}; MB=${MB:-8}; VARIANTS=${VARIANTS:-ours-bf16,ours-fp8-blockwise}
VARIANT_TIMEOUT=${VARIANT_TIMEOUT:-170}
PEER=${PEER:-}; PEER_TIMEOUT=${PEER_TIMEOUT:-200}
TESTS=${TESTS:-1}; TEST_TIMEOUT=${TEST_TIMEOUT:-200}; TEST_MIN=${TEST_MIN:-60}
RETURN_LIB=${RETURN_LIB:-1}
COMMIT=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
LIB=libpurokit_fp8_gemm.so
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

exec > >(tee -a "$OUT/call.log") 2>&1
el() { echo $(( $(date +%s) - T0 )); }
left() { echo $(( DEADLINE - $(el) )); }
say() { echo "[call +$(el)s] $*"; }
min() { [ "$1" -lt "$2" ] && echo "$1" || echo "$2"; }
tag_of() { local t=${1#./}; t=${t#.}; t=${t//\//_}; echo "${t:-main}"; }
pack() { tar -czf "$OUT/logs.tgz" -C "$RES" logs 2>/dev/null; }
trap pack EXIT

say "trees=$TREES commit=$COMMIT deadline=${DEADLINE}s $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
# the packages the image lacks (pydantic, universal_pathlib) and CUTLASS's headers (nvidia-cutlass), as wheels
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { say "FATAL: wheel install failed"; exit 1; }
export PYTHONPATH=/tmp/site
python3 -c "import torch, pydantic, upath; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
NVCC=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null); say "nvcc: ${NVCC:-none} $($NVCC --version 2>/dev/null | tail -1)"
[ -n "$NVCC" ] && export NVCC

# ---- 1. the library, per tree (a tree whose csrc equals an earlier one's gets that library)
declare -A LIBPATH
FIRST=""
build_tree() {  # $1 tree, $2 tag
  local t=$1 tag=$2 rem bt rc s dg
  if [ "$BUILD" != 1 ]; then   # a carried library: the tree's own, else the checkout's where csrc is the same
    if [ -f "$t/.gpu_build/$LIB" ]; then LIBPATH[$tag]=$ROOT/$t/.gpu_build/$LIB; say "build $tag: carried $t/.gpu_build/$LIB"
    elif [ -f ".gpu_build/$LIB" ] && diff -rq -x __pycache__ trainer/fp8/csrc "$t/trainer/fp8/csrc" >/dev/null 2>&1; then
      LIBPATH[$tag]=$ROOT/.gpu_build/$LIB; say "build $tag: csrc same as the checkout's: carried .gpu_build/$LIB"
    else say "build $tag: BUILD=0 and no carried library for it: cuBLAS"; fi
    return
  fi
  if [ -n "$FIRST" ] && diff -rq -x __pycache__ "$FIRST/trainer/fp8/csrc" "$t/trainer/fp8/csrc" >/dev/null 2>&1 \
     && [ -f "$FIRST/.gpu_build/$LIB" ]; then
    mkdir -p "$t/.gpu_build"; cp "$FIRST/.gpu_build/$LIB" "$t/.gpu_build/$LIB"
    LIBPATH[$tag]=$ROOT/$t/.gpu_build/$LIB; say "build $tag: csrc same as $FIRST, its library reused"; return
  fi
  if [ -n "$FIRST" ] && [ -d "$FIRST/.gpu_build/obj" ] && [ ! -d "$t/.gpu_build/obj" ]; then
    mkdir -p "$t/.gpu_build"; cp -al "$FIRST/.gpu_build/obj" "$t/.gpu_build/obj"   # unchanged objects stay cached
  fi
  dg=""; [ "$DEEPGEMM" = 1 ] && [ -d "$ROOT/.deepgemm/deep_gemm/include" ] && dg=$ROOT/.deepgemm
  for attempt in with-deepgemm without; do
    [ "$attempt" = with-deepgemm ] && [ -z "$dg" ] && continue
    rem=$(left); bt=$(min "$rem" "$BUILD_TIMEOUT")
    [ "$bt" -lt 30 ] && { say "build $tag: no time left"; break; }
    s=$(date +%s)
    say "build $tag ($attempt DeepGEMM), timeout ${bt}s: python3 -m $BUILD_MODULE --out .gpu_build --jobs $JOBS"
    (cd "$t" && if [ "$attempt" = with-deepgemm ]; then export DEEPGEMM_DIR=$dg; else unset DEEPGEMM_DIR; fi; \
       timeout "$bt" python3 -m "$BUILD_MODULE" --out .gpu_build --jobs "$JOBS" ${BUILD_ONLY:+--only "$BUILD_ONLY"}) > "$RES/logs/build_${tag}_$attempt.log" 2>&1
    rc=$?
    grep -E "fp8 gemm build|FAILED|spills" "$RES/logs/build_${tag}_$attempt.log" | head -40
    grep -cE "\[ok\]" "$RES/logs/build_${tag}_$attempt.log" | sed "s/^/objects compiled ok: /"
    say "build $tag ($attempt): rc=$rc in $(( $(date +%s) - s ))s"
    if [ $rc = 0 ]; then
      LIBPATH[$tag]=$ROOT/$t/.gpu_build/$LIB; [ -z "$FIRST" ] && FIRST=$t
      if [ "$RETURN_LIB" = 1 ] && [ ! -f "$OUT/gpu_build.tgz" ]; then   # objects + library, to carry later
        tar -czf "$OUT/gpu_build.tgz" -C "$t" .gpu_build/obj ".gpu_build/$LIB"
        ls -la "$OUT/gpu_build.tgz" "$t/.gpu_build/$LIB"; du -sh "$t/.gpu_build/obj"
        [ "$(stat -c %s "$OUT/gpu_build.tgz")" -lt 16000000 ] || { rm -f "$OUT/gpu_build.tgz"; \
          [ "$(stat -c %s "$t/.gpu_build/$LIB")" -lt 16000000 ] && cp "$t/.gpu_build/$LIB" "$OUT/$LIB"; }
      fi
      return
    fi
  done
  say "build $tag: NO LIBRARY: the FP8 GEMMs of this tree run on cuBLAS (gemm auto)"
}

IFS=, read -ra TREE_LIST <<< "$TREES"
for t in "${TREE_LIST[@]}"; do build_tree "$t" "$(tag_of "$t")"; done
pack

# ---- 2. the loop, per tree (peers, if asked, once before the first)
first=1
for t in "${TREE_LIST[@]}"; do
  tag=$(tag_of "$t"); rem=$(left)
  per=$(( (rem - 10) / $(echo "$VARIANTS" | tr , '\n' | wc -l) ))
  vt=$(min "$per" "$VARIANT_TIMEOUT")
  [ "$vt" -lt 60 ] && { say "loop $tag: no time left (${rem}s)"; continue; }
  peer=()
  if [ $first = 1 ] && [ -n "$PEER" ] && [ -d .peer ] && [ $(( rem - PEER_TIMEOUT )) -gt 240 ]; then
    peer=(--peer "$ROOT/.peer" --peer-first --peer-variants "$PEER" --peer-timeout "$PEER_TIMEOUT")
  fi
  first=0
  lib=${LIBPATH[$tag]:-}
  say "loop $tag: variant timeout ${vt}s, library ${lib:-none (cuBLAS)}"
  (if [ -n "$lib" ]; then export PUROKIT_FP8_GEMM_LIB=$lib; fi; \
   python3 "$t/benchmarks/gpu_loop.py" run --data "$ROOT/.gpu_data/shards" --out "$RES/loop_$tag" \
     --work "/tmp/gl_$tag" --steps "$STEPS" --skip "$SKIP" --micro-batch "$MB" --variants "$VARIANTS" \
     --variant-timeout "$vt" --commit "$COMMIT:$t" "${peer[@]}")
  say "loop $tag: rc=$?"
  [ -f "$RES/loop_$tag/gpu_loop.json" ] && cp "$RES/loop_$tag/gpu_loop.json" "$OUT/gpu_loop_$tag.json"
  for f in "$RES/loop_$tag"/*.log; do [ -f "$f" ] && cp "$f" "$RES/logs/${tag}_$(basename "$f")"; done
  grep -hiE "fp8: |library|cublas|gemm" "$RES/loop_$tag"/ours-fp8*.log 2>/dev/null | sort | uniq -c | head -20
  pack
done

# ---- 3. the GPU tests, in each tree that has them
if [ "$TESTS" = 1 ]; then
  for t in "${TREE_LIST[@]}"; do
    [ -d "$t/tests/trainer" ] || continue
    tag=$(tag_of "$t"); rem=$(left); tt=$(min "$rem" "$TEST_TIMEOUT")
    [ "$tt" -lt "$TEST_MIN" ] && { say "tests $tag: skipped, ${rem}s left"; continue; }
    say "tests $tag: timeout ${tt}s: python3 -m pytest -q -m gpu tests/trainer -x"
    (cd "$t" && timeout "$tt" python3 -m pytest -q -m gpu tests/trainer -x -p no:cacheprovider) > "$RES/logs/tests_$tag.log" 2>&1
    say "tests $tag: rc=$? (124 = timed out)"; tail -15 "$RES/logs/tests_$tag.log"
  done
fi
say "done"
