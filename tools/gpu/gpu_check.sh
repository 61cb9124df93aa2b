#!/bin/bash
# The GPU check: radixlm's kernel tests compiled for CUDA (TRITON_INTERPRET=0) and the
# tiny-model engine runs that drive the scheduler there (Triton against torch_native, with
# and without CUDA graphs, page size 16), on a GPU machine that has no network access and
# receives only a small copy of the checkout (the bundled 94 MB GGUF does not travel).
#
#   bash tools/gpu/gpu_check.sh prepare   # on the development machine: fill .devcache/ (ignored), about 13 MB
#   bash tools/gpu/gpu_check.sh run       # on the GPU machine, with .devcache/ copied; logs to $OUT (or .)
#
# prepare downloads CPython 3.12 manylinux wheels of the dependencies the GPU image lacks
# (the versions installed here) and copies the bundled model's tokenizer files, which the
# tiny random models use (RADIXLM_TEST_TOKENIZER_DIR, tests/kernels/conftest.py).
set -euo pipefail
cd "$(dirname "$0")/../.."
case "${1:-}" in
prepare)
  mkdir -p .devcache/wheels .devcache/tok
  for p in gguf pyzmq msgspec fastapi starlette pydantic pydantic-core annotated-types \
           typing-inspection uvicorn xgrammar apache-tvm-ffi jsonschema \
           jsonschema-specifications referencing rpds-py; do
    echo "$p==$(python -m pip show "$p" | sed -n 's/^Version: //p')"
  done > .devcache/requirements.txt
  python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --abi cp312 --abi abi3 --abi none --platform manylinux2014_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 --platform any \
    -d .devcache/wheels -r .devcache/requirements.txt
  tok=$(python -c "from radixlm.runtime.executor.model_registry import local_hf_dir as d; print(d('smollm2-135m'))")
  cp "$tok/tokenizer.json" "$tok/tokenizer_config.json" .devcache/tok/
  du -sh .devcache
  ;;
run)
  export PYTHONPATH=$PWD RADIXLM_TEST_TOKENIZER_DIR=$PWD/.devcache/tok TRITON_INTERPRET=0
  log=${OUT:-.}/gpu_tests.log
  {
    date; nvidia-smi -L; python3 --version
    python3 -m pip install -q --no-deps --no-index .devcache/wheels/*.whl 2>&1 | tail -3
    python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  } > "$log" 2>&1
  set +e
  timeout 420 python3 -m pytest -q -rs -p no:cacheprovider tests/kernels >> "$log" 2>&1
  echo "pytest rc=$?" >> "$log"
  tail -20 "$log"
  ;;
*)
  echo "usage: bash tools/gpu/gpu_check.sh prepare|run" >&2
  exit 2
  ;;
esac
