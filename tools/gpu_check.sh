#!/bin/bash
# The GPU check a session runs when its task is lent a GPU machine (the device tool): the CUDA tests,
# then benchmarks/gpu.py's tables, each bounded in time and logged into $OUT (the device tool's
# output folder). The GPU image has torch, Triton, transformers, typer and rich, but not pydantic or
# lark; FLA is optional. Fetch them here first, into the ignored folder .whl/, and carry it:
#
#   echo "/.whl/" >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
#     pydantic pydantic_core lark annotated-types typing-inspection flash-linear-attention fla-core
#     (pydantic and pydantic_core at the versions this venv holds: pydantic pins its core exactly)
#
# then run `bash tools/gpu_check.sh` there with carry [".whl"] (about 7 minutes on an H200; the
# kernel table's compiles are the slowest part: narrow it with --lengths/--dims below if time is short).
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
  .whl/pydantic-*.whl .whl/pydantic_core-*.whl .whl/lark-*.whl .whl/annotated_types-*.whl \
  .whl/typing_inspection-*.whl || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/fla \
  .whl/fla_core-*.whl .whl/flash_linear_attention-*.whl || echo "FLA not carried: its columns say n/a"
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/machine.txt"
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" \
  | tee -a "$OUT/machine.txt"
timeout 230 python3 -m pytest -q -n 8 -p no:cacheprovider -o addopts="" -k cuda tests/ops tests/nn/test_half_precision.py \
  tests/compiler/test_build.py tests/compiler/test_families.py 2>&1 | tee "$OUT/tests.log" | tail -40
echo "tests rc=${PIPESTATUS[0]}"
export PYTHONPATH=/tmp/site:/tmp/fla:$PWD  # FLA only for the benchmark: transformers would take it in the tests
timeout 200 python3 benchmarks/gpu.py --tables kernels --lengths 4096 --dims 64 128 --repeats 5 2>&1 \
  | tee "$OUT/kernels.txt"
echo "kernels rc=${PIPESTATUS[0]}"
timeout 100 python3 benchmarks/gpu.py --tables train decode 2>&1 | tee "$OUT/train_decode.txt"
echo "train/decode rc=${PIPESTATUS[0]}"
