#!/usr/bin/env bash
# What bench/device_check.sh carries to the GPU machine, which reaches no network, made here: the wheels of
# bench/preflight.py's imports (torch left out: the machine's own CUDA build) for its Python 3.12 on x86-64, pinned at
# this environment's versions with all they require, and the FineWeb-Edu reference sample in GPT-2 ids for
# bench/first_hour.py. Both go to .whl/ (git-ignored), which the device call names in `carry`.
#
#   bench/device_wheels.sh            # then: carry [".whl"], command: bash bench/device_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
python bench/preflight.py --wheels > .whl/requirements.txt
python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl -r .whl/requirements.txt
python bench/first_hour.py --make-sample "${SAMPLE_JSONL:-../shared/ref-data/fineweb_edu_sample.jsonl}"
echo "$(ls .whl/*.whl | wc -l) wheels, $(du -sh .whl | cut -f1) in .whl/"
