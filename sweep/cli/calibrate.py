"""`sweep calibrate`: fit the simulator's optional learned parts to measurements and save them as
a named profile that `sweep simulate` / `sweep search` accept (`--profile NAME`).

    sweep calibrate compute KERNELS.csv [MORE...] [--gpu h100-sxm] --profile NAME
    sweep calibrate overlap TABLE.csv --profile NAME
    sweep calibrate nccl all_reduce_perf.txt [MORE...] [--gpu h100-sxm] --profile NAME
    sweep calibrate inspect TRACE.json.gz|nsys_stats.txt [MORE...]
    sweep calibrate runs RUNS.csv [--fit EXPR] [--failed-as oom] [--plot DIR] --profile NAME
    sweep calibrate rl-runs RL_RUNS.csv [--group COL] [--rows EXPR] --profile NAME
    sweep calibrate learning-curve RUNS.csv [MORE...] [--sizes 3,5,8,12]
    sweep calibrate show NAME
    sweep calibrate list

Formats, features and metrics: docs/calibration.md and sim_core/calibration/. Profiles live in
$SWEEP_PROFILES/NAME (default ~/.cache/sweep/profiles/NAME); a path is accepted too.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import SweepError

NAME = "calibrate"
HELP = "fit learned compute/overlap models and NCCL scales into a profile"

EPILOG = """\
examples (synthetic data shipped in sim_core/data/calibration_examples/):
  D=sim_core/data/calibration_examples
  sweep calibrate compute $D/kernels_h100_synthetic.csv --profile demo
  sweep calibrate overlap $D/overlap_synthetic.csv --profile demo
  sweep calibrate nccl $D/*_perf_*.txt --profile demo
  sweep calibrate show demo
kernel table columns: gpu, op_class (gemm|attention), dtype, m, n, k, batch, heads, seq,
head_dim, causal, direction (fwd|bwd), time_us[, source]; also accepted: nsys
cuda_gpu_kern_sum CSV or console output, and PyTorch profiler chrome traces (shapes need
record_shapes=True); --gpu where the file names no catalog GPU.
overlap table columns: gpu or sm_arch, kernel_class, collective, nbytes, group,
time_alone_us, time_overlap_us[, source].
"""


def _pct(x) -> str:
    return "-" if x is None or (isinstance(x, float) and np.isnan(x)) else f"{100 * x:.1f}%"


def _metrics_line(m: dict) -> str:
    return (f"median {_pct(m.get('median_abs_err'))}, p90 {_pct(m.get('p90_abs_err'))}, "
            f"max {_pct(m.get('max_abs_err'))}, within 5% {_pct(m.get('within_5pct'))}, "
            f"10% {_pct(m.get('within_10pct'))}")


def _need(paths) -> list[Path]:
    out = []
    for p in paths:
        p = Path(p)
        if not p.is_file():
            raise SweepError(f"{p}: no such file")
        out.append(p)
    return out


# ---------------------------------------------------------------------------------------------
def _load_kernel_files(files, fmt: str, gpu: str | None) -> pd.DataFrame:
    """Every file's kernels, with a line per file saying what the loader found in it."""
    from sim_core.calibration import kernels

    frames = []
    for p in files:
        try:
            df = kernels.load_kernels(p, fmt, gpu)
        except (ValueError, KeyError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
            raise SweepError(f"{p}: cannot read it as a kernel table, nsys summary or profiler "
                             f"trace ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"
                             ) from None
        shaped = int(df["op_class"].isin(kernels.OP_CLASSES).mul(
            df[["m", "seq"]].notna().any(axis=1)).sum()) if len(df) else 0
        by = df.groupby("op_class")["time_us"].agg(["size", "sum"]) if len(df) else None
        gpus = sorted(str(g) for g in df["gpu"].dropna().unique()) if len(df) else []
        print(f"{p.name}: {len(df)} kernel rows, {shaped} with shapes (trainable); GPU "
              f"{', '.join(gpus) if gpus else 'not named (give --gpu)'}"
              + ("; per class: rows, summed per-call kernel time" if len(df) else ""))
        if by is not None:
            for oc, r in by.iterrows():
                print(f"  {oc:<14} {int(r['size']):>6} rows {r['sum'] / 1e3:>12.3f} ms")
        for note in df.attrs.get("notes", []):
            print(f"  note: {note}")
        frames.append(df)
    return pd.concat(frames, ignore_index=True)


def cmd_inspect(args) -> int:
    """What the loaders extract from profiler exports, without fitting anything."""
    files = _need(args.files)
    df = _load_kernel_files(files, args.format, args.gpu)
    if args.csv:
        df.to_csv(args.csv, index=False)
        print(f"wrote {len(df)} rows to {args.csv}")
    return 0


def _one_attention_kernel(df: pd.DataFrame, name: str | None) -> pd.DataFrame:
    """Attention rows of one kernel family: a measured table (sim_core.calibration.measure)
    times cuDNN and FlashAttention-2 on the same shapes, and one learned model per GPU cannot
    be both."""
    kern = df["kernel"] if "kernel" in df.columns else pd.Series("", index=df.index)
    attn = df["op_class"] == "attention"
    found = sorted(str(k) for k in kern[attn].dropna().unique() if str(k))
    if name is None:
        if len(found) > 1:
            raise SweepError(f"--attention-kernel: the attention rows come from {len(found)} "
                             f"kernels; choose one of {', '.join(found)}")
        return df
    if name not in found:
        raise SweepError(f"--attention-kernel: no attention rows of {name!r}; the table has "
                         f"{', '.join(found) or 'no kernel column'}")
    return df[~attn | (kern == name)]


def cmd_compute(args) -> int:
    from sim_core import profiles
    from sim_core.calibration import kernels

    files = _need(args.files)
    df = _load_kernel_files(files, args.format, args.gpu)
    if args.gpu:
        df = df[df["gpu"].astype(str) == args.gpu]
    df = _one_attention_kernel(df, args.attention_kernel)
    print(f"kernel table: {len(df)} rows from {len(files)} file(s)")
    models = kernels.train_kernel_models(df, folds=args.folds, rounds=args.rounds)
    if not models:
        raise SweepError("no (gpu, op class) had enough shaped gemm/attention rows to train")
    for (gpu, oc), m in models.items():
        cv = m.meta["cv"]
        print(f"  {gpu} {oc}: {m.meta['rows']} rows; predicted/measured kernel time")
        print(f"    train          {_metrics_line(m.meta['train'])}")
        for k, v in cv.items():
            if k.startswith("kfold"):
                print(f"    {k:<14} {_metrics_line(v)}")
        for src, v in cv.get("leave_one_source_out", {}).items():
            print(f"    LOSO {src:<9} {_metrics_line(v)}")

    records = []
    for (gpu, oc), m in models.items():
        m.meta["file"] = str(Path("compute") / f"{gpu}_{oc}.json")
        records.append({"gpu": gpu, "op_class": oc, **m.meta})

    def write(d: Path):
        (d / "compute").mkdir(exist_ok=True)
        for m in models.values():
            m.save(d / m.meta["file"])
        return [r["file"] for r in records]

    man = profiles.save_component(args.profile, "compute", {"models": records}, files, write)
    print(f"saved profile {man['name']} version {man['version']} "
          f"({profiles.profile_dir(args.profile)})")
    return 0


# ---------------------------------------------------------------------------------------------
def cmd_overlap(args) -> int:
    from sim_core import profiles
    from sim_core.calibration import overlap as overlap_fit

    (path,) = _need([args.table])
    df = overlap_fit.load_overlap_table(path)
    print(f"overlap table: {len(df)} rows ({df['kernel_class'].nunique()} kernel classes, "
          f"{df['collective'].nunique()} collectives, archs "
          f"{sorted(int(a) for a in df['sm_arch'].unique())})")
    model = overlap_fit.train_overlap_model(df, rounds=args.rounds)
    meta = model.meta
    h = meta["holdout_80_20"]
    print("Echo settings: XGBRegressor(objective='reg:squarederror', max_depth=12, "
          "random_state=42), 80/20 split + 5-fold CV; error = predicted / measured slowdown")
    print(f"  80/20 hold-out  {_metrics_line(h)}, 15% {_pct(h.get('within_15pct'))}, "
          f"RMSE {h['rmse']:.4f}")
    for k, v in meta["cv"].items():
        if k.startswith("kfold"):
            print(f"  {k:<15} {_metrics_line(v)}")
    for src, v in meta["cv"].get("leave_one_source_out", {}).items():
        print(f"  LOSO {src:<10} {_metrics_line(v)}")
    print(f"  prior (default) {_metrics_line(meta['prior_on_data'])}")

    def write(d: Path):
        (d / "overlap").mkdir(exist_ok=True)
        model.save(d / "overlap" / "slowdown.json")
        return ["overlap/slowdown.json"]

    man = profiles.save_component(args.profile, "overlap", {**meta, "file": "overlap/slowdown.json"},
                                  [path], write)
    print(f"saved profile {man['name']} version {man['version']} "
          f"({profiles.profile_dir(args.profile)})")
    return 0


# ---------------------------------------------------------------------------------------------
def cmd_nccl(args) -> int:
    from sim_core import profiles
    from sim_core.calibration import nccl as nccl_fit

    files = _need(args.files)
    notes: dict = {}
    try:
        gpu = nccl_fit.nccl_gpu(files, args.gpu, notes=notes)
        df = nccl_fit.nccl_rows(files, op=args.op, ranks=args.ranks, nodes=args.nodes,
                               notes=notes, gpu=gpu)
    except ValueError as exc:
        raise SweepError(str(exc)) from None
    for path, lines in notes.items():
        for line in lines:
            print(f"{'all logs' if path == '*' else Path(path).name}: {line}")
    net = nccl_fit.base_network(gpu, args.cluster)
    runs = df.groupby(["op", "group", "nodes"]).size()
    print(f"nccl-tests: {len(df)} rows from {len(files)} file(s), GPU {gpu}: "
          + ", ".join(f"{op} {g} ranks/{n} node(s)" for (op, g, n) in runs.index))
    per_file = nccl_fit.nccl_file_fits(df, net)
    print("each log fitted alone, median |error| on its sizes >= 1 MiB:")
    for r in per_file.itertuples():
        print(f"  {r.source:<45} {r.rows_fitted_error:>3} sizes: default "
              f"{_pct(r.median_abs_err_default):>6} -> fitted {_pct(r.median_abs_err_fitted):>6}")
    scales = nccl_fit.fit_nccl_scales(df, net)
    rep = nccl_fit.nccl_fit_report(df, net, scales)
    free = nccl_fit._identifiable(df)
    print("fitted scales (least squares on log time; 1 = catalog value):")
    for s, v in scales.items():
        print(f"  {s:<14} x{v:.3f}" + ("" if s in free else "   (not seen by the data)"))
    print("fit error per collective and size (median |model/measured - 1|):")
    tab = rep.assign(ad=rep["err_default"].abs(), af=rep["err_fitted"].abs()).groupby(
        ["op", "group", "nodes", "size_bucket"], sort=False)[["ad", "af"]].median()
    for (op, g, n, b), r in tab.iterrows():
        print(f"  {op:<15} {g:>3} ranks {n} node(s) {b:<12} default {_pct(r['ad']):>6} "
              f"-> fitted {_pct(r['af']):>6}")
    if args.verbose:
        print(rep.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    loso = nccl_fit.nccl_loso(df, net)
    if len(loso):
        print("leave-one-file-out (fit on the others, error on the held-out file):")
        for r in loso.itertuples():
            extra = f"  [scales not seen in training: {r.unseen_scales}]" if r.unseen_scales else ""
            print(f"  {r.held_out:<45} median {_pct(r.median_abs_err)}, max "
                  f"{_pct(r.max_abs_err)}{extra}")

    def write(d: Path):
        (d / "nccl").mkdir(exist_ok=True)
        rep.to_csv(d / "nccl" / "fit_errors.csv", index=False)
        return ["nccl/fit_errors.csv"]

    info = {"gpu": gpu, "cluster": args.cluster, "network": {k: (bool(v) if k == "nvls" else v)
                                                            for k, v in net.items()},
            "scales": scales, "free_scales": free, "rows": int(len(df)),
            "use_measured": not args.no_measured,
            "curves": {src: {"op": g["op"].iat[0], "group": int(g["group"].iat[0]),
                             "nodes": int(g["nodes"].iat[0])}
                       for src, g in df.groupby("source", sort=False)},
            "median_abs_err_default": float(rep["err_default"].abs().median()),
            "median_abs_err_fitted": float(rep["err_fitted"].abs().median()),
            "loso": loso.to_dict("records")}
    man = profiles.save_component(args.profile, "nccl", info, files, write)
    print(f"saved profile {man['name']} version {man['version']} "
          f"({profiles.profile_dir(args.profile)})")
    return 0


# ---------------------------------------------------------------------------------------------
def _median_abs(x) -> float:
    x = pd.Series(x, dtype=float).dropna()
    return float(x.abs().median()) if len(x) else float("nan")


def _term_line(name: str, fitted, free: bool) -> str:
    """One fitted term with its uncertainty (from the Jacobian at the optimum)."""
    from sim_core.calibration import runs as runs_fit

    kind = runs_fit.spec(name)[0]
    x, sd = fitted.x[name], fitted.sd.get(name, float("nan"))
    prior = runs_fit.spec(name)[1]
    state = "fitted" if free else "at prior"
    if kind == "log":
        unc = f"+-{100 * (np.exp(sd) - 1):.1f}%" if free and np.isfinite(sd) else ""
        return f"  {name:<26} x{np.exp(x):.3f} {unc:<9} [{state}; prior x1 +-{prior:g} log]"
    unit = {"host_step_s": " s", "host_mb_s": " s", "node_c": "/doubling",
            "net_latency_s": " s per call across nodes"}.get(name, " GiB")
    unc = f"+-{sd:.3g}" if free and np.isfinite(sd) else ""
    return (f"  {name:<26} {x:+.4g}{unit} {unc:<9} [{state}; prior "
            f"{runs_fit.prior_mean(name):g} +-{prior:g}]")


def _cv_lines(cal) -> list[str]:
    out = []
    folds = [("up", k) for k in cal.up_folds] + [("cv", k) for k in cal.folds]
    for kind, name in folds:
        b, a = ((cal.up_before[name], cal.up_after[name]) if kind == "up" else
                (cal.cv_before[name], cal.cv_after[name]))
        out.append(f"upward, fit on the smaller {name}s, predict the largest "
                   "(white-box -> calibrated):" if kind == "up" else
                   f"grouped CV, leave one {name} out (white-box -> calibrated):")
        out.append(f"  step time median |error| {_pct(b['step'])} -> {_pct(a['step'])} on "
                   f"{b['timed'] - b['outliers']} runs ({b['outliers']} outliers apart; with them "
                   f"{_pct(b['step_with_outliers'])} -> {_pct(a['step_with_outliers'])}); bias "
                   f"{_pct(b['bias'])} -> {_pct(a['bias'])}")
        if b["mem_runs"]:
            out.append(f"  peak memory median |error| {_pct(b['mem'])} -> {_pct(a['mem'])} "
                       f"({b['mem_runs']} runs with a measured peak)")
        else:
            out.append("  peak memory: no run measured it")
        out.append(f"  OOM verdict accuracy {_pct(b['oom_accuracy'])} -> "
                   f"{_pct(a['oom_accuracy'])} ({b['verdicts']} runs that ran or ran out)")
        if b["spearman_groups"]:
            out.append(f"  Spearman of tokens/s within (model, cluster size), median of "
                       f"{b['spearman_groups']} groups: {b['spearman']:.2f} -> "
                       f"{a['spearman']:.2f}")
        else:
            out.append("  Spearman within (model, cluster size): no group has 3 timed runs")
        cl = "  by cluster size: " + ", ".join(
            f"{c} GPUs {_pct(b['by_cluster'][c])} -> {_pct(a['by_cluster'].get(c))}"
            for c in sorted(b["by_cluster"]))
        out.append(cl)
    return out


def _plot(cal, held, held_pred, out_dir: Path) -> list[Path]:
    """Predicted against measured step time, one panel per cluster size (Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sim_core.calibration import runs as runs_fit

    out_dir.mkdir(parents=True, exist_ok=True)
    d = cal.data
    before = runs_fit.predict_arrays(d, runs_fit.white_box().params)["step_s"]
    fold = next(iter(cal.folds.values()), None)
    after = (runs_fit.cv_predict(d, cal.free, fold)["step_s"] if fold is not None
             else runs_fit.predict_arrays(d, cal.fit.params)["step_s"])
    files = []
    sizes = sorted(np.unique(d.cluster[np.isfinite(d.t_meas)]).astype(int))
    for c in sizes:
        i = (d.cluster == c) & np.isfinite(d.t_meas)
        fig, ax = plt.subplots(figsize=(5, 5))
        ax.scatter(d.t_meas[i], before[i], marker="x", color="#999999", label="white-box")
        ax.scatter(d.t_meas[i], after[i], marker="o", facecolors="none", color="#4c78a8",
                   label="calibrated (grouped CV)")
        o = i & cal.outlier_mask
        if o.any():
            ax.scatter(d.t_meas[o], after[o], marker="o", color="#e45756", label="outlier")
        if held is not None and len(held):
            j = held.cluster == c
            if j.any():
                ax.scatter(held.t_meas[j], held_pred[j], marker="s", color="#f58518",
                           label="held out (--fit)")
        lim = [np.nanmin(np.r_[d.t_meas[i], before[i], after[i]]) * 0.8,
               np.nanmax(np.r_[d.t_meas[i], before[i], after[i]]) * 1.25]
        ax.plot(lim, lim, color="black", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("measured step time (s)")
        ax.set_ylabel("predicted step time (s)")
        ax.set_title(f"{c} GPUs")
        ax.legend(fontsize=7)
        p = out_dir / f"predicted_vs_measured_{c}gpus.png"
        fig.tight_layout()
        fig.savefig(p, dpi=90)
        plt.close(fig)
        files.append(p)
    return files


def _select(frame: pd.DataFrame, expr: str, flag: str, what: str = "the runs") -> pd.Series:
    """The rows a user's pandas expression (`--rows`, `--fit`) selects, as booleans (NaN:
    not selected); an expression that fails is a one-line error naming the flag and the
    columns it could use."""
    try:
        out = frame.eval(expr, engine="python")
        return pd.Series(out, index=frame.index).astype(object).fillna(False).astype(bool)
    except Exception as exc:  # noqa: BLE001 - a user's expression: any error is theirs
        raise SweepError(f"{flag}: cannot evaluate {expr!r} on {what} ({exc}); columns: "
                         f"{', '.join(c for c in frame.columns if not c.startswith('_'))}"
                         ) from None


def cmd_runs(args) -> int:
    from sim_core import profiles
    from sim_core.calibration import residual as residual_fit
    from sim_core.calibration import runs as runs_fit

    path = _need([args.file])[0]
    try:
        runs = runs_fit.load_runs(path, failed_as=args.failed_as)
    except (ValueError, KeyError) as exc:
        raise SweepError(f"{path.name}: {str(exc).splitlines()[0]}") from None

    if args.rows:
        runs = runs[_select(runs, args.rows, "--rows")]
    n_rows = len(runs)
    profiles.deactivate()  # the fit starts from the default models
    try:
        data = runs_fit.prepare(runs)
    except runs_fit.CalibrationError as exc:
        raise SweepError(f"{path.name}: {exc}") from None
    skipped = runs_fit.skip_counts(data.skipped) if len(data.skipped) else {}
    n_failed_oom = int(data.runs["failed_as_oom"].sum()) if "failed_as_oom" in data.runs else 0
    print(f"{path.name}: {n_rows} runs, {len(data)} usable, {sum(skipped.values())} skipped"
          + (f"; {n_failed_oom} failed runs taken as OOM bounds (--failed-as oom)"
             if args.failed_as == "oom" else ""))
    for reason, k in sorted(skipped.items(), key=lambda kv: -kv[1]):
        print(f"  skipped {k:>5}: {reason}")
    if args.verbose:
        for r in data.skipped.itertuples():
            print(f"  run {r.id} ({r.label}): {r.skip}")
    if len(data) == 0:
        why = "; ".join(f"{k} x{v}" for k, v in skipped.items()) or "the table has no rows"
        raise SweepError(f"{path.name}: no usable run ({why})")
    if args.fit:
        mask = _select(data.runs, args.fit, "--fit").to_numpy()
        train, held = data.subset(np.flatnonzero(mask)), data.subset(np.flatnonzero(~mask))
    else:
        train, held = data, None
    if len(train) == 0:
        raise SweepError(f"--fit: {args.fit!r} selects none of the {len(data)} usable runs")
    print(f"fitting on {len(train)} runs ({int(train.oom.sum())} OOM bounds, "
          f"{int(np.isfinite(train.m_meas).sum())} with a measured peak)"
          + (f", {len(held)} held out by --fit" if held is not None else ""))
    tt, mm = runs_fit.candidates(train)
    print("terms the runs can see: " + ", ".join(tt + mm))
    print("grouped CV folds: " + (", ".join(f"leave one {k} out ({len(set(v))} groups)"
                                           for k, v in runs_fit.groupings(train).items())
                                  or "none (fewer than 3 runs)"))
    up = runs_fit.upward(train)
    print("upward folds: " + (", ".join(f"{k} ({int(v.sum())} runs predicted from the others)"
                                        for k, v in up.items()) or "none"))
    missing = runs_fit.upward_cannot_show(train)
    if missing:
        print(f"  the table cannot show the step to {missing}")
    judge = ("upward" if runs_fit.upward_decides(train) else
             "upward and grouped-CV" if up else "grouped-CV")
    print(f"forward selection (a term is freed when it lowers the {judge} error by "
          f"{100 * runs_fit.MIN_GAIN:.1f} points):")
    try:
        cal = runs_fit.calibrate(train, log=print)
    except runs_fit.CalibrationError as exc:
        raise SweepError(f"{path.name}: {exc}") from None
    if cal.accepted:
        print("fitted terms (robust soft-L1 MAP; +- one standard deviation from the Jacobian):")
    elif cal.rejected_by == "extrapolation to a larger model":
        many = len(cal.selected) > 1
        print(f"the term{'s' if many else ''} {', '.join(cal.selected)} lower"
              f"{'' if many else 's'} the grouped-CV error but not the error extrapolated to a "
              "larger model: the white-box model is kept")
    elif cal.rejected_by:
        print(f"the terms {', '.join(cal.selected)} make {cal.rejected_by} worse: the white-box "
              "model is kept")
    else:
        print("no term lowered the error: the white-box model is kept")
    ext = cal.extrapolation
    if ext is not None:
        print(f"extrapolated one model size up (to {ext['size']:.3g} layers x hidden^2; trend of "
              f"the {runs_fit.TREND_SIZES} largest fitted sizes): step error "
              f"{_pct(ext['white_box'])} -> {_pct(ext['calibrated'])} (trend per doubling "
              f"{_pct(ext['trend_white_box'])} -> {_pct(ext['trend_calibrated'])})")
    elif cal.selected:
        k = len(np.unique(runs_fit.model_size(train.runs)))
        print(f"extrapolation to a larger model: not checked (the fitted runs hold {k} model "
              f"size{'s' if k != 1 else ''}; a trend needs {runs_fit.TREND_SIZES})")
    names = list(runs_fit.TIME_TERMS) + list(runs_fit.MEM_TERMS) + [
        n for n in cal.free if n.startswith(runs_fit.FW_PREFIX)]
    for n in names:
        if n in tt + mm or n in cal.free:
            print(_term_line(n, cal.fit, n in cal.free))
    for line in _cv_lines(cal):
        print(line)
    full = runs_fit.predict_arrays(train, cal.fit.params)
    out_i = np.flatnonzero(cal.outlier_mask)
    if len(out_i):
        print(f"outliers no term explains ({len(out_i)}; counted apart above): measured -> "
              "predicted step time")
        for i in out_i[:25]:
            r = train.runs.iloc[i]
            print(f"  run {r['id']} ({r['label']}, {int(r['num_gpus'])} GPUs, tp {int(r['tp'])} "
                  f"pp {int(r['pp'])} zero {int(r['zero'])}): {train.t_meas[i]:.3f} s -> "
                  f"{full['step_s'][i]:.3f} s")
    else:
        print("outliers no term explains: none")
    tw = runs_fit.twins(train)
    if len(tw):
        print(f"twins that disagree ({len(tw)} configurations run more than once, measured "
              f"more than {runs_fit.TWIN_SPREAD:.2f}x apart; all kept in the fit): "
              "measured times")
        for r in tw.head(15).itertuples():
            print(f"  {r.ids} ({r.label}, {r.num_gpus} GPUs, tp {r.tp} pp {r.pp}): {r.times}")
    rcv = runs_fit.residual_cv(cal)
    keep_residual = runs_fit.residual_helps(rcv)
    if rcv is None:
        print("learned residual (XGBoost): not tried (fewer than "
              f"{residual_fit.MIN_RUNS} timed "
              "runs)")
    else:
        for k, v in rcv.items():
            where = (f"{k[len(runs_fit.UP):]} upward" if k.startswith(runs_fit.UP)
                     else f"grouped CV leave one {k} out")
            note = (" -- every test run is outside its range: this fold tests its edge"
                    if v.get("all_flagged") else "")
            print(f"learned residual (XGBoost, scale-free features), {where}: median |step "
                  f"error| {_pct(v['without'])} -> {_pct(v['with'])} ({v['flagged']} runs "
                  f"outside the training range, flagged){note}")
        print("  kept: it lowers the upward error" if keep_residual else
              "  not kept: it does not lower the upward error, or it makes a grouping worse")
    booster = rng = None
    if keep_residual:
        booster, rng = runs_fit._train_residual(train, cal.fit.params)
    summary = {"set": args.name or path.stem, "fit_rows": len(train),
               "held_rows": 0 if held is None else len(held)}
    for k in cal.folds:
        summary[f"cv_{k}_before"] = cal.cv_before[k]["step"]
        summary[f"cv_{k}_after"] = cal.cv_after[k]["step"]
    held_pred = None
    if held is not None and len(held):
        before = runs_fit.predict_arrays(held, runs_fit.white_box().params)
        held_pred_all = runs_fit.predict_arrays(held, cal.fit.params)
        if keep_residual:  # what the profile predicts: the terms and the residual
            held_pred_all["step_s"] = runs_fit._apply_residual(held, cal.fit.params, booster,
                                                               rng)[0]
        held_pred = held_pred_all["step_s"]
        e0 = runs_fit.metrics(held, before)
        e1 = runs_fit.metrics(held, held_pred_all)
        tp_m = runs_fit.throughput_per_gpu(held.runs, held.t_meas)
        rho0 = runs_fit.spearman(runs_fit.throughput_per_gpu(held.runs, before["step_s"]), tp_m)
        rho1 = runs_fit.spearman(runs_fit.throughput_per_gpu(held.runs, held_pred), tp_m)
        print(f"held-out runs ({len(held)}, --fit): step time median |error| "
              f"{_pct(e0['step'])} -> {_pct(e1['step'])}, bias {_pct(e0['bias'])} -> "
              f"{_pct(e1['bias'])}; Spearman of tokens/s/GPU {rho0:.2f} -> {rho1:.2f}")
        if e0["mem_runs"]:
            print(f"  peak memory median |error| {_pct(e0['mem'])} -> {_pct(e1['mem'])}")
        if args.verbose:
            for i in range(len(held)):
                r = held.runs.iloc[i]
                print(f"  {r['id']:>5} {r['label']:<28} {int(r['num_gpus']):>5} GPUs  "
                      f"{held.t_meas[i]:.3f} s: {before['step_s'][i]:.3f} -> "
                      f"{held_pred[i]:.3f} s")
        summary.update(held_before=e0["step"], held_after=e1["step"], rank_before=rho0,
                       rank_after=rho1, mem_before=e0["mem"], mem_after=e1["mem"])
    if args.plot:
        for p in _plot(cal, held, held_pred, Path(args.plot)):
            print(f"wrote {p}")
    if args.markdown:
        print(RUNS_TABLE_HEADER)
        print(_runs_markdown_row(summary))

    cv_after = {k: {m: v for m, v in cal.cv_after[k].items()} for k in cal.folds}
    cv_before = {k: {m: v for m, v in cal.cv_before[k].items()} for k in cal.folds}
    worst = max((cal.cv_after[k]["step"] for k in cal.folds), default=float("nan"))
    if keep_residual:
        worst = max(v["with"] for v in rcv.values())

    def write(d: Path):
        (d / "runs").mkdir(exist_ok=True)
        tab = train.runs[["id", "label", "num_gpus", "status"]].assign(
            measured_step_s=train.t_meas, predicted_step_s=full["step_s"],
            measured_mem_gib=train.m_meas, predicted_mem_gib=full["mem_gib"],
            outlier=cal.outlier_mask)
        tab.to_csv(d / "runs" / "fit.csv", index=False)
        files = ["runs/fit.csv"]
        if keep_residual:
            residual_fit.save(booster, d / "runs" / "residual.json")
            files.append("runs/residual.json")
        return files

    info = {"terms": cal.fit.params, "free": cal.free,
            "sd": {k: float(v) for k, v in cal.fit.sd.items()}, "accepted": cal.accepted,
            "rows": int(len(train)), "skipped": {k: int(v) for k, v in skipped.items()},
            "failed_as": args.failed_as or "unknown",
            "selection": {"rows": args.rows, "fit": args.fit, "failed_as": args.failed_as},
            "cv_before": cv_before, "cv_after": cv_after, "cv_step_error": worst,
            "selection_trail": cal.trail, "outliers": int(cal.outlier_mask.sum()),
            "interval": runs_fit.interval(cal, rcv if keep_residual else None),
            "residual_cv": rcv, "selected": cal.selected, "rejected_by": cal.rejected_by,
            "size_extrapolation": cal.extrapolation}
    if keep_residual:
        info["residual"] = {"file": "runs/residual.json", "range": rng,
                            "params": residual_fit.PARAMS}
    man = profiles.save_component(args.profile, "runs", info, [path], write)
    print(f"saved profile {man['name']} version {man['version']} "
          f"({profiles.profile_dir(args.profile)})"
          + ("" if cal.accepted else ": no term kept")
          + (" + learned residual" if keep_residual else
             ("" if cal.accepted else " (the white-box model)")))
    return 0


def cmd_rl_runs(args) -> int:
    """One scale per RL phase fitted on the user's RL run table (sim_core/calibration/
    rl_phases.py), with leave-one-group-out CV next to the in-sample fit, saved in a profile."""
    from sim_core import profiles
    from sim_core.accuracy import rl, rl_table
    from sim_core.calibration import rl_phases

    path = _need([args.file])[0]
    profiles.profile_dir(args.profile)  # a bad name fails before the fit
    try:
        t = rl.load(path)
    except ValueError as exc:
        raise SweepError(f"{path.name}: {str(exc).splitlines()[0]}") from None
    n_all = len(t)
    if args.rows:
        norm, _, _ = rl_table.normalize(t)
        frame = norm.assign(**{c: t[c] for c in t.columns if c not in norm.columns})
        keep = _select(frame, args.rows, "--rows", "the RL table")
        t = t[keep.to_numpy()].reset_index(drop=True)
        if len(t) == 0:
            raise SweepError(f"--rows: {args.rows!r} selects none of the {n_all} rows")
    profiles.deactivate()  # the fit starts from the white-box model
    try:
        d = rl_phases.prepare(t, args.group)
        cal = rl_phases.calibrate(d, min_rows=args.min_rows)
    except rl_phases.RLCalibrationError as exc:
        raise SweepError(f"{path.name}: {exc}") from None
    group = args.group or "source"
    timed = np.isfinite(cal.errors("before"))
    print(f"{path.name}: {n_all} rows" + (f", {len(t)} selected by --rows" if args.rows else "")
          + f"; {int(d.priced.sum())} priced, {int(timed.sum())} with a measured step; "
          f"{len(cal.by_group())} {group} groups")
    for i in np.flatnonzero(~d.priced):
        print(f"  row {i}: not priced: {d.cmp.skipped.iloc[i]}")
    print("per-phase scale, measured / predicted (exp of the median log ratio over the rows "
          f"that state the phase; under {args.min_rows} rows: 1.0); range over the CV folds:")
    for ph, v in cal.scales.items():
        fold = [f[ph] for f in cal.fold_scales.values()]
        note = (f"  folds x{min(fold):.3f}-x{max(fold):.3f}" if cal.rows[ph] >= args.min_rows
                else "  (kept: too few rows)")
        print(f"  {ph:<12} x{v:.3f}  {cal.rows[ph]:>4} rows{note}")
    print(f"median |step error| over {int(timed.sum())} timed rows (white-box -> calibrated):")
    print(f"  {'in-sample':<26} {_pct(cal.median_abs('before'))} -> "
          f"{_pct(cal.median_abs('in_sample'))}")
    print(f"  {'leave one ' + group + ' out':<26} {_pct(cal.median_abs('before'))} -> "
          f"{_pct(cal.median_abs('cv'))}  (each {group}'s rows predicted with the scales "
          "fitted on the others)")
    print("median |phase error| over the rows that state it (white-box -> in-sample -> "
          f"leave one {group} out):")
    for ph, e in cal.phase_errors().items():
        print(f"  {ph:<12} {e['rows']:>4} rows  {_pct(e['before'])} -> {_pct(e['in_sample'])} "
              f"-> {_pct(e['cv'])}")
    if not cal.median_abs("cv") < cal.median_abs("before"):
        print(f"warning: the scales do not lower the step error of a {group} left out "
              f"({_pct(cal.median_abs('before'))} -> {_pct(cal.median_abs('cv'))}): the rows' "
              "phases disagree across groups (several frameworks or clusters?); --rows can "
              "select one (e.g. \"rl_framework == 'nemo_rl'\")")
    print(f"by {group} (rows: white-box -> left out):")
    for r in cal.by_group().itertuples():
        print(f"  {str(r.group)[:60]:<60} {r.rows:>3}: {_pct(r.before)} -> {_pct(r.cv_after)}")
    info = cal.component(group)
    if args.rows:
        info["selection"] = {"rows": args.rows}

    def write(d_: Path):
        return []

    man = profiles.save_component(args.profile, "rl_phases", info, [path], write)
    print(f"saved to profile {man['name']} version {man['version']} "
          f"({profiles.profile_dir(args.profile)}); use it with `sweep validate --rl --profile "
          f"{args.profile}` and `sweep search SPACE --profile {args.profile}` (RL spaces)")
    return 0


def cmd_learning_curve(args) -> int:
    """Error against the number of calibration runs (docs/calibration.md)."""
    from sim_core.calibration import runs as runs_fit

    rows = []
    for f in _need(args.files):
        try:
            data = runs_fit.prepare(runs_fit.load_runs(f, failed_as=args.failed_as))
        except (ValueError, KeyError) as exc:
            raise SweepError(f"{f.name}: {str(exc).splitlines()[0]}") from None
        sizes = [int(s) for s in args.sizes.split(",")]
        lc = runs_fit.learning_curve(data, sizes, repeats=args.repeats)
        for r in lc.itertuples():
            rows.append((f.stem, len(data), r.runs, r.white_box, r.calibrated))
    print("| table | usable runs | calibration runs | white-box | calibrated |")
    print("|---|---:|---:|---:|---:|")
    for t, n, k, wb, c in rows:
        print(f"| {t} | {n} | {k} | {_pct(wb)} | {_pct(c)} |")
    return 0


RUNS_TABLE_HEADER = ("| runs | fitted on | held out (--fit) | grouped CV, leave one model out | "
                     "grouped CV, leave one cluster size out | held out: median abs err | "
                     "held out: rank (Spearman) |\n|---|---:|---:|---:|---:|---:|---:|")


def _runs_markdown_row(s: dict) -> str:
    def pair(a, b, pct=True):
        f = _pct if pct else (lambda v: "-" if v is None or np.isnan(v) else f"{v:.2f}")
        return f"{f(a)} -> {f(b)}"

    nan = float("nan")
    return (f"| {s['set']} | {s['fit_rows']} | {s['held_rows']} | "
            f"{pair(s.get('cv_model_before', nan), s.get('cv_model_after', nan))} | "
            f"{pair(s.get('cv_cluster size_before', nan), s.get('cv_cluster size_after', nan))} | "
            f"{pair(s.get('held_before', nan), s.get('held_after', nan))} | "
            f"{pair(s.get('rank_before', nan), s.get('rank_after', nan), pct=False)} |")


def cmd_show(args) -> int:
    from sim_core import profiles

    print(profiles.describe(args.name))
    bad = profiles.verify(args.name)
    if bad:
        print(f"WARNING: input copies changed since fitting: {', '.join(bad)}")
    return 0


def cmd_list(args) -> int:
    from sim_core import profiles

    names = profiles.list_profiles()
    print(f"profiles in {profiles.root()}: " + (", ".join(names) if names else "none"))
    return 0


def add_args(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="calibrate_command", metavar="WHAT")
    sub.required = True

    def add(name, help, fn):
        q = sub.add_parser(name, help=help, description=help)
        q.set_defaults(_calibrate=fn)
        return q

    q = add("compute", "train XGBoost kernel-efficiency models per GPU and op class", cmd_compute)
    q.add_argument("files", nargs="+", help="kernel tables (CSV, nsys kern-sum CSV, torch trace)")
    q.add_argument("--gpu", help="GPU of the rows (required for profiler exports); filters tables")
    q.add_argument("--format", default="auto", choices=["auto", "csv", "nsys", "torch"])
    q.add_argument("--folds", type=int, default=5, help="k of the k-fold CV (default 5)")
    q.add_argument("--rounds", type=int, default=300, help="boosting rounds (default 300)")
    q.add_argument("--attention-kernel", help="keep the attention rows of this kernel (the "
                   "`kernel` column of a measured table: cudnn or flash)")
    q.add_argument("--profile", required=True, help="profile name or folder")

    q = add("inspect", "show what the loaders extract from kernel tables, nsys summaries and "
            "PyTorch profiler traces (no fitting)", cmd_inspect)
    q.add_argument("files", nargs="+", help="kernel tables, nsys stats output, torch traces")
    q.add_argument("--gpu", help="GPU of rows whose file does not name one")
    q.add_argument("--format", default="auto", choices=["auto", "csv", "nsys", "torch"])
    q.add_argument("--csv", help="also write the extracted rows to this CSV")

    q = add("overlap", "train the Echo overlap-slowdown model", cmd_overlap)
    q.add_argument("table", help="CSV: kernel times alone and with overlapping communication")
    q.add_argument("--rounds", type=int, default=100, help="trees (default 100, XGBRegressor's)")
    q.add_argument("--profile", required=True, help="profile name or folder")

    q = add("nccl", "fit the NCCL model's cluster scales to nccl-tests outputs", cmd_nccl)
    q.add_argument("files", nargs="+", help="nccl-tests stdout files (all_reduce_perf etc.)")
    q.add_argument("--gpu", help="GPU (default: from the device names in the output header)")
    q.add_argument("--op", help="collective, where the log cannot tell (all_reduce, all_gather, "
                   "reduce_scatter, alltoall, broadcast, sendrecv)")
    q.add_argument("--ranks", type=int, help="number of ranks, where the log cannot tell")
    q.add_argument("--nodes", type=int, help="number of nodes, where the log cannot tell")
    q.add_argument("--cluster", help="catalog cluster for NIC count/bandwidth and latencies "
                                     "(default: the GPU's default cluster)")
    q.add_argument("--no-measured", action="store_true",
                   help="do not use the measured curves as an override, only the fitted scales")
    q.add_argument("--verbose", action="store_true", help="print every row's fit error")
    q.add_argument("--profile", required=True, help="profile name or folder")

    q = add("runs", "fit the terms of the step time (compute, exposed communication, "
            "pipeline, host overhead, node-count slowdown, memory) to your own training runs, "
            "chosen by grouped cross-validation", cmd_runs)
    q.add_argument("file", help="runs CSV in the published_runs format, optional status column "
                                "(ok | oom | failed)")
    q.add_argument("--fit", help="pandas expression selecting the runs to fit on (the others are "
                                 "held out and predicted before/after), e.g. \"params_b < 10\"")
    q.add_argument("--rows", help="pandas expression selecting the runs to use at all, e.g. "
                                  "\"framework == 'nemo'\"")
    q.add_argument("--failed-as", choices=["unknown", "oom"], default=None,
                   help="what a `failed` run means: unknown cause (default: left out) or out "
                        "of memory (an OOM bound)")
    q.add_argument("--plot", metavar="DIR", help="write predicted against measured step time, "
                                                 "one PNG per cluster size")
    q.add_argument("--name", help="label of this set in --markdown output")
    q.add_argument("--markdown", action="store_true", help="also print a README table row")
    q.add_argument("--verbose", action="store_true", help="print every skipped and held-out run")
    q.add_argument("--profile", required=True, help="profile name or folder")

    q = add("rl-runs", "fit one scale per RL phase (generation, log-probs, update, weight "
            "sync) to your own RL run table, with leave-one-group-out CV", cmd_rl_runs)
    q.add_argument("file", help="RL run table CSV (the columns of sim_core/data/rl/rl_runs.csv; "
                                "docs/rl.md)")
    q.add_argument("--group", help="column whose values are the CV groups (default: source)")
    q.add_argument("--rows", help="pandas expression selecting the rows to use, e.g. "
                                  "\"rl_framework == 'nemo_rl'\"")
    q.add_argument("--min-rows", type=int, default=3,
                   help="rows that must state a phase before it gets a scale (default 3)")
    q.add_argument("--profile", required=True, help="profile name or folder")

    q = add("learning-curve", "step-time error on unseen runs against the number of "
            "calibration runs (random subsets, terms chosen by CV inside each)",
            cmd_learning_curve)
    q.add_argument("files", nargs="+", help="runs CSVs (published_runs format)")
    q.add_argument("--sizes", default="3,5,8,12,20", help="numbers of calibration runs")
    q.add_argument("--repeats", type=int, default=5, help="random subsets per size")
    q.add_argument("--failed-as", choices=["unknown", "oom"], default=None)

    q = add("show", "print a profile: version, data hashes, CV metrics", cmd_show)
    q.add_argument("name", help="profile name or folder")
    add("list", "list saved profiles", cmd_list)


def run(args) -> int:
    from sim_core.calibration.rl_phases import RLCalibrationError
    from sim_core.calibration.runs import CalibrationError
    from sim_core.profiles import ProfileError

    try:
        return args._calibrate(args)
    except (ProfileError, CalibrationError, RLCalibrationError) as exc:
        raise SweepError(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
