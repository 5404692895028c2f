"""This CPU's matmul rate, measured once per process, for the measurement plan.

The ``cpu`` hardware preset's rates are an order of magnitude for a CPU with native
bf16 (AVX512-BF16 or AMX): 0.1 TFLOP/s. A CPU without it (AVX2 only) runs torch's bf16
matmuls on fallbacks whose speed depends on the operands' layout: on a 2-core AMD EPYC
(AVX2), one thread, N=256-2048, a linear layer's forward (``x @ w.t()``) ran at
0.007-0.010 TFLOP/s, its input gradient (``g @ w``) at 0.001, its weight gradient
(``g.t() @ x``) at 0.02, while fp32 ran at 0.08-0.09 in every layout. A plan made on the
preset's figure started a measurement that ran for over half an hour where it
estimated a minute. The plan therefore costs its candidates on the rate this machine
reaches for one linear layer's three training GEMMs (forward, input gradient, weight
gradient; ``N`` x ``N`` x ``N`` each) in the run's compute dtype and in fp32, timed at
the process's thread count.
"""
from __future__ import annotations

import time
from functools import lru_cache

N = 256
MIN_SECONDS = 0.05
MIN_REPEATS = 3


@lru_cache(maxsize=None)
def matmul_tflops(dtype_name: str) -> float:
    """TFLOP/s of one linear layer's forward, input-gradient and weight-gradient GEMMs
    (N x N x N each) in ``dtype_name`` (a torch dtype's name) here, taken together."""
    import torch
    dtype = getattr(torch, dtype_name)
    x, w, g = (torch.randn(N, N).to(dtype) for _ in range(3))

    def step():
        x @ w.t()  # forward
        g @ w  # input gradient
        g.t() @ x  # weight gradient

    step()  # first calls: kernel selection and allocation
    n, t0 = 0, time.perf_counter()
    while True:
        step()
        n += 1
        dt = time.perf_counter() - t0
        if n >= MIN_REPEATS and dt >= MIN_SECONDS:
            return 3 * 2 * N ** 3 * n / dt / 1e12


def _compute_dtype(precision: str) -> str:
    return {"fp16": "float16", "fp32": "float32"}.get(precision, "bfloat16")


def measured_rates(precision: str) -> dict[str, float]:
    """The ``cpu`` preset's rate fields as this machine reaches them for a run in
    ``precision`` (fp16 and bf16 share ``bf16_tflops``, as in ``compute/gemm.py``)."""
    fp32 = matmul_tflops("float32")
    dtype = _compute_dtype(precision)
    low = fp32 if dtype == "float32" else matmul_tflops(dtype)
    return {"bf16_tflops": low, "fp32_tflops": fp32}
