"""Issue 40 (session 12) finding: verl FSDP passes on small models, measured vs priced per micro-batch.

Run: PYTHONPATH=. python scripts/verl_small_passes.py (prints, changes nothing)."""
# per-micro-batch seconds: measured phase / micro-batches vs the priced GPU time and host floor
import numpy as np
from sim_core.rl import verl, host
cap = {}
orig = verl.phases
def ph(*a, **k):
    cap.setdefault("v", []).append(orig(*a, **k)); return cap["v"][-1]
verl.phases = ph
ff, uf = host.forward_floor, host.update_floor
host.forward_floor = lambda l, m: (cap.setdefault("ff", []).append(np.array(m)), ff(l, m))[1]
host.update_floor = lambda l, m, c: (cap.setdefault("uf", []).append(np.array(m)), uf(l, m, c))[1]
from sim_core.accuracy import rl
from sim_core.calibration import rl_phases
t = rl.load(); d = rl_phases.prepare(t)
v = cap["v"][0]; on = np.flatnonzero(v["on"]); pos = {r: i for i, r in enumerate(on)}
# ff calls per phases(): lp, cval ; uf calls: upd, cupd (first phases() call)
lp_mb, cval_mb = cap["ff"][0], cap["ff"][1]; upd_mb = cap["uf"][0]
for r, meas_lp, meas_upd in ((13, 7.864, 27.339), (19, 1.56, 10.61), (20, 0.24, 1.02), (21, 2.23, 13.03)):
    i = pos[r]; mini = t.iloc[r]["train_gbs_seqs"]
    n_lp = lp_mb[i]; n_upd = upd_mb[i] * d.b.mini_batches[r] if hasattr(d, "b") else upd_mb[i]
    print(r, t.source.iloc[r][:28], "old_log_prob meas %.2f pred %.2f over %d mb: %.1f vs %.1f ms/mb; update meas %.2f pred %.2f (%d mb/step)"
          % (meas_lp, v["old_log_prob_s"][r], n_lp, 1e3 * meas_lp / n_lp, 1e3 * v["old_log_prob_s"][r] / n_lp,
             meas_upd, v["update_actor_s"][r], upd_mb[i]))
