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

import hashlib
import json
import os
import shutil
import sys
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


def write_parquet(path: Path, df: pd.DataFrame, meta: dict | None = None) -> str:
    """Write a DataFrame atomically (temp file + os.replace), with sweep metadata.

    Returns the SHA-256 of the file written (the manifest keeps it to detect corrupt parts)."""
    table = pa.Table.from_pandas(df, preserve_index=False)
    info = {"schema_version": SCHEMA_VERSION, **(meta or {})}
    md = dict(table.schema.metadata or {})
    md[METADATA_KEY] = json.dumps(info, default=str).encode()
    table = table.replace_schema_metadata(md)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        pq.write_table(table, tmp)
        digest = sha256(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return digest


def sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_metadata(path: str | Path) -> dict:
    md = pq.read_schema(path).metadata or {}
    return json.loads(md.get(METADATA_KEY, b"{}"))


def check_schema(version, path: str | Path, fix: str = "re-run the sweep with --fresh") -> None:
    """A clear one-line error when a results file was written by another schema version."""
    if version == SCHEMA_VERSION:
        return
    name = Path(path).name
    if not isinstance(version, int) or isinstance(version, bool):
        raise SweepError(f"{path}: no sweep schema version in {name} (not written by "
                         f"`sweep search`?); this sweep reads schema {SCHEMA_VERSION}: {fix}")
    how = "upgrade sweep to read it, or " if version > SCHEMA_VERSION else ""
    raise SweepError(f"{path}: {name} was written by schema {version}; this sweep reads "
                     f"schema {SCHEMA_VERSION}: {how}{fix}")


def read_results(path: str | Path) -> tuple[pd.DataFrame, dict]:
    """results.parquet and its sweep metadata; one-line errors for a corrupt file or another
    schema version."""
    try:
        meta = read_metadata(path)
        if not isinstance(meta, dict):
            raise ValueError("sweep metadata is not a mapping")
    except Exception as exc:  # noqa: BLE001 - corrupt file
        raise SweepError(f"{path}: cannot read ({_reason(exc)}); re-run `sweep search` "
                         "(finished batches are kept) to rewrite it") from None
    check_schema(meta.get("schema_version"), path, "re-run `sweep search` with --fresh")
    try:
        df = pq.read_table(path).to_pandas()
    except Exception as exc:  # noqa: BLE001 - corrupt file
        raise SweepError(f"{path}: cannot read ({_reason(exc)}); re-run `sweep search` "
                         "(finished batches are kept) to rewrite it") from None
    return df, meta


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    text = text if len(text) <= 120 else text[:117] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def warn(msg: str) -> None:
    """One line on stderr: something was recovered and the sweep goes on."""
    print("warning: " + " ".join(str(msg).split()), file=sys.stderr, flush=True)


class _Unreadable(Exception):
    """manifest.json exists but cannot be read or parsed."""


class ResultStore:
    """Parts + manifest of one sweep. Finished batches survive Ctrl-C, crashes and a full disk.

    Resuming (`open` without fresh) checks what an earlier run left: temp files of a write that
    never finished are removed; a part that is missing, unreadable or fails its checksum is
    dropped from the manifest (one warning line) so its batch is recomputed; an unreadable or
    missing manifest is rebuilt from the parts of this space (their metadata holds the space
    fingerprint); a manifest of another schema version or another space stops with a one-line
    error, and nothing is deleted.
    """

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
        self._remove_temp_files()
        if fresh:
            self.clear()
            return self
        try:
            old = self._read_manifest()
        except _Unreadable as exc:
            old = self._rebuild(f"{self.manifest_path}: unreadable ({exc})")
        if old is None and any(self.parts_dir.glob("*.parquet")):
            old = self._rebuild(f"{self.manifest_path}: missing")
        if old is None:
            self.clear()
            return self
        check_schema(old.get("schema_version"), self.manifest_path,
                     "re-run with --fresh to start over there, or --out to write elsewhere")
        if old.get("fingerprint") != self.fingerprint:
            raise SweepError(
                f"results dir {self.dir} holds a sweep of a different space or search setting; "
                "pass --fresh to start over there, or --out to write elsewhere")
        batches = old.get("batches") or {}
        self.batches = self._verified(batches if isinstance(batches, dict) else {})
        if self.batches != batches or old.get("rebuilt"):
            self._save_manifest(complete=False)
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
        self._save_manifest(complete=False)

    def _remove_temp_files(self) -> None:
        """Temp files of a write that was killed before its rename (never part of a result)."""
        for d in (self.dir, self.parts_dir):
            for p in d.glob(".*.tmp"):
                try:
                    p.unlink()
                except OSError:
                    pass

    def _read_manifest(self) -> dict | None:
        try:
            doc = json.loads(self.manifest_path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise _Unreadable(_reason(exc)) from None
        if not isinstance(doc, dict) or "schema_version" not in doc:
            raise _Unreadable("not a sweep manifest")
        return doc

    def _rebuild(self, reason: str) -> dict:
        """A manifest from the parts whose metadata names this space (fingerprint)."""
        found, foreign = {}, 0
        for path in sorted(self.parts_dir.glob("*.parquet")):
            try:
                meta = read_metadata(path)
                rows = pq.read_metadata(path).num_rows
            except Exception:  # noqa: BLE001 - a corrupt part: not adopted, recomputed
                continue
            bid = meta.get("batch_id") if isinstance(meta, dict) else None
            if (meta.get("fingerprint") != self.fingerprint
                    or meta.get("schema_version") != SCHEMA_VERSION
                    or path.name != f"{bid}.parquet"):
                foreign += 1
                continue
            found[bid] = {"file": path.name, "rows": int(rows), "sha256": sha256(path)}
        if foreign:
            raise SweepError(
                f"{reason}, and {self.parts_dir} holds batches of a different space, search "
                "setting or schema; pass --fresh to start over there, or --out to write elsewhere")
        warn(f"{reason}; rebuilt it from the {len(found)} finished batches in {self.parts_dir}")
        return {"schema_version": SCHEMA_VERSION, "fingerprint": self.fingerprint,
                "batches": found, "rebuilt": True}

    def _verified(self, batches: dict) -> dict:
        """The manifest's batches whose part is there and intact; the others are recomputed."""
        kept, bad = {}, []
        for bid, entry in sorted(batches.items()):
            problem = self._check_part(entry)
            if problem is None:
                kept[bid] = entry
            else:
                bad.append(problem)
        if bad:
            more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
            warn(f"{bad[0]}{more}: dropped {len(bad)} finished "
                 f"{'batch' if len(bad) == 1 else 'batches'} from the manifest; "
                 "recomputing them (the other finished batches are kept)")
        return kept

    def _check_part(self, entry) -> str | None:
        if not isinstance(entry, dict) or not isinstance(entry.get("file"), str):
            return f"{self.manifest_path}: malformed batch entry"
        path = self.parts_dir / Path(entry["file"]).name
        if not path.is_file():
            return f"{path}: missing"
        try:
            if entry.get("sha256"):
                if sha256(path) != entry["sha256"]:
                    return f"{path}: corrupt (checksum mismatch)"
            else:  # a manifest without checksums: at least the parquet footer must read
                rows = pq.read_metadata(path).num_rows
                if rows != entry.get("rows"):
                    return f"{path}: corrupt ({rows} rows, manifest says {entry.get('rows')})"
        except Exception as exc:  # noqa: BLE001
            return f"{path}: unreadable ({_reason(exc)})"
        return None

    def _save_manifest(self, complete: bool, batches: dict | None = None) -> None:
        doc = {"schema_version": SCHEMA_VERSION, "fingerprint": self.fingerprint,
               **self.info, "complete": complete,
               "batches": self.batches if batches is None else batches}
        _atomic_write_bytes(self.manifest_path, json.dumps(doc, indent=1).encode())

    def _write_manifest(self, complete: bool) -> None:
        try:
            self._save_manifest(complete)
        except OSError as exc:
            raise self._write_error(self.manifest_path, exc) from None

    def _write_error(self, path: Path, exc: OSError) -> SweepError:
        return SweepError(f"{path}: cannot write ({exc.strerror or _reason(exc)}); kept "
                          f"{len(self.batches)} finished batches in {self.dir}: free space "
                          "(or fix the folder) and run the same command again to resume")

    # ------------------------------------------------------------------ parts
    @property
    def done(self) -> set[str]:
        return set(self.batches)

    def write_part(self, batch_id: str, df: pd.DataFrame, **extra) -> None:
        """Store one finished batch: part file first, then the manifest entry (both atomic).

        A failed write (full disk) leaves no partial file and the manifest as it was."""
        name = f"{batch_id}.parquet"
        path = self.parts_dir / name
        try:
            digest = write_parquet(path, df, {"batch_id": batch_id,
                                              "fingerprint": self.fingerprint})
            batches = {**self.batches, batch_id: {"file": name, "rows": int(len(df)),
                                                  "sha256": digest, **extra}}
            self._save_manifest(complete=False, batches=batches)
        except OSError as exc:
            raise self._write_error(path, exc) from None
        self.batches = batches

    def load_parts(self) -> pd.DataFrame:
        frames = []
        for bid in sorted(self.batches):
            path = self.parts_dir / self.batches[bid]["file"]
            try:
                frames.append(pq.read_table(path).to_pandas())
            except Exception as exc:  # noqa: BLE001 - corrupt after its checksum was checked
                del self.batches[bid]
                self._write_manifest(complete=False)
                raise SweepError(f"{path}: unreadable ({_reason(exc)}); dropped it from the "
                                 "manifest: run the same command again to recompute that "
                                 "batch") from None
        frames = [f for f in frames if len(f)]
        if not frames:
            return pd.DataFrame()
        return pd.concat(frames, ignore_index=True, sort=False)

    def finalize(self, df: pd.DataFrame, meta: dict | None = None) -> Path:
        path = self.dir / "results.parquet"
        try:
            write_parquet(path, df, {"fingerprint": self.fingerprint, **self.info,
                                     **(meta or {})})
        except OSError as exc:
            raise self._write_error(path, exc) from None
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
    """ranking.csv (and pareto.csv), each written atomically (temp file + os.replace)."""
    ranking = best(df, top)
    cols = ["rank"] + [c for c in ranking.columns if c != "rank"]
    tables = {"ranking.csv": ranking[cols]}
    if len(objectives) > 1:
        tables["pareto.csv"] = df[df["pareto"]].sort_values("rank")[cols]
    for name, t in tables.items():
        path = Path(out_dir) / name
        try:
            _atomic_write_bytes(path, t.to_csv(index=False).encode())
        except OSError as exc:
            raise SweepError(f"{path}: cannot write ({exc.strerror or _reason(exc)}); the "
                             f"results are kept in {out_dir}: free space and run the same "
                             "command again") from None


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
    "oom_risk": ("OOM risk", "{:.0%}"),
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
