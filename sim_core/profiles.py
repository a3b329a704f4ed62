"""Named calibration profiles: what `sweep calibrate` fitted, saved as files, and installed into
the simulator by `activate`.

A profile is a folder, `$SWEEP_PROFILES/NAME/` (default `~/.cache/sweep/profiles/NAME/`); a
path (anything with a slash, or an existing folder) is used as is. Layout:

    manifest.json          format, name, version, created/updated, components (below)
    data/<component>/...   copies of the input files it was fitted on (sha256 in the manifest)
    compute/<gpu>_<op>.json     XGBoost efficiency models (Booster.save_model JSON)
    overlap/slowdown.json       XGBoost slowdown model (Echo settings)
    nccl/fit_errors.csv         per-row fit error of the NCCL scales

`version` is the first 16 hex digits of a sha256 over the sha256 of every input file (with its
component), so two profiles fitted on the same data have the same version, and any change of
data gives a new one. Components (compute, overlap, nccl) are added one `sweep calibrate` call
at a time; each call replaces its own component only.

`activate(name_or_path)` is a pure function of the folder: call it in every process that
simulates (the CLI process and each Ray worker). For workers on other machines, `pack()` the
profile into bytes in the driver and `activate_packed(blob)` in the worker. `deactivate()`
restores the defaults exactly (roofline curves, the slowdown prior, the analytical NCCL model).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import io
import json
import os
import re
import shutil
import tarfile
import tempfile
from pathlib import Path

FORMAT = 1
MANIFEST = "manifest.json"
ENV_ROOT = "SWEEP_PROFILES"
ENV_ACTIVE = "SWEEP_PROFILE"  # optional: activate_from_env() reads it (e.g. in Ray workers)
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")

_active: dict | None = None  # {"dir", "version", "manifest"}


class ProfileError(ValueError):
    pass


# ---------------------------------------------------------------------------------------------
# locations and manifests
# ---------------------------------------------------------------------------------------------
def root() -> Path:
    env = os.environ.get(ENV_ROOT)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "sweep" / "profiles"


def profile_dir(name_or_path) -> Path:
    """Folder of a profile: a path as given, else $SWEEP_PROFILES/NAME."""
    s = str(name_or_path)
    if isinstance(name_or_path, Path) or "/" in s or os.sep in s or s.startswith(("~", ".")):
        return Path(s).expanduser().resolve()
    if not _NAME_RE.match(s):
        raise ProfileError(f"profile name {s!r}: use letters, digits, '.', '_', '-' (or a path)")
    return (root() / s).resolve()


def sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def load_manifest(name_or_path) -> dict:
    d = profile_dir(name_or_path)
    p = d / MANIFEST
    if not p.is_file():
        known = ", ".join(list_profiles()) or "none"
        raise ProfileError(f"no calibration profile at {d} (profiles in {root()}: {known})")
    m = json.loads(p.read_text())
    if m.get("format") != FORMAT:
        raise ProfileError(f"{p}: profile format {m.get('format')} (this sweep reads {FORMAT})")
    return m


def list_profiles() -> list[str]:
    r = root()
    if not r.is_dir():
        return []
    return sorted(p.name for p in r.iterdir() if (p / MANIFEST).is_file())


def _version(components: dict) -> str:
    h = hashlib.sha256()
    for comp in sorted(components):
        for inp in sorted(components[comp].get("inputs", []), key=lambda x: x["sha256"]):
            h.update(f"{comp}:{inp['sha256']}\n".encode())
        # which rows of the data were used (a run calibration selects them by expression)
        sel = components[comp].get("selection")
        if sel:
            h.update(f"{comp}:selection:{json.dumps(sel, sort_keys=True)}\n".encode())
    return h.hexdigest()[:16]


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


def save_component(name_or_path, component: str, info: dict, inputs, write_files) -> dict:
    """Add or replace one component of a profile.

    inputs: the data files it was fitted on (copied into data/<component>/, hashed);
    write_files(folder) writes the component's model files into the profile folder and returns
    their paths relative to it. Returns the new manifest."""
    d = profile_dir(name_or_path)
    d.mkdir(parents=True, exist_ok=True)
    try:
        man = load_manifest(d)
    except ProfileError:
        man = {"format": FORMAT, "name": d.name, "created": _now(), "components": {}}
    data = d / "data" / component
    if data.exists():
        shutil.rmtree(data)
    data.mkdir(parents=True)
    recs = []
    for src in inputs:
        src = Path(src)
        dst = data / src.name
        if dst.exists():  # two inputs with one name: keep both
            dst = data / f"{len(recs)}_{src.name}"
        shutil.copyfile(src, dst)
        recs.append({"file": str(dst.relative_to(d)), "original": str(src.resolve()),
                     "sha256": sha256(dst), "bytes": dst.stat().st_size})
    files = [str(p) for p in write_files(d)]
    man["components"][component] = {**info, "inputs": recs, "files": files, "fitted": _now()}
    man["version"] = _version(man["components"])
    man["updated"] = _now()
    (d / MANIFEST).write_text(json.dumps(man, indent=2, default=_json_default) + "\n")
    return man


def _json_default(o):
    import numpy as np

    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def verify(name_or_path) -> list[str]:
    """Inputs whose copy no longer matches the manifest's sha256 (empty = intact)."""
    d = profile_dir(name_or_path)
    man = load_manifest(d)
    bad = []
    for comp in man["components"].values():
        for inp in comp.get("inputs", []):
            p = d / inp["file"]
            if not p.is_file() or sha256(p) != inp["sha256"]:
                bad.append(inp["file"])
    return bad


