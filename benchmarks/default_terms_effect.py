"""The effect of cited host / node-count terms on the default model (issue 24, item 3).

Prints `sweep validate`'s per-family median |step error| and `python -m sim_core.accuracy.fit`'s
leave-one-source-out errors with the neutral terms (what ships) and with candidate defaults:
node_c = 0.015 per doubling of nodes (docs/calibration.md: end-to-end tables give 0.4-2.5%) and
host_mb_s = 1 ms per micro-batch (a few hundred eager launches at 3-5 us exposed). A candidate
becomes the default only if no family's in-sample or held-out error gets worse.

    python benchmarks/default_terms_effect.py
"""

from __future__ import annotations

import contextlib
import io

import numpy as np

from sim_core import terms
from sim_core.accuracy import fit, validation

CANDIDATES = {"neutral (shipped)": {}, "node_c 0.015": {"node_c": 0.015},
              "host_mb 1 ms": {"host_mb_s": 0.001},
              "both": {"node_c": 0.015, "host_mb_s": 0.001}}


def main() -> None:
    for name, p in CANDIDATES.items():
        terms.set_params(p or None)
        try:
            t = validation.validate()
            s = validation.summary(t)
            rows = fit.dense_rows()
            with contextlib.redirect_stdout(io.StringIO()):
                loso = fit.leave_one_source_out(rows)
        finally:
            terms.set_params(None)
        print(f"== {name}")
        print(s.to_string(float_format=lambda x: f"{x:.3f}"))
        print("leave-one-source-out:")
        print(loso.to_string(index=False, float_format=lambda x: f"{x:.3f}"))


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
