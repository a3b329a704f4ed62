"""Results on disk: one parquet part per finished batch, a manifest for resume, the assembled
`results.parquet`, `ranking.csv` (and `pareto.csv` for several objectives), and the summary.

Layout of a results folder (`results/<space-name>/` or `--out`)::

    manifest.json        space fingerprint + ids of finished batches (rewritten atomically)
    parts/<id>.parquet   one per finished batch (written to a temp file, then os.replace)
    optuna.journal       the Optuna study (strategy optuna, JournalStorage), for resume
    results.parquet      all configurations, sorted by config_id (schema version in metadata)
    ranking.csv          the best N that fit, by the first objective
    pareto.csv           the Pareto set over the objectives (two or more objectives)
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from .config import OBJECTIVES
from .errors import SweepError

SCHEMA_VERSION = 1
METADATA_KEY = b"sweep"


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_parquet(path: Path, df: pd.DataFrame, meta: dict | None = None) -> None:
    """Write a DataFrame atomically (temp file + os.replace), with sweep metadata."""
    table = pa.Table.from_pandas(df, preserve_index=False)
    info = {"schema_version": SCHEMA_VERSION, **(meta or {})}
    md = dict(table.schema.metadata or {})
    md[METADATA_KEY] = json.dumps(info, default=str).encode()
    table = table.replace_schema_metadata(md)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_metadata(path: str | Path) -> dict:
    md = pq.read_schema(path).metadata or {}
    return json.loads(md.get(METADATA_KEY, b"{}"))


class ResultStore:
    """Parts + manifest of one sweep. Finished batches survive Ctrl-C and crashes."""

    def __init__(self, out_dir: str | Path, fingerprint: str, info: dict | None = None):
        self.dir = Path(out_dir)
        self.parts_dir = self.dir / "parts"
        self.manifest_path = self.dir / "manifest.json"
        self.fingerprint = fingerprint
        self.info = dict(info or {})
        self.batches: dict[str, dict] = {}

    # ------------------------------------------------------------------ opening
    def open(self, fresh: bool = False) -> "ResultStore":
        try:
            self.parts_dir.mkdir(parents=True, exist_ok=True)
            probe = self.dir / ".write-probe"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise SweepError(f"results dir {self.dir}: not writable "
                             f"({exc.strerror or exc})") from None
        old = self._read_manifest()
        if old is not None and old.get("fingerprint") != self.fingerprint and not fresh:
            raise SweepError(
                f"results dir {self.dir} holds a sweep of a different space or search setting; "
                "pass --fresh to start over there, or --out to write elsewhere")
        if fresh or old is None:
            self.clear()
        else:
            self.batches = old.get("batches", {})
        return self

    def clear(self) -> None:
        shutil.rmtree(self.parts_dir, ignore_errors=True)
        self.parts_dir.mkdir(parents=True, exist_ok=True)
        for name in ("results.parquet", "ranking.csv", "pareto.csv", "optuna.db",
                     "optuna.journal"):
            p = self.dir / name
            if p.exists():
                p.unlink()
        self.batches = {}
        self._write_manifest(complete=False)

    def _read_manifest(self) -> dict | None:
        try:
            return json.loads(self.manifest_path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {}  # unreadable: treat as a different space

    def _write_manifest(self, complete: bool) -> None:
        doc = {"schema_version": SCHEMA_VERSION, "fingerprint": self.fingerprint,
               **self.info, "complete": complete, "batches": self.batches}
        _atomic_write_bytes(self.manifest_path, json.dumps(doc, indent=1).encode())

    # ------------------------------------------------------------------ parts
    @property
    def done(self) -> set[str]:
        return set(self.batches)

    def write_part(self, batch_id: str, df: pd.DataFrame, **extra) -> None:
        """Store one finished batch: part file first, then the manifest entry."""
        name = f"{batch_id}.parquet"
        write_parquet(self.parts_dir / name, df, {"batch_id": batch_id,
                                                   "fingerprint": self.fingerprint})
        self.batches[batch_id] = {"file": name, "rows": int(len(df)), **extra}
        self._write_manifest(complete=False)

    def load_parts(self) -> pd.DataFrame:
        frames = []
        for bid in sorted(self.batches):
            path = self.parts_dir / self.batches[bid]["file"]
            frames.append(pq.read_table(path).to_pandas())
        frames = [f for f in frames if len(f)]
        if not frames:
            return pd.DataFrame()
        return pd.concat(frames, ignore_index=True, sort=False)

    def finalize(self, df: pd.DataFrame, meta: dict | None = None) -> Path:
        path = self.dir / "results.parquet"
        write_parquet(path, df, {"fingerprint": self.fingerprint, **self.info, **(meta or {})})
        self._write_manifest(complete=True)
        return path


# ---------------------------------------------------------------------------------------------
# Derived columns, ranking, Pareto set, summary
# ---------------------------------------------------------------------------------------------
def gpu_prices(gpus, override: float | None = None) -> dict:
    """USD per GPU-hour for each GPU id (catalog default unless overridden)."""
    out = {}
    for g in set(gpus):
        if override is not None:
            out[g] = float(override)
            continue
        try:
            from sim_core import catalog

            out[g] = float(catalog.get_gpu(g).price_per_hour)
        except Exception:  # noqa: BLE001 - unknown price: cost stays NaN
            out[g] = float("nan")
    return out


def add_costs(df: pd.DataFrame, prices: dict, cost_unit: str = "mtok") -> pd.DataFrame:
    """cost_per_step_usd = num_gpus * step_time * price/3600; per million tokens too."""
    if not len(df) or "step_time_s" not in df.columns:
        for c in ("price_per_hour", "gpu_hours_per_step", "cost_per_step_usd",
                  "cost_per_mtok_usd", "cost_usd"):
            if c not in df.columns:
                df[c] = np.nan if len(df) else pd.Series(dtype=float)
        return df
    price = df["gpu"].map(prices).astype(float)
    gpu_h = df["num_gpus"] * df["step_time_s"] / 3600.0
    df["price_per_hour"] = price
    df["gpu_hours_per_step"] = gpu_h
    df["cost_per_step_usd"] = gpu_h * price
    tokens = df["global_batch"].astype(float) * df["seq_len"].astype(float)
    df["cost_per_mtok_usd"] = df["cost_per_step_usd"] / (tokens / 1e6)
    df["cost_usd"] = df["cost_per_mtok_usd" if cost_unit == "mtok" else "cost_per_step_usd"]
    return df


def objective_columns(objectives: list[str]) -> list[tuple[str, bool]]:
    """[(column, ascending)] for the objectives."""
    return [(OBJECTIVES[o][0], OBJECTIVES[o][1] == "minimize") for o in objectives]


def pareto_mask(values: np.ndarray) -> np.ndarray:
    """Non-dominated rows of a (n, k) array, all objectives minimized."""
    n = len(values)
    if n == 0:
        return np.zeros(0, dtype=bool)
    keep = np.ones(n, dtype=bool)
    if values.shape[1] == 2:
        order = np.lexsort((values[:, 1], values[:, 0]))
        best = np.inf
        keep[:] = False
        for i in order:
            if values[i, 1] < best:
                keep[i] = True
                best = values[i, 1]
        return keep
    for i in range(n):
        if not keep[i]:
            continue
        dominated = np.all(values <= values[i], axis=1) & np.any(values < values[i], axis=1)
        if dominated.any():
            keep[i] = False
    return keep


def rank(df: pd.DataFrame, objectives: list[str]) -> pd.DataFrame:
    """Add `rank` (1 = best among rows that fit, by the first objective) and `pareto`."""
    df["rank"] = pd.array([pd.NA] * len(df), dtype="Int64")
    df["pareto"] = False
    if not len(df) or "status" not in df.columns:
        return df
    cols = objective_columns(objectives)
    ok = df.index[(df["status"] == "ok") & df[cols[0][0]].notna()]
    if not len(ok):
        return df
    sub = df.loc[ok].sort_values([c for c, _ in cols] + ["config_id"],
                                 ascending=[a for _, a in cols] + [True], kind="stable")
    df.loc[sub.index, "rank"] = np.arange(1, len(sub) + 1)
    if len(cols) > 1:
        vals = np.column_stack([sub[c].to_numpy(float) * (1 if a else -1) for c, a in cols])
        vals = np.nan_to_num(vals, nan=np.inf)
        df.loc[sub.index[pareto_mask(vals)], "pareto"] = True
    return df


def best(df: pd.DataFrame, n: int) -> pd.DataFrame:
    if "rank" not in df.columns:
        return df.iloc[:0]
    return df[df["rank"].notna()].sort_values("rank").head(n)


def write_tables(df: pd.DataFrame, out_dir: Path, objectives: list[str], top: int) -> None:
    ranking = best(df, top)
    cols = ["rank"] + [c for c in ranking.columns if c != "rank"]
    ranking[cols].to_csv(out_dir / "ranking.csv", index=False)
    if len(objectives) > 1:
        par = df[df["pareto"]].sort_values("rank")
        par[cols].to_csv(out_dir / "pareto.csv", index=False)


def counts(df: pd.DataFrame) -> dict:
    s = df["status"].value_counts() if "status" in df.columns else pd.Series(dtype=int)
    ok, oom, invalid = int(s.get("ok", 0)), int(s.get("oom", 0)), int(s.get("invalid", 0))
    return {"total": int(len(df)), "invalid": invalid, "oom": oom, "simulated": ok + oom,
            "ok": ok}


SHOW = {  # column -> (header, format)
    "step_time_s": ("step s", "{:.3f}"),
    "tokens_per_s_per_gpu": ("tok/s/gpu", "{:,.0f}"),
    "mfu": ("mfu", "{:.3f}"),
    "peak_memory_gib": ("mem GiB", "{:.1f}"),
    "cost_per_mtok_usd": ("$/Mtok", "{:.3g}"),
}


def table(df: pd.DataFrame, config_cols: list[str], extra: tuple = ()) -> str:
    """A plain-text table of the given rows."""
    cols = ["rank"] + list(config_cols) + ["dp"] + [c for c in SHOW if c in df.columns]
    cols += [c for c in extra if c in df.columns and c not in cols]
    cols = [c for c in cols if c in df.columns]
    heads = [SHOW.get(c, (c,))[0] for c in cols]
    rows = []
    for _, r in df.iterrows():
        cells = []
        for c in cols:
            v = r[c]
            if c in SHOW and pd.notna(v):
                cells.append(SHOW[c][1].format(v))
            elif isinstance(v, (float, np.floating)) and pd.notna(v) and float(v).is_integer():
                cells.append(str(int(v)))
            else:
                cells.append(str(v))
        rows.append(cells)
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(heads)]
    fmt = "  ".join("{:>%d}" % w for w in widths)
    return "\n".join([fmt.format(*heads)] + [fmt.format(*r) for r in rows])


def summary(df: pd.DataFrame, config_cols: list[str], seconds: float, objectives: list[str],
            out_dir: Path, evaluated: int | None = None) -> str:
    c = counts(df)
    evaluated = c["total"] if evaluated is None else evaluated
    rate = evaluated / seconds if seconds > 0 else float("nan")
    lines = []
    top = best(df, 10)
    if len(top):
        lines.append(f"top {len(top)} by {objectives[0]} (fits only):")
        lines.append(table(top, config_cols))
    else:
        lines.append("no configuration fits in memory")
    lines.append(f"configurations: {c['total']:,} total, {c['invalid']:,} invalid, "
                 f"{c['oom']:,} oom, {c['simulated']:,} simulated ({c['ok']:,} fit)")
    lines.append(f"time: {seconds:.1f} s, {rate:,.0f} configurations/s; results in {out_dir}")
    return "\n".join(lines)