# ---------------------------------------------------------------------------------------------
# activation
# ---------------------------------------------------------------------------------------------
def activate(name_or_path) -> dict:
    """Install a profile's models into this process (None deactivates). Returns its manifest.

    Compute: learned GEMM/attention efficiency on the GPUs the profile was trained on (roofline
    elsewhere). Overlap: learned slowdown for the (architecture, kernel class) pairs it saw
    (prior elsewhere). NCCL: the fitted bandwidth/latency scales on every collective, and the
    measured nccl-tests curves as an exact override for matching (op, group size, nodes).
    Activating the profile that is already active is a no-op."""
    global _active
    if name_or_path is None:
        deactivate()
        return {}
    d = profile_dir(name_or_path)
    man = load_manifest(d)
    if _active and _active["dir"] == d and _active["version"] == man.get("version"):
        return _active["manifest"]
    bad = verify(d)
    if bad:
        raise ProfileError(f"profile {d.name}: input data changed since fitting: {bad}")
    deactivate()
    from . import compute, overlap
    from .calibration import kernels
    from .calibration import overlap as overlap_fit

    comps = man["components"]
    if "compute" in comps:
        gemm, attn = [], []
        for mrec in comps["compute"]["models"]:
            mod = kernels.KernelModel.load(d / mrec["file"], mrec["gpu"], mrec["op_class"], mrec)
            (gemm if mrec["op_class"] == "gemm" else attn).append(mod)
        if gemm:
            compute.set_gemm_model(kernels.gemm_hook(gemm))
        if attn:
            compute.set_attention_model(kernels.attention_hook(attn))
    if "overlap" in comps:
        c = comps["overlap"]
        model = overlap_fit.SlowdownModel.load(d / c["file"], c)
        overlap.set_model(overlap_fit.overlap_hook(model))
    if "nccl" in comps:
        c = comps["nccl"]
        measured = None
        if c.get("use_measured", True):
            from .nccl_tests import load_profile

            measured = load_profile([d / i["file"] for i in c["inputs"]],
                                    curves=c.get("curves"))
        _install_nccl(c["scales"], measured)
    if "runs" in comps:
        from .calibration import runs as runs_fit

        if "terms" not in comps["runs"]:
            raise ProfileError(f"profile {d.name}: its runs component was fitted by an older "
                               "sweep (scales, not terms); run `sweep calibrate runs` again")
        runs_fit.install(comps["runs"]["terms"], comps["runs"].get("interval"),
                         memory_spread=bool(comps["runs"].get("accepted")))
        res = comps["runs"].get("residual")
        if res:
            from . import terms
            from .calibration import residual as residual_fit

            if "lo" not in res["range"]:
                raise ProfileError(f"profile {d.name}: its learned residual was fitted on model "
                                   "size by an older sweep; run `sweep calibrate runs` again")
            terms.set_residual(residual_fit.hook(residual_fit.load(d / res["file"]),
                                                 res["range"], comps["runs"]["terms"]))
    if "rl_phases" in comps:  # RL phase scales (sweep calibrate rl-runs): simulate_rl only
        from .rl import phases as rl_phases

        rl_phases.set_phase_scales(comps["rl_phases"]["scales"])
    _active = {"dir": d, "version": man.get("version"), "manifest": man}
    return man


