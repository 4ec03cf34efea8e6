#!/usr/bin/env bash
# The one device check, run once where a CUDA GPU is lent, as it is, from the repository root:
#   here:        bench/device_wheels.sh   (the wheels and the tokenized sample, into .whl/, which git ignores)
#   the device:  run(command="bash bench/device_check.sh", carry=[".whl"], timeout_s=540)
# It runs on the machine's own python3 (Python 3.12 and torch 2.11 in the lent image; nothing can be installed
# there): the wheels carried in .whl/ go to /tmp/site first. A 10-second preflight names every missing import and
# stops the check (one that runs out of time only slowly imports: the check goes on). Then each step runs under its own time limit, compiles included: 20 + 10 + 10 + 170 + 160 + 100 =
# 470 s, under the 480 it may take. Everything goes to ONE summary file, $OUT/summary.md (else
# /tmp/device_check/summary.md), printed at the end: the GPU and versions; tokens/s, MFU and peak memory beside
# train's estimate for gpt2_124m (ddp, bf16, compiled) and gpt2_350m, and fsdp's rows; the CUDA tests' results (the
# tests that skip without CUDA); the first GPU hour's figures against the published ones, pass or fail. A step that
# fails or runs out of time is recorded with its exit status, and the next one runs. DRY=1 runs the same steps at
# tiny sizes on the CPU, to check this script where no GPU is (tests/test_bench.py; SAMPLE names the sample's tokens).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/device_check}
mkdir -p "$out"
summary=$out/summary.md
py=${PYTHON:-python3}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
# each step's limit in seconds, compiles included: 470 in all
limit_wheels=20 limit_preflight=10 limit_gpu=10 limit_bench=170 limit_tests=160 limit_hour=100
if [ -n "${DRY:-}" ]; then
  sizes=(--tiny) hour=(--tiny)
  limit_preflight=60  # a loaded 2-core machine imports torch slower than the GPU machine's 16 cores
else
  sizes=(--micro-batch 64 --steps 15 --warmup 5) hour=(--steps 12)
fi

step() {  # step TITLE LIMIT COMMAND...: the command's output under a heading, then its exit status and seconds
  local title=$1 limit=$2 t0=$SECONDS rc
  shift 2
  printf '\n## %s\n\n```\n' "$title" >> "$summary"
  timeout "$limit" "$@" >> "$summary" 2>&1
  rc=$?
  printf '```\n\n%s: exit %s%s, %s s of %s\n' "$title" "$rc" "$([ "$rc" = 124 ] && echo ' (stopped at its limit)')" \
    "$((SECONDS - t0))" "$limit" >> "$summary"
  return "$rc"
}

echo "# Device check, $(date -u '+%Y-%m-%d %H:%M') UTC, commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')" \
  > "$summary"
if [ -z "${DRY:-}" ] && compgen -G ".whl/*.whl" > /dev/null; then
  step "wheels carried in .whl/" "$limit_wheels" "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site
fi
step "preflight: every import" "$limit_preflight" "$py" bench/preflight.py
preflight=$?
if [ "$preflight" != 0 ] && [ "$preflight" != 124 ]; then  # out of time is slow imports, not missing ones: go on
  printf '\nstopped: the preflight failed (bench/device_wheels.sh brings what it names)\n' >> "$summary"
  cat "$summary"
  exit 1
fi
step "GPU" "$limit_gpu" nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
step "bench: tokens/s, MFU, peak memory beside train's estimate (one GPU, micro batch 64)" "$limit_bench" \
  "$py" bench/bench_gpu.py --rows gpt2_124m:ddp gpt2_124m:fsdp:eager gpt2_350m:ddp:eager gpt2_350m:fsdp:eager \
  "${sizes[@]}" --train-only
step "CUDA tests (those that skip without CUDA)" "$limit_tests" \
  "$py" -m pytest -q -rs -p no:cacheprovider tests/test_model.py tests/test_modern.py tests/test_fsdp.py -k cuda
step "first GPU hour: gpt2_124m_first_hour's first steps against the published figures" "$limit_hour" \
  "$py" bench/first_hour.py --run "${hour[@]}" --sample "${SAMPLE:-.whl/fineweb_edu_sample.npy}"
cat "$summary"
