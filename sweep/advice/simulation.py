"""One configuration's prediction as `sweep simulate` shows it: its simulated row (with costs),
the JSON report and the text table. Used by the CLI, the Python API and the step trace."""

from __future__ import annotations

import math

from ..errors import SweepError


def plain_value(v):
    """A JSON-safe Python scalar: numpy scalars unwrapped, NaN/inf as None."""
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def simulate_rows(cfg, simulate=None):
    """One run configuration -> (its simulated row as a one-row DataFrame with costs, the
    Space it came from); a one-line SweepError when the configuration is invalid."""
    from ..engine.evaluate import evaluate
    from ..results import add_costs
    from ..engine.space import Space

    space = Space.from_config(cfg)
    row_df = evaluate(space.frame(0, 1), simulate)
    row_df = add_costs(row_df, space.prices())
    if row_df["status"].iloc[0] == "invalid":
        raise SweepError(f"{cfg_name(cfg)}: configuration is invalid: "
                         f"{row_df['invalid_reason'].iloc[0]}")
    return row_df, space


def simulate_run(cfg, simulate=None) -> dict:
    """One configuration -> the JSON-able report of `sweep simulate`."""
    row_df, space = simulate_rows(cfg, simulate)
    return report_of(row_df, space)


def report_of(row_df, space) -> dict:
    """The JSON-able report of `sweep simulate` for a one-row simulated frame."""
    row = {k: plain_value(v) for k, v in row_df.iloc[0].to_dict().items()}
    from sim_core.frameworks import profile_fields

    config_keys = [c for c in row_df.columns
                   if (c in space.fixed or c in profile_fields() or c == "num_gpus")
                   and c != "config_id"]
    out = {k: row.get(k) for k in (
        "status", "step_time_s", "step_time_lo_s", "step_time_hi_s", "tokens_per_s_per_gpu", "mfu", "hfu", "peak_memory_gib",
        "peak_reserved_gib", "peak_allocated_gib", "oom_risk", "fits", "dp", "num_microbatches",
        "cost_per_step_usd", "cost_per_mtok_usd", "gpu_hours_per_step", "price_per_hour")}
    out["fits"] = bool(out["fits"])
    out["failures"] = {k: row.get(k) for k in GOODPUT_KEYS}
    out["breakdown"] = {k[5:]: row[k] for k in row_df.columns if k.startswith("time_")}
    out["memory"] = {k[4:]: row[k] for k in row_df.columns if k.startswith("mem_")}
    out["config"] = {k: row[k] for k in config_keys}
    return out


# sim_core/goodput.py's columns, as `sweep simulate --json` reports them under "failures"
GOODPUT_KEYS = ("goodput", "interruptions_per_day", "job_mtbf_h", "ckpt_total_gb", "ckpt_rank_gb",
                "ckpt_write_s", "ckpt_block_s", "ckpt_is_async", "ckpt_every_steps",
                "ckpt_interval_min", "restart_s")


def failure_lines(f: dict) -> list[tuple[str, str]]:
    """What failures, checkpoints and restarts cost, as (label, value) rows of text."""
    if not f or f.get("goodput") is None:
        return []
    mode = "async" if f.get("ckpt_is_async") else "sync"
    return [
        ("goodput", f"{f['goodput']:.1%} of wall time is useful training"),
        ("interruptions", f"{f['interruptions_per_day']:.2f}/day (job MTBF "
                          f"{f['job_mtbf_h']:.1f} h)"),
        ("checkpoint", f"{_size(f['ckpt_total_gb'])} ({_size(f['ckpt_rank_gb'])} on the "
                       f"busiest rank), written in {f['ckpt_write_s']:.1f} s, blocks "
                       f"{f['ckpt_block_s']:.1f} s ({mode})"),
        ("checkpoint every", f"{_fmt(f['ckpt_every_steps'])} steps = "
                             f"{f['ckpt_interval_min']:.1f} min"),
        ("restart", f"{f['restart_s'] / 60:.1f} min (incl. checkpoint load)"),
    ]


def _size(gb: float) -> str:
    return f"{gb / 1000:.2f} TB" if gb >= 1000 else f"{gb:.1f} GB"


def cfg_name(cfg) -> str:
    return cfg.model if isinstance(cfg.model, str) else "inline model"


def _simulate_text(rep: dict) -> str:
    c = rep["config"]
    where = f" on {c['instance']}" if c.get("instance") else ""
    task = c.get("task") or "pretrain"  # fine-tuning runs name their task (sim_core/tasks.py)
    if task != "pretrain":
        where += f", {task}" + (f" r{c.get('lora_rank')}" if task in ("lora", "qlora")
                                and c.get("lora_rank") is not None else "")
    lines = [f"{c.get('model')} on {c.get('num_gpus')} x {c.get('gpu')}{where} "
             f"({c.get('framework')}): "
             f"tp {c.get('tp')} pp {c.get('pp')} dp {_fmt(rep['dp'])} cp {c.get('cp')} "
             f"ep {c.get('ep')} vpp {c.get('vpp')} mb {c.get('micro_batch')} "
             f"recompute {c.get('recompute')}{_modules(c)} zero {c.get('zero')}",
             ""]
    lo, hi = rep.get("step_time_lo_s"), rep.get("step_time_hi_s")
    interval = (f"  (10-90%: {lo:.3f}-{hi:.3f} s, the calibration profile's spread)"
                if lo is not None and hi is not None and math.isfinite(lo) and math.isfinite(hi)
                else "")
    rows = [("step time", f"{rep['step_time_s']:.3f} s" + interval),
            ("tokens/s per GPU", f"{rep['tokens_per_s_per_gpu']:,.0f}"),
            ("MFU", f"{rep['mfu']:.1%}"),
            ("HFU", f"{rep['hfu']:.1%}" if rep.get("hfu") is not None else "-"),
            ("microbatches", _fmt(rep["num_microbatches"])),
            ("peak memory", f"{rep['peak_memory_gib']:.1f} GiB"
             + ("" if rep["fits"] else "  DOES NOT FIT (oom)")),
            ("OOM risk", f"{rep['oom_risk']:.0%}" if rep.get("oom_risk") is not None else "-"),
            ("cost", f"${rep['cost_per_step_usd']:.3f}/step, ${rep['cost_per_mtok_usd']:.3f}/Mtok"
             if rep.get("cost_per_step_usd") is not None else "-")]
    rows += failure_lines(rep.get("failures") or {})
    w = max(len(k) for k, _ in rows)
    lines += [f"{k:<{w}}  {v}" for k, v in rows]
    for title, d, unit in (("time breakdown", rep["breakdown"], "s"),
                           ("memory", rep["memory"], "GiB")):
        if not d:
            continue
        lines += ["", f"{title} ({unit}):"]
        kw = max(len(k) for k in d)
        for k, v in d.items():
            lines.append(f"  {k:<{kw}}  {'-' if v is None else format(v, '.4f' if unit == 's' else '.2f')}")
    return "\n".join(lines)


def _fmt(v) -> str:
    if v is None:
        return "-"
    return str(int(v)) if float(v).is_integer() else f"{v:g}"


def _modules(c: dict) -> str:
    """' (modules mla_up_proj,mlp)' for Megatron recompute modules listed (sim_core/recompute.py),
    else ''."""
    from sim_core import recompute

    v = c.get("recompute_modules")
    try:
        names = recompute.names(recompute.mask(v)) if v is not None else []
    except (recompute.RecomputeModulesError, ValueError, TypeError):
        names = []
    return f" (modules {','.join(names)})" if names else ""