def deactivate() -> None:
    """Back to the default models, exactly."""
    global _active
    from . import compute, memory, nccl, overlap, terms

    compute.set_gemm_model(None)
    compute.set_attention_model(None)
    compute.set_efficiency_scale(None)
    memory.set_overhead(None)
    terms.set_params(None)
    terms.set_residual(None)
    terms.set_interval(None)
    from . import risk

    risk.set_calibrated_sigma(None)
    overlap.set_model(None)
    nccl.set_calibration(None)
    from .rl import phases as rl_phases

    rl_phases.set_phase_scales(None)
    _active = None


def active() -> dict | None:
    """Manifest of the active profile (None = defaults)."""
    return _active["manifest"] if _active else None


def activate_from_env() -> dict | None:
    """Activate $SWEEP_PROFILE if set (what a Ray worker can call at start)."""
    v = os.environ.get(ENV_ACTIVE)
    return activate(v) if v else None


def _install_nccl(scales: dict, measured) -> None:
    """Scaled network and measured curves for every NCCL call (nccl.set_calibration)."""
    from . import nccl

    nccl.set_calibration(scales, measured)


# ---------------------------------------------------------------------------------------------
# shipping a profile to remote workers
# ---------------------------------------------------------------------------------------------
def pack(name_or_path) -> bytes:
    """The profile folder as a gzipped tar (small: models + input copies)."""
    d = profile_dir(name_or_path)
    load_manifest(d)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(d, arcname=".")
    return buf.getvalue()


def activate_packed(blob: bytes) -> dict:
    """Unpack (once per fitted content, under the temp dir) and activate: for Ray workers.
    The folder is keyed by the packed profile's own hash, not only its version: the version
    names the data, and a refit on the same data (another sweep, other options) must not
    reuse what an earlier fit unpacked."""
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        man = json.load(tar.extractfile("./" + MANIFEST))
        key = hashlib.sha256(json.dumps(man, sort_keys=True, default=str).encode()).hexdigest()
        d = Path(tempfile.gettempdir()) / f"sweep-profile-{man['name']}-{man['version']}-{key[:12]}"
        if not (d / MANIFEST).is_file():
            tmp = Path(tempfile.mkdtemp(prefix="sweep-profile-"))
            tar.extractall(tmp, filter="data")
            try:
                tmp.rename(d)
            except OSError:  # another worker got there first
                shutil.rmtree(tmp, ignore_errors=True)
    return activate(d)


# ---------------------------------------------------------------------------------------------
# display
# ---------------------------------------------------------------------------------------------
def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def describe(name_or_path) -> str:
    d = profile_dir(name_or_path)
    man = load_manifest(d)
    lines = [f"profile {man['name']}  version {man.get('version')}  ({d})",
             f"created {man.get('created')}  updated {man.get('updated')}"]
    comps = man["components"]
    if "compute" in comps:
        c = comps["compute"]
        lines.append("compute (XGBoost efficiency per GPU and op class; k-fold CV = time error):")
        for m in c["models"]:
            cv = m.get("cv", {})
            k = next((v for kk, v in cv.items() if kk.startswith("kfold")), {})
            lo = cv.get("leave_one_source_out", {})
            lo_s = (f", LOSO median {_pct(max(v['median_abs_err'] for v in lo.values()))} "
                    f"(worst source)") if lo else ""
            lines.append(f"  {m['gpu']:<10} {m['op_class']:<9} {m['rows']:>6} rows  CV median "
                         f"{_pct(k.get('median_abs_err'))}, p90 {_pct(k.get('p90_abs_err'))}, "
                         f"within 5% {_pct(k.get('within_5pct'))}{lo_s}")
    if "overlap" in comps:
        c = comps["overlap"]
        h, k = c["holdout_80_20"], c["cv"].get("kfold5", {})
        lines.append(f"overlap (Echo XGBoost slowdown, {c['rows']} rows): 80/20 within 5% "
                     f"{_pct(h.get('within_5pct'))}, RMSE {h.get('rmse', float('nan')):.4f}; "
                     f"5-fold within 5% {_pct(k.get('within_5pct'))}; prior within 5% "
                     f"{_pct(c['prior_on_data'].get('within_5pct'))}")
    if "nccl" in comps:
        c = comps["nccl"]
        sc = ", ".join(f"{k} x{v:.3f}" for k, v in c["scales"].items())
        lines.append(f"nccl ({c['gpu']}, {c['rows']} rows from {len(c['inputs'])} files): {sc}")
        lines.append(f"  median |err| default {_pct(c['median_abs_err_default'])} -> fitted "
                     f"{_pct(c['median_abs_err_fitted'])}; measured override "
                     f"{'on' if c.get('use_measured', True) else 'off'}")
        for r in c.get("loso", []):
            lines.append(f"  LOSO {r['held_out']}: median {_pct(r['median_abs_err'])}, max "
                         f"{_pct(r['max_abs_err'])}")
    if "runs" in comps:
        lines += runs_summary(man)
    lines += rl_phases_summary(man)
    for comp in comps.values():
        for i in comp.get("inputs", []):
            lines.append(f"  data {i['file']}  sha256 {i['sha256'][:16]}")
    return "\n".join(lines)


