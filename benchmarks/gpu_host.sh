#!/usr/bin/env bash
# The one command to run first on a GPU host: correctness (`pytest -m gpu`), then the GPU figures
# (benchmarks/gpu.py), in under 8 minutes on one GPU and 16 cores. Everything it prints and writes lands in $OUT
# (default: ./gpu-out), so a run that stops at its time limit still leaves what it had.
#
# A host without network gets the packages its image lacks as wheels in .wheels/ (ignored by git), made here with:
#   pip download --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
#       --platform manylinux_2_28_x86_64 -d .wheels tensordict pyzmq gymnasium pytest-asyncio ale-py trio
# With no .wheels/ folder, pip installs them from the index as usual.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="${OUT:-gpu-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python=${PYTHON:-python3}

echo "::: packages" | tee "$OUT/log"
wheels=()
[ -d .wheels ] && wheels=(--no-index --find-links .wheels)
"$python" -m pip install -q "${wheels[@]}" tensordict pyzmq gymnasium pytest-asyncio ale-py trio 2>&1 | tee -a "$OUT/log"
# The host's own torch stays: no dependency is resolved again.
"$python" -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tee -a "$OUT/log"
"$python" -c "import torch; print(torch.__version__, torch.cuda.get_device_name())" 2>&1 | tee -a "$OUT/log"

echo "::: correctness: pytest -m gpu (every CUDA path against a CPU reference)" | tee -a "$OUT/log"
timeout 240 "$python" -m pytest -m gpu -q -p no:cacheprovider --timeout 120 -o addopts="" \
    --junitxml="$OUT/gpu-tests.xml" 2>&1 | tee -a "$OUT/log"
tests=${PIPESTATUS[0]}

echo "::: figures: benchmarks/gpu.py" | tee -a "$OUT/log"
timeout 200 "$python" benchmarks/gpu.py --out "$OUT" --part-timeout 60 2>&1 | tee -a "$OUT/log"
figures=${PIPESTATUS[0]}

echo "::: done: tests exit $tests, figures exit $figures" | tee -a "$OUT/log"
exit $(( tests != 0 ? tests : figures ))
