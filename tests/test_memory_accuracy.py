"""Peak memory against measured runs: torchtitan's benchmark rows that report peak memory (peak
reserved, compared with peak_reserved_gib) and TorchSim's Llama 70B FSDP tables (live tensors,
compared with peak_allocated_gib). Prints the per-row table (pytest -s)."""

import numpy as np

from sim_core.accuracy.validation import validate_memory


def test_peak_memory_against_measurements():
    t = validate_memory()
    print()
    print(t.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    err = t["mem_error"].abs()
    print(f"median |error| {err.median():.3f}, within 10%: {(err <= 0.10).sum()}/{len(err)}")
    assert len(t) >= 25
    assert np.isfinite(t["predicted_mem_gib"]).all()
    assert err.median() <= 0.10
    assert (err <= 0.10).mean() >= 0.75
    torchsim = t[t["case"].str.startswith("T")]
    assert (torchsim["mem_error"].abs() <= 0.15).all()  # all within 15%, 6 of 10 within 10%
    titan = t[~t["case"].str.startswith("T")]
    assert titan["mem_error"].abs().median() <= 0.05
    assert (titan["mem_error"].abs() <= 0.10).mean() >= 0.85