def runs_summary(man: dict) -> list[str]:
    """What a run calibration changed and the grouped-CV error it was accepted with (shown by
    `calibrate show`, search, recommend and the report)."""
    c = man.get("components", {}).get("runs")
    if not c or "terms" not in c:
        return []
    free = c.get("free", [])
    parts = []
    for k in free:
        v = c["terms"][k]
        parts.append(f"{k} {v:+.4g}" if k.startswith(("host", "node", "mem_fixed", "mem_fw"))
                     else f"{k} x{v:.3f}")
    cv = c.get("cv_after", {})
    before = c.get("cv_before", {})
    errs = ", ".join(f"leave one {k} out {_pct(before[k]['step'])} -> {_pct(v['step'])}"
                     for k, v in cv.items() if k in before)
    state = "accepted" if c.get("accepted") else "white-box kept (no term helped)"
    out = [f"runs ({c['rows']} runs, {state}): " + (", ".join(parts) or "no term freed"),
           f"  grouped-CV median |step err| white-box -> calibrated: {errs or '-'}"]
    if c.get("residual"):
        r = c.get("residual_cv") or {}
        out.append("  learned residual (XGBoost) kept: " + ", ".join(
            f"leave one {k} out {_pct(v['without'])} -> {_pct(v['with'])}" for k, v in r.items())
            + f"; none beyond {int(c['residual']['range']['num_gpus'])} GPUs (flagged)")
    return out


def rl_phases_summary(man: dict) -> list[str]:
    """The RL phase scales of a profile and the grouped-CV step error they were fitted with
    (`sweep calibrate rl-runs`)."""
    c = man.get("components", {}).get("rl_phases")
    if not c:
        return []
    e = c.get("median_abs_step_err", {})
    sc = ", ".join(f"{k} x{v:.3f} ({c['rows'].get(k, 0)} rows)" for k, v in c["scales"].items())
    return [f"rl_phases ({c.get('timed_rows')} timed RL runs, {c.get('groups')} {c.get('group')} "
            f"groups): {sc}",
            f"  median |step err| white-box {_pct(e.get('before'))} -> in-sample "
            f"{_pct(e.get('in_sample'))}, leave one {c.get('group')} out {_pct(e.get('cv'))}"
            + ("" if c.get("cv_improves_step", True) else
               f" (worse than white-box on a {c.get('group')} left out)")]


def active_line() -> str | None:
    """One line naming the active profile, its version and its grouped-CV error (None when the
    default model is active)."""
    man = active()
    if not man:
        return None
    c = man.get("components", {}).get("runs")
    err = ""
    if c and "cv_step_error" in c:
        how = ("accepted at" if c.get("accepted") or c.get("residual") else
               "kept the white-box model (no term helped) at")
        err = f"; run calibration {how} grouped-CV median step error {_pct(c['cv_step_error'])}"
    return (f"calibration profile {man['name']} version {man.get('version')} is active "
            f"({', '.join(sorted(man.get('components', {})))}){err}")
