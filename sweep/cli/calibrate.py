"""`sweep calibrate`: fit the simulator's optional learned parts to measurements and save them as
a named profile that `sweep simulate` / `sweep search` accept (`--profile NAME`).

    sweep calibrate compute KERNELS.csv [MORE...] [--gpu h100-sxm] --profile NAME
    sweep calibrate overlap TABLE.csv --profile NAME
    sweep calibrate nccl all_reduce_perf.txt [MORE...] [--gpu h100-sxm] --profile NAME
    sweep calibrate inspect TRACE.json.gz|nsys_stats.txt [MORE...]
    sweep calibrate runs RUNS.csv [--fit EXPR] --profile NAME
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


def cmd_runs(args) -> int:
    from sim_core import profiles
    from sim_core.calibration import runs as runs_fit

    path = _need([args.file])[0]
    try:
        runs = runs_fit.load_runs(path)
    except ValueError as exc:
        raise SweepError(f"{path.name}: {exc}") from None

    def select(frame: pd.DataFrame, expr: str, flag: str) -> pd.Series:
        try:
            out = frame.eval(expr, engine="python")
            return pd.Series(out, index=frame.index).astype(object).fillna(False).astype(bool)
        except Exception as exc:  # noqa: BLE001 - a user's expression: any error is theirs
            raise SweepError(f"{flag}: cannot evaluate {expr!r} on the runs ({exc}); columns: "
                             f"{', '.join(c for c in frame.columns if not c.startswith('_'))}"
                             ) from None

    if args.rows:
        runs = runs[select(runs, args.rows, "--rows")]
    for r in runs[runs["skip"] != ""].itertuples():
        print(f"run {r.id} ({r.label}): skipped: {r.skip}")
    use = runs[runs["skip"] == ""]
    if args.fit:
        mask = select(use, args.fit, "--fit")
        train, held = use[mask], use[~mask]
    else:
        train, held = use, use.iloc[0:0]
    if len(train) == 0:
        raise SweepError("no usable run to fit on (each skipped run's reason is above)")
    free = runs_fit.free_parameters(train)
    print(f"runs: {len(train)} to fit on ({int((train['status'] == 'oom').sum())} OOM), "
          f"{len(held)} held out; free scales: "
          + ", ".join(f"{n}[{g}]" if g else n for n, g in free))
    scales = runs_fit.fit(train, free)
    print("fitted (1 / +0 = the white-box model; prior sigma in brackets):")
    sd = scales.to_dict()
    for n, g in free:
        v = sd[n][g] if g else sd[n]
        unit = " GiB" if n == "mem_fixed_gib" else ""
        print(f"  {(n + '[' + g + ']') if g else n:<26} {'+' if n == 'mem_fixed_gib' else 'x'}"
              f"{v:.3f}{unit}   [{runs_fit.PRIOR_SIGMA[n]}]")
    loro = runs_fit.leave_one_run_out(train, scales)
    print("leave-one-run-out on the fitted runs (each predicted by a fit on the others):")
    print(f"  step time median |error| {_pct(_median_abs(loro['step_error_before']))} (white-box) "
          f"-> {_pct(_median_abs(loro['step_error_after']))}")
    if loro["mem_error_before"].notna().any():
        print(f"  peak memory median |error| {_pct(_median_abs(loro['mem_error_before']))} -> "
              f"{_pct(_median_abs(loro['mem_error_after']))}")
    oom = loro["status"] == "oom"
    if oom.any():
        print(f"  OOM runs predicted not to fit: {int((~loro.loc[oom, 'fits_before']).sum())}"
              f"/{int(oom.sum())} -> {int((~loro.loc[oom, 'fits_after']).sum())}/{int(oom.sum())}")
    summary = {"set": args.name or path.stem, "fit_rows": len(train), "held_rows": len(held),
               "loro_before": _median_abs(loro["step_error_before"]),
               "loro_after": _median_abs(loro["step_error_after"])}
    if len(held):
        before = runs_fit.predict(held)
        after = runs_fit.predict(held, scales)
        e0 = runs_fit.errors(held, before)
        e1 = runs_fit.errors(held, after)
        meas = held["measured_step_s"].to_numpy(float)
        tp_m = runs_fit.throughput_per_gpu(held, meas)
        rho0 = runs_fit.spearman(runs_fit.throughput_per_gpu(held, before["step_s"]), tp_m)
        rho1 = runs_fit.spearman(runs_fit.throughput_per_gpu(held, after["step_s"]), tp_m)
        print(f"held-out runs ({len(held)}): step time median |error| "
              f"{_pct(_median_abs(e0['step_error']))} -> {_pct(_median_abs(e1['step_error']))}, "
              f"bias {_pct(e0['step_error'].median())} -> {_pct(e1['step_error'].median())}; "
              f"rank (Spearman of tokens/s/GPU) {rho0:.2f} -> {rho1:.2f}")
        if e0["mem_error"].notna().any():
            print(f"  peak memory median |error| {_pct(_median_abs(e0['mem_error']))} -> "
                  f"{_pct(_median_abs(e1['mem_error']))} ({int(e0['mem_error'].notna().sum())} "
                  "runs with a measured peak)")
        if args.verbose:
            for i, r in enumerate(held.itertuples()):
                print(f"  {r.id:>5} {r.label:<28} {r.gpu:<10} {int(r.num_gpus):>5} GPUs  "
                      f"{_pct(e0['step_error'].iat[i]):>7} -> {_pct(e1['step_error'].iat[i]):>7}"
                      + (f"   memory {_pct(e0['mem_error'].iat[i]):>7} -> "
                         f"{_pct(e1['mem_error'].iat[i]):>7}"
                         if np.isfinite(e0["mem_error"].iat[i]) else ""))
        summary.update(held_before=_median_abs(e0["step_error"]),
                       held_after=_median_abs(e1["step_error"]),
                       bias_before=float(e0["step_error"].median()),
                       bias_after=float(e1["step_error"].median()), rank_before=rho0,
                       rank_after=rho1, mem_before=_median_abs(e0["mem_error"]),
                       mem_after=_median_abs(e1["mem_error"]))
    if args.markdown:
        print(RUNS_TABLE_HEADER)
        print(_runs_markdown_row(summary))

    def write(d: Path):
        (d / "runs").mkdir(exist_ok=True)
        loro.to_csv(d / "runs" / "leave_one_run_out.csv", index=False)
        return ["runs/leave_one_run_out.csv"]

    info = {"scales": scales.to_dict(), "free": [[n, g] for n, g in free],
            "prior_sigma": runs_fit.PRIOR_SIGMA, "rows": int(len(train)),
            "selection": {"rows": args.rows, "fit": args.fit},
            "loro_step_before": summary["loro_before"],
            "loro_step_after": summary["loro_after"]}
    man = profiles.save_component(args.profile, "runs", info, [path], write)
    print(f"saved profile {man['name']} version {man['version']} "
          f"({profiles.profile_dir(args.profile)})")
    return 0


RUNS_TABLE_HEADER = ("| runs | fitted on | held out | leave-one-run-out (fitted runs) | "
                     "held out: median abs err | held out: bias | held out: rank (Spearman) | "
                     "held out: peak memory |\n|---|---:|---:|---:|---:|---:|---:|---:|")


def _runs_markdown_row(s: dict) -> str:
    def pair(a, b, pct=True):
        f = _pct if pct else (lambda v: "-" if v is None or np.isnan(v) else f"{v:.2f}")
        return f"{f(a)} -> {f(b)}"

    return (f"| {s['set']} | {s['fit_rows']} | {s['held_rows']} | "
            f"{pair(s['loro_before'], s['loro_after'])} | "
            f"{pair(s.get('held_before', np.nan), s.get('held_after', np.nan))} | "
            f"{pair(s.get('bias_before', np.nan), s.get('bias_after', np.nan))} | "
            f"{pair(s.get('rank_before', np.nan), s.get('rank_after', np.nan), pct=False)} | "
            f"{pair(s.get('mem_before', np.nan), s.get('mem_after', np.nan))} |")


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

    q = add("runs", "fit a few interpretable scales (compute per GPU, network tiers, memory "
            "overhead) to your own training runs, with priors", cmd_runs)
    q.add_argument("file", help="runs CSV in the published_runs format, optional status column "
                                "(ok | oom | failed)")
    q.add_argument("--fit", help="pandas expression selecting the runs to fit on (the others are "
                                 "held out and predicted before/after), e.g. \"label in "
                                 "['MPT-1B','MPT-3B','MPT-7B']\"")
    q.add_argument("--rows", help="pandas expression selecting the runs to use at all, e.g. "
                                  "\"framework.str.contains('llm-foundry')\"")
    q.add_argument("--name", help="label of this set in --markdown output")
    q.add_argument("--markdown", action="store_true", help="also print a README table row")
    q.add_argument("--verbose", action="store_true", help="print every held-out run's error")
    q.add_argument("--profile", required=True, help="profile name or folder")

    q = add("show", "print a profile: version, data hashes, CV metrics", cmd_show)
    q.add_argument("name", help="profile name or folder")
    add("list", "list saved profiles", cmd_list)


def run(args) -> int:
    from sim_core.profiles import ProfileError

    try:
        return args._calibrate(args)
    except ProfileError as exc:
        raise SweepError(str(exc)) from None
