#!/usr/bin/env bash
# The one short check to run where a CUDA device is lent (the device tool's `run`, from the repository root):
# the GPU bench and the CUDA-only tests with the device image's own python3 (torch, tiktoken, tokenizers,
# transformers and pytest are there; nothing is installed), each under a time limit that leaves room for a rerun.
# Everything it prints goes to $OUT (or /tmp/device_check) as well.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/device_check}
mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee "$out/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())" 2>&1 | tee -a "$out/gpu.txt"
timeout 240 python3 bench/bench_gpu.py 2>&1 | tee "$out/bench_gpu.txt"
timeout 150 python3 -m pytest -q -rs -p no:cacheprovider tests/test_model.py tests/test_modern.py -k cuda 2>&1 |
  tee "$out/cuda_tests.txt"
# train.parallel (issue 36): ddp and fsdp rows at 124M and 350M (one device: fsdp is a group of one, so the rows show
# FSDP's cost and its memory estimate against CUDA's peak), then FSDP2 over NCCL through the train stage
timeout 180 python3 bench/bench_gpu.py --presets gpt2_124m gpt2_350m --parallel ddp fsdp --train-only --no-compile \
  --steps 20 --warmup 5 2>&1 | tee "$out/bench_gpu_parallel.txt"
timeout 120 python3 -m pytest -q -rs -s -p no:cacheprovider tests/test_fsdp.py -k cuda 2>&1 | tee "$out/fsdp_cuda.txt"
