#!/usr/bin/env bash
# Checks the CUDA path of a `checkmate` binary built with `--features cuda` on a machine with an
# NVIDIA GPU, and compares it with the CPU on the same machine (docs/PROFILER.md, "CUDA").
#
#   BIN=path/to/checkmate OUT=results-dir [LIMIT=seconds] [ARCHIVE=file.tgz] scripts/gpu-check.sh
#
# Each check writes NAME.json (the command's --json output) and NAME.err (its log) to $OUT and
# prints one summary line; a failing check does not stop the others, and one that runs past LIMIT
# seconds is stopped. With ARCHIVE, $OUT is packed into that file after every check. The binary needs the CUDA
# runtime libraries (libcudart, libcublas, libcublasLt, libcurand of CUDA 13); when they are not on
# the loader's path, the script takes them from PyTorch's cu13 wheels if python3 has torch.
set -u
BIN=${BIN:-target/release/checkmate}
OUT=${OUT:-gpu-check-results}
LIMIT=${LIMIT:-240}
mkdir -p "$OUT"

for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib; do
    if [ -e "$d/libcuda.so.1" ]; then export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; fi
done
if ! ldconfig -p 2>/dev/null | grep -q 'libcublas.so.13'; then
    lib=$(python3 -c 'import torch,os;print(os.path.realpath(os.path.join(os.path.dirname(torch.__file__),"..","nvidia","cu13","lib")))' 2>/dev/null)
    if [ -n "$lib" ] && [ -d "$lib" ]; then
        export LD_LIBRARY_PATH="$lib:${LD_LIBRARY_PATH:-}"
    fi
fi
{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    nproc
    ldd "$BIN" | grep -E 'cuda|cublas|curand|not found'
} >"$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

check() {
    local name=$1
    shift
    local t0 t1 rc
    t0=$(date +%s.%N)
    timeout "$LIMIT" "$BIN" "$@" >"$OUT/$name.json" 2>"$OUT/$name.err"
    rc=$?
    t1=$(date +%s.%N)
    printf '== %s: rc=%s, %.1f s: %s\n' "$name" "$rc" "$(echo "$t1 - $t0" | bc)" "$*"
    [ "$rc" = 0 ] || tail -n 5 "$OUT/$name.err"
    if [ -n "${ARCHIVE:-}" ]; then tar czf "$ARCHIVE" -C "$OUT" .; fi
}

# The main job (`cargo xtask train` defaults) on the GPU and on this machine's CPU: the same seed,
# weights and data, so the losses must agree to float rounding, and on each device the plan's
# weights must equal checkpoint-all's bit for bit.
# The budget is not enforced here (on CUDA the kernels are candle's tensor ops, whose temporaries
# the graph does not model); the JSON reports the memory pool's high-water mark of every step
# (`heap_peak_bytes`, above the pool's use before the executor) beside the prediction.
MAIN=(train --model vgg16 --batch 16 --image-size 32 --classes 10 --steps 8 --budget 85%
    --workspace false --strategy milp --lr 0.002 --time-limit 30 --enforce-budget false --json)
check train-vgg16-32-cuda "${MAIN[@]}" --device cuda:0

# The same with the budget enforced on the memory pool: either it trains within the budget, or
# it stops at the first node whose step takes the pool over it, naming the node and the bytes
# seen against the bytes modelled (rc=1; the .err file has the line).
check train-vgg16-32-cuda-enforced train --model vgg16 --batch 16 --image-size 32 --classes 10 \
    --steps 4 --budget 85% --strategy milp --time-limit 30 --json --device cuda:0


# Per-node costs on the GPU (CUDA events across the step, the memory pool's high-water mark) and
# predicted vs measured step time of three plans solved with those costs.
check profile-vgg16-224-cuda profile --model vgg16 --batch 64 --image-size 224 --workspace false \
    --device cuda:0 --max-seconds 60 -o "$OUT/costs-vgg16-b64-cuda.json" \
    --check-plan checkpoint-all,chen-sqrtn,lp-round@85% --json

# GPU-sized steps: VGG16 and ResNet50 at 224x224 under a budget that forces recomputation.
check train-vgg16-224-cuda train --model vgg16 --batch 64 --image-size 224 --steps 6 \
    --budget 85% --workspace false --strategy lp-round --enforce-budget false --json --device cuda:0
check train-resnet50-224-cuda train --model resnet50 --batch 32 --image-size 224 --steps 4 \
    --budget 50% --strategy lp-round --enforce-budget false --json --device cuda:0

# The main job on this machine's CPU, for the loss comparison above (last: it needs no GPU).
check train-vgg16-32-cpu "${MAIN[@]}" --device cpu
