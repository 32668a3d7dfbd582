"""examples/torch_backend.py (the engine-backend example the README and docs/integration.md
show) runs on the GPU: graphs for batch sizes 1..32, bf16 Q, fp8 cache with its scale, q_len 8,
16 and 12 heads, each replayed step checked against the reference. Skipped without a GPU."""
import importlib.util
import os

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "torch_backend.py")


@pytest.mark.parametrize("heads", [16, 12])
def test_engine_backend_example(heads):
    spec = importlib.util.spec_from_file_location("torch_backend", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    worst = module.main(["--heads", str(heads), "--steps", "4", "--check"])
    assert worst < 1e-2
