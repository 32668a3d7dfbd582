#!/usr/bin/env bash
# Python package check without a GPU (the last stage of .ci/run; runs anywhere):
#   1. a virtual environment with PyTorch and pytest from PyPI
#   2. the extension built from this tree (pip install --no-build-isolation ./python, sm_90a)
#   3. pytest python/tests: schema, fake impl, torch.compile tracing, argument errors, the
#      float32 reference, the adapters; the GPU tests are skipped without a GPU
# PyPI's Linux PyTorch wheel is the CUDA build (about 1 GB of wheels with its CUDA libraries;
# the CPU-only wheels are on PyTorch's own index, which CI cannot reach). Since it is there
# anyway, step 2 costs only the compile and checks that the binding builds and links.
# Environment: MLAKIT_VENV (default /tmp/mlakit-venv), MLAKIT_JOBS (compile jobs, default 2),
# MLAKIT_CUDA_ARCHS (default 90a), MLAKIT_NO_EXTENSION=1 (skip step 2).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
venv=${MLAKIT_VENV:-/tmp/mlakit-venv}
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi

t0=$SECONDS
python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check torch numpy pytest
"$venv/bin/python" -c 'import torch; print("torch", torch.__version__)'
echo "python-ci.sh: venv + torch + pytest took $((SECONDS - t0)) s"

t1=$SECONDS
rm -rf python/build
MAX_JOBS=${MLAKIT_JOBS:-2} "$venv/bin/pip" install -q --disable-pip-version-check \
  --no-build-isolation --no-deps ./python
# A built extension must load: an entry of the dispatch table compiled in none of its parts
# is an undefined symbol that only the import reports.
"$venv/bin/python" - <<'PY'
import os, sys
import mlakit
from mlakit import _ext
print("mlakit extension loaded:", mlakit.has_cuda_extension())
if os.environ.get("MLAKIT_NO_EXTENSION", "") in ("", "0") and not mlakit.has_cuda_extension():
    sys.exit("python-ci.sh: mlakit._C was built but does not load: %s" % _ext.LOAD_ERROR)
PY
echo "python-ci.sh: pip install ./python took $((SECONDS - t1)) s"

# From the repository root: the installed package is the one imported.
"$venv/bin/python" -m pytest -ra python/tests
