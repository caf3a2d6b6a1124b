"""The timed loop that the Python-driven benchmarks share (pslite_compare.py,
connections_compare.py): one trainer's synthetic fp32 model and its steps
through the C++ client's Python binding."""

import time

import numpy as np


def synthetic_model(n):
    """Initial parameters (all 0.5) and a fixed gradient, both fp32."""
    params = np.full(n, 0.5, dtype=np.float32)
    grads = (np.sin((np.arange(n) % 4096).astype(np.float32)) * 1e-2).astype(np.float32)
    return params, grads


def time_steps(client, grads, params, seconds):
    """Step 1 untimed, then steps for at least `seconds` (and at least 3):
    each timed step's seconds, and the last step. Raises when the pulled
    parameters never changed."""
    client.step(1, grads, params)  # Warm-up.
    times, step = [], 1
    start = time.perf_counter()
    while len(times) < 3 or time.perf_counter() - start < seconds:
        step += 1
        t0 = time.perf_counter()
        client.step(step, grads, params)
        times.append(time.perf_counter() - t0)
    if params[-1] == np.float32(0.5):
        raise RuntimeError("the pulled parameters were not updated")
    return times, step
