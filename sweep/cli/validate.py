"""`sweep validate [DATASET.csv]`: the simulator against published, measured runs
(sim_core/accuracy/published.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from sim_core.accuracy.published import (SUBSETS, TABLE_COLUMNS, bucket_medians, compare,
                                         held_out_medians, load_dataset, loso_table,
                                         markdown_summary, model_family, plot, summarize)

NAME = "validate"
HELP = "compare the simulator with published measured runs"


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("dataset", nargs="?", default=None,
                   help="CSV in the published_runs format (default: the shipped dataset)")
    p.add_argument("--out", default=None,
                   help="folder for validation.csv and validation.png (default: print only)")
    p.add_argument("--subset", choices=sorted(SUBSETS), default="all",
                   help="dense: A100/H100 dense rows; moe: MoE rows; long-context: sequence "
                        ">= 32k or context parallel; blackwell-dense: B200/GB200 dense rows "
                        "(no constant fitted on them); all (default)")
    p.add_argument("--dense-only", action="store_true", help="same as --subset dense")
    p.add_argument("--loso", action="store_true",
                   help="also refit the fitted constants leaving each source family out and "
                        "print the held-out error (about 20 s)")
    p.add_argument("--rl", action="store_true",
                   help="RL post-training runs (sim_core/data/rl/rl_runs.csv or DATASET with "
                        "its columns; docs/rl.md): step time and generation share")
    p.add_argument("--rl-memory", nargs="?", const="", default=None, metavar="FILE",
                   help="RL memory verdicts against published out-of-memory reports "
                        "(sim_core/data/rl/rl_memory.csv, or FILE / DATASET with its columns "
                        "plus outcome and oom_phase; docs/rl.md): per row the stated outcome "
                        "against the predicted fits / oom_reason, false fits counted")
    p.add_argument("--profile", default=None,
                   help="with --rl: a calibration profile whose RL phase scales (`sweep "
                        "calibrate rl-runs`) the predictions use")
    p.add_argument("--markdown", action="store_true",
                   help="print only the accuracy summary as a Markdown table (for the README; "
                        "with --loso it has the held-out column)")


def run(args) -> int:
    from sim_core.accuracy import fit, validation

    if getattr(args, "rl_memory", None) is not None:
        return run_rl_memory(args)
    if args.rl:
        return run_rl(args)
    if getattr(args, "profile", None):
        from ..errors import SweepError

        raise SweepError("--profile: only with --rl (a pre-training profile reports its own "
                         "grouped CV: sweep calibrate runs / show)")

    data = load_dataset(args.dataset)
    skipped = data[data["skip"] != ""]
    table = compare(data)
    if args.markdown:
        print(markdown_summary(table, held_out_medians() if args.loso else None))
        return 0
    subset = "dense" if args.dense_only else args.subset
    table = table[SUBSETS[subset](table)]
    pd.set_option("display.width", 250)
    shown = table[TABLE_COLUMNS].copy()
    shown["label"] = shown["label"].str.slice(0, 22)
    print(shown.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    print(f"\nskipped {len(skipped)} rows: "
          + "; ".join(f"{r} ({n})" for r, n in skipped["skip"].value_counts().items()))
    if args.dataset:  # a user's file: say why each row was skipped
        for _, r in skipped.iterrows():
            print(f"  row {r['id']} ({r['label']}): {r['skip']}")
    unexplained = table[table["no_error_because"] != ""]
    for _, r in unexplained.iterrows():
        print(f"  row {r['id']} ({r['label']}): no step-time error: {r['no_error_because']}")
    mem = table[table["mem_error"].notna()]
    if len(mem):
        print(f"\npeak memory: {len(mem)} rows, median |error| {mem['mem_error'].abs().median():.1%}"
              f", bias {mem['mem_error'].median():+.1%}")
    print("\nby source family:")
    print(summarize(table, "family").to_string(float_format=lambda x: f"{x:.3f}"))
    print("\nby GPU:")
    print(summarize(table, "gpu").to_string(float_format=lambda x: f"{x:.3f}"))
    print("\nby model family:")
    table = table.assign(model_family=table["label"].map(model_family))
    print(summarize(table, "model_family").to_string(float_format=lambda x: f"{x:.3f}"))
    for title, frame in bucket_medians(table).items():
        print(f"\nby {title} (signed median: predicted / measured - 1, + = predicted too slow):")
        print(frame.to_string(index=False, formatters={
            "signed_median": "{:+.3f}".format, "median_abs_err": "{:.3f}".format}))
    if args.loso:
        print("\nfitted constants, leave-one-source-out (refit without the family, error on it; "
              "median_ci90: the 90% bootstrap interval of the median over the family's rows):")
        print(loso_table().to_string(index=False, float_format=lambda x: f"{x:.3f}"))
        if subset == "moe":  # the MoE fit (sim_core.accuracy.fit --moe), held out model by model
            print("\nMoE fitted constants, leave-one-model-out (H100 MoE rows):")
            rows = fit.moe_rows()
            print(fit.leave_one_source_out(rows.assign(model_id=rows["model"]), by="model_id",
                                           params=fit.FITTED_MOE)
                  .to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    print("\nunstated fields were filled as follows:")
    for field, rule in validation.IMPUTATION.items():
        print(f"  {field}: {rule}")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        table.to_csv(out / "validation.csv", index=False)
        plot(table, out / "validation.png")
        print(f"\nwrote {out / 'validation.csv'} and {out / 'validation.png'}")
    return 0



def _shipped_fit(t):
    """The shipped NeMo RL scales' fit on this table's NeMo RL rows (in-sample and leaving
    each source out: sim_core/calibration/rl_defaults.py); None when it has none."""
    from sim_core.calibration import rl_defaults, rl_phases

    try:
        return rl_defaults.fit(t)
    except rl_phases.RLCalibrationError:
        return None


def run_rl(args) -> int:
    """`sweep validate --rl`: the RL model on published RL steps (sim_core/accuracy/rl.py)."""
    from sim_core import profiles
    from sim_core.accuracy import rl

    t = rl.load(args.dataset)
    profile = getattr(args, "profile", None)
    if profile:
        man = profiles.activate(profile)
        lines = profiles.rl_phases_summary(man)
        print(f"calibration profile {man['name']} version {man.get('version')}: "
              + ("\n".join(lines) if lines else "no rl_phases component (fit one with `sweep "
                 "calibrate rl-runs`): the RL phases stay white-box"))
    try:
        cmp = rl.compare(t)
    finally:
        if profile:
            profiles.deactivate()
    pd.set_option("display.width", 250)
    cols = ["model", "gpu", "num_gpus", "placement", "policy_mode", "step_time_s",
            "pred_step_s", "pred_fixed_s", "step_err", "gen_share", "pred_gen_share", "fits"]
    print(cmp[cols].to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    for i, r in cmp.iterrows():
        note = (r["skipped"] and f"not predicted: {r['skipped']}") or "; ".join(
            x for x in (r["imputed"] and f"imputed {r['imputed']}", r["oom_reason"],
                        r["invalid_reason"] and f"invalid: {r['invalid_reason']}") if x)
        if note or r["step_err"] != r["step_err"]:
            print(f"  row {i}: {note or 'no measured step time'}")
    s = rl.summary(cmp)
    share = s["median_abs_gen_share_pts"]
    shipped = None if profile else _shipped_fit(t)
    fitted_share = ""
    if profile:
        fitted = ("with the profile's phase scales (in-sample where the profile was fitted on "
                  "these rows; `sweep calibrate rl-runs` prints its leave-one-group-out error)")
    elif shipped is None:
        fitted = "nothing fitted on them: leave-one-source-out = in-sample"
    else:
        fitted = (f"NeMo RL's log-prob and update scales fitted on its {shipped['rows']} rows, "
                  f"in-sample; {shipped['left_out']:.1%} leaving each NeMo RL source out, "
                  "python -m sim_core.calibration.rl_defaults")
    if shipped is not None and shipped["gen_share_left_out_pts"] is not None:
        fitted_share = f"; {shipped['gen_share_left_out_pts']:.1f} left out"
    else:
        fitted_share = ""
    err = (f"median |step error| {s['median_abs_step_err']:.1%} ({fitted})"
           if s["rows"] else "no measured step to compare")
    print(f"\n{s['rows']} rows predicted ({s['skipped']} skipped): {err}; generation share "
          + (f"median |error| {share:.1f} points over {s['gen_share_rows']} sync rows"
             f"{fitted_share}" if share is not None else "not measured"))
    if s["priced"] > s["rows"]:
        print(f"{s['priced']} rows priced in all ({s['priced_fit']} fit in memory), "
              f"{s['priced'] - s['rows']} without a measured step")
    for src, e in s["by_source"].items():
        out = shipped and shipped["by_source"].get(src)
        print(f"  source {src}: median |step error| {e:.1%}"
              + (f" ({out[2]:.1%} left out of the NeMo RL fit)" if out else ""))
    for name, ph in s["phases"].items():
        print(f"  phase {name}: predicted / measured median {ph['median_ratio']:.2f} "
              f"(|error| {ph['median_abs_err']:.1%}) over {ph['rows']} rows that state it")
    for r in s["ranking"]:
        print(f"  colocated vs split, {r['model']} on {r['num_gpus']} GPUs ({r['source']}): "
              f"measured {r['measured_faster']} faster, predicted {r['predicted_faster']}")
    if not s["ranking"]:
        print("  colocated vs split: no source measured both")
    for r in s["mode_ranking"]:
        right = (r["measured_speedup"] > 1) == (r["predicted_speedup"] > 1)
        print(f"  sync vs {r['mode']}, {r['model']} on {r['num_gpus']} GPUs {r['placement']}, "
              f"batch {r['batch']} ({r['source']}): sync/async step measured "
              f"{r['measured_speedup']:.2f}x, predicted {r['predicted_speedup']:.2f}x "
              f"({'ranked right' if right else 'ranked WRONG'})")
    if not s["mode_ranking"]:
        print("  sync vs async: no source measured both on one batch")
    return 0


def run_rl_memory(args) -> int:
    """`sweep validate --rl-memory [FILE]`: the RL memory verdict against published OOM and
    fitting runs (sim_core/accuracy/rl_memory.py)."""
    from sim_core.accuracy import rl_memory

    t = rl_memory.load(args.rl_memory or args.dataset or None)
    cmp = rl_memory.compare(t)
    pd.set_option("display.width", 250)
    shown = cmp[["model", "gpu", "num_gpus", "outcome", "predicted", "verdict", "oom_phase",
                 "pred_phase"]].copy()
    shown["model"] = shown["model"].astype(str).str.slice(0, 32)
    print(shown.to_string(float_format=lambda x: f"{x:.0f}"))
    for i, r in cmp.iterrows():
        said = r["oom_reason"] or r["why"] or "fits"
        peaks = ("" if r["hbm_gib"] != r["hbm_gib"] else
                 f" (peaks: generation {r['pred_rollout_peak_gib']:.1f}, training "
                 f"{r['pred_train_peak_gib']:.1f} of {r['hbm_gib']:.1f} GiB)")
        print(f"  row {i} ({r['source']}): stated {r['outcome']}"
              + (f" in {r['oom_phase']}" if r["oom_phase"] else "")
              + f"; predicted: {said}{peaks}")
    s = rl_memory.summary(cmp)
    print(f"\n{s['rows']} rows ({s['oom_rows']} oom, {s['fits_rows']} fits), {s['predicted']} "
          f"predicted: {s['right']} verdicts right, {s['false_fits']} false fits (an OOM "
          f"predicted to fit), {s['false_ooms']} false OOMs, {s['not_predicted']} not predicted; "
          f"stated phase matched by the predicted OOM's in {s['phase_agrees']} of "
          f"{s['phase_compared']} rows that have both")
    return 0
