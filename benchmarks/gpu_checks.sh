#!/usr/bin/env bash
# The GPU checks of issues 2, 4 and 6, as one script for a lent GPU machine: the CUDA tests, the
# GPU save benchmark and the GPU gradient benchmark. Needs torch with CUDA, numpy, pyarrow, pytest
# (rlprobe from this checkout).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -c "import torch, numpy, pyarrow; print('torch', torch.__version__, 'numpy', numpy.__version__, 'pyarrow', pyarrow.__version__)"
python3 -m pytest tests/frameworks/test_torch_cuda.py -q -p no:cacheprovider -o addopts="" 2>&1
python3 benchmarks/save_overhead.py --device cuda --repeat 5 --tmp "${TMPDIR:-/tmp}"
# issue 4: the gradient probe on the 537M-parameter MLP (L1 and L2 vs the plain step)
python3 benchmarks/grad_gpu_overhead.py --repeat 3 --tmp "${TMPDIR:-/tmp}"
