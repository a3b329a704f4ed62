"""Results on disk: one parquet part per finished batch, a manifest for resume, the
`results.parquet` dataset, `ranking.csv` (and `pareto.csv` for several objectives).

Layout of a results folder (`results/<space-name>/` or `--out`)::

    manifest.json        space fingerprint + ids of finished batches (rewritten atomically)
    parts/<id>.parquet   one per finished batch (written to a temp file, then os.replace; grid
                         parts are written by the Ray worker that computed them)
    optuna.journal       the Optuna study (strategy optuna, JournalStorage), for resume
    results.parquet/     the results as a parquet dataset: a folder of parts with one schema
                         (hard links to parts/, or copies), and `_sweep.json` (written last):
                         schema version, the parts, the columns that are constant across the
                         space (stored once there, not per row), counts by status and by
                         invalid reason, and the ranks of the best rows and of the Pareto set
    ranking.csv          the best N that fit, by the first objective
    pareto.csv           the Pareto set over the objectives (two or more objectives)

The grid path stores only the configurations it simulated (status ok or oom); those the rules
reject are counted by reason in `_sweep.json`. The schema is compact: strings are
dictionary-encoded, floats that are not objectives or costs are float32, small ints int32.
Read it with `read_results` (column selection and filters, constants put back), never whole.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from ..config import OBJECTIVES
from ..errors import SweepError

SCHEMA_VERSION = 2
METADATA_KEY = b"sweep"
RESULTS_NAME = "results.parquet"
DATASET_META = "_sweep.json"  # '_' prefix: pyarrow's dataset discovery skips it
# float columns kept in float64: objectives, costs and the memory peak (what ranks and filters
# compare); every other float (time and memory breakdown, ...) is stored as float32
PRECISE = frozenset({"step_time_s", "tokens_per_s_per_gpu", "mfu", "peak_memory_gib", "oom_risk",
                     "price_per_hour", "cost_per_mtok_usd", "cost_usd", "capacity_factor",
                     "expert_skew", "nic_bw_gbs", "power_limit_w"})
# what a grid part's metadata carries besides its id, so a lost manifest is rebuilt in full
PART_FIELDS = ("start", "stop", "counts", "reasons")
WIDE_INTS = frozenset({"config_id", "trial", "global_batch_tokens"})


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
    return _atomic_write_table(path, table, {})


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


# ---------------------------------------------------------------------------------------------
# Compact schema
# ---------------------------------------------------------------------------------------------
def compact_table(df: pd.DataFrame, constants: dict | None = None) -> pa.Table:
    """A DataFrame as an Arrow table in the compact results schema.

    Columns in `constants` are left out (they are stored once, in the dataset metadata); a row
    that disagrees with its constant is a bug in whoever chose the constants, so it raises.
    The types depend on the column's dtype and name only, so every part has one schema."""
    constants = constants or {}
    for c, v in constants.items():
        if c in df.columns and len(df) and not (df[c] == v).all():
            raise ValueError(f"column {c} is not constant ({v!r}) across the space")
    keep = df[[c for c in df.columns if c not in constants]]
    table = _arrow_table(keep)
    arrays, fields = [], []
    for f, col in zip(table.schema, table.columns):
        t = f.type
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            col = col.cast(pa.string()).dictionary_encode()
        elif pa.types.is_null(t):
            col = col.cast(pa.dictionary(pa.int32(), pa.string()))
        elif pa.types.is_float64(t) and f.name not in PRECISE:
            col = col.cast(pa.float32())
        elif pa.types.is_int64(t) and f.name not in WIDE_INTS:
            col = col.cast(pa.int32())
        arrays.append(col)
        fields.append(pa.field(f.name, col.type))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def _arrow_table(df: pd.DataFrame) -> pa.Table:
    """`pa.Table.from_pandas(df, preserve_index=False)` less its pandas metadata (which
    compact_table drops): each column converted as from_pandas converts it, without building
    that metadata (most of from_pandas' time on a part's 100 columns). Frames whose column
    names are not distinct strings go through from_pandas itself."""
    names = list(df.columns)
    if not all(isinstance(c, str) for c in names) or len(set(names)) != len(names):
        return pa.Table.from_pandas(df, preserve_index=False).replace_schema_metadata(None)
    return pa.Table.from_arrays([pa.array(df[c], from_pandas=True) for c in names],
                                names=names)


def constant_columns(df: pd.DataFrame, exclude=()) -> dict:
    """Columns of a frame with one value in every row (JSON-safe values), for the metadata."""
    out = {}
    if not len(df):
        return out
    for c in df.columns:
        if c in exclude:
            continue
        col = df[c]
        if col.isna().any():
            continue
        first = col.iloc[0]
        if isinstance(first, (list, dict)) or not (col == first).all():
            continue
        out[c] = first.item() if hasattr(first, "item") else first
    return out


def write_part_file(path: Path, df: pd.DataFrame, meta: dict, constants: dict | None = None) -> str:
    """One part in the compact schema, written atomically; returns its SHA-256."""
    table = compact_table(df, constants)
    info = {"schema_version": SCHEMA_VERSION, **meta}
    md = dict(table.schema.metadata or {})
    md[METADATA_KEY] = json.dumps(info, default=str).encode()
    return _atomic_write_table(Path(path), table.replace_schema_metadata(md))


def parquet_options(schema: pa.Schema) -> dict:
    """zstd; floats byte-stream-split (not dictionary: their values are nearly all distinct);
    config_id delta-encoded. About 40% smaller than the defaults on simulated rows."""
    floats = [f.name for f in schema if pa.types.is_floating(f.type)]
    delta = [n for n in ("config_id",) if n in schema.names
             and pa.types.is_integer(schema.field(n).type)]
    dictionary = [n for n in schema.names if n not in floats and n not in delta]
    return {"compression": "zstd", "use_dictionary": dictionary,
            "use_byte_stream_split": floats or False,
            "column_encoding": {n: "DELTA_BINARY_PACKED" for n in delta} or None}


def _atomic_write_table(path: Path, table: pa.Table, options: dict | None = None) -> str:
    """Write to a temp file beside `path`, hash it, rename it over `path`: a reader sees the
    old file or the new one, never a partial one. `options`: parquet writer options (default:
    the compact ones of the results parts)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        opts = parquet_options(table.schema) if options is None else options
        pq.write_table(table, tmp, **opts)
        digest = sha256(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return digest


# ---------------------------------------------------------------------------------------------
# Reading results (a dataset folder, or one parquet file)
# ---------------------------------------------------------------------------------------------
def results_path(run: str | Path) -> Path:
    """results.parquet of a results folder, or the path itself."""
    p = Path(run)
    return p / RESULTS_NAME if p.is_dir() and (p / RESULTS_NAME).exists() else p


def open_results(path: str | Path) -> tuple[ds.Dataset, dict]:
    """The results dataset and its sweep metadata, without reading rows.

    `path` is a results.parquet folder (written by `sweep search`) or a single parquet file
    with sweep metadata. One-line errors for a corrupt file or another schema version."""
    p = results_path(path)
    fix = "re-run `sweep search` (finished batches are kept) to rewrite it"
    try:
        if p.is_dir():
            meta = json.loads((p / DATASET_META).read_text())
            if not isinstance(meta, dict):
                raise ValueError("sweep metadata is not a mapping")
        else:
            meta = read_metadata(p)
            if not isinstance(meta, dict):
                raise ValueError("sweep metadata is not a mapping")
    except FileNotFoundError:
        raise SweepError(f"{p}: not finished (no {DATASET_META}); {fix}") from None
    except Exception as exc:  # noqa: BLE001 - corrupt file
        raise SweepError(f"{p}: cannot read ({_reason(exc)}); {fix}") from None
    check_schema(meta.get("schema_version"), p, "re-run `sweep search` with --fresh")
    try:
        if p.is_dir():
            files = [str(p / Path(f).name) for f in meta.get("files", [])]
            schema = None
            if not files:  # an empty dataset still has its schema
                schema = pa.schema([])
            dataset = ds.dataset(files, format="parquet", schema=schema)
        else:
            dataset = ds.dataset(str(p), format="parquet")
    except Exception as exc:  # noqa: BLE001 - corrupt part
        raise SweepError(f"{p}: cannot read ({_reason(exc)}); {fix}") from None
    return dataset, meta


def _filter_expr(dataset: ds.Dataset, constants: dict, filters: dict | None):
    """A pyarrow expression for {column: value or list of values} (None: no filter), and
    whether a filter on a constant column already excludes every row."""
    expr, empty = None, False
    for col, want in (filters or {}).items():
        values = list(want) if isinstance(want, (list, tuple, set, frozenset)) else [want]
        if col in constants:
            empty |= constants[col] not in values
            continue
        if col not in dataset.schema.names:
            raise SweepError(f"filter on {col}: no such column in the results")
        e = pc.field(col).isin(values)
        expr = e if expr is None else expr & e
    return expr, empty


def read_results(path: str | Path, columns: list[str] | None = None,
                 filters: dict | None = None) -> tuple[pd.DataFrame, dict]:
    """Results rows and their sweep metadata, read through a pyarrow dataset.

    columns: only these (None: all); filters: {column: value or values}, e.g.
    {"status": "ok", "gpu": ["h100-sxm"], "num_gpus": [1024, 2048]}, pushed down to the
    parquet scan. Constant columns come back from the metadata, `rank` and `pareto` from the
    ranks stored there; strings come back as plain strings."""
    dataset, meta = open_results(path)
    plan = _scan_plan(dataset, meta, columns, filters)
    try:
        if plan["empty"]:
            table = dataset.schema.empty_table().select(plan["scan"])
        else:
            table = dataset.to_table(columns=plan["scan"], filter=plan["expr"])
    except Exception as exc:  # noqa: BLE001 - corrupt part
        raise _unreadable(path, exc) from None
    return _frame_of(table, plan, meta), meta


def scan_results(path: str | Path, columns: list[str] | None = None,
                 filters: dict | None = None, batch_rows: int = 1 << 15, where=None):
    """`read_results` in pieces: yields DataFrames of about `batch_rows` rows (same columns,
    filters and put-back columns), so that a reader's memory does not grow with the results.
    where: a further pyarrow expression on stored columns, pushed down too (e.g.
    `pc.field("step_time_s") <= 2.1`). The metadata is `open_results(path)[1]`."""
    dataset, meta = open_results(path)
    plan = _scan_plan(dataset, meta, columns, filters)
    if where is not None and not plan["empty"]:
        plan["expr"] = where if plan["expr"] is None else plan["expr"] & where
    if plan["empty"]:
        yield _frame_of(dataset.schema.empty_table().select(plan["scan"]), plan, meta)
        return
    seen, held, rows = False, [], 0
    try:
        # little read-ahead: the scan holds a part or two at a time (sweep/__init__.py picks
        # the allocator, which decides whether freed memory goes back)
        for batch in dataset.to_batches(columns=plan["scan"], filter=plan["expr"],
                                        batch_size=batch_rows, batch_readahead=1,
                                        fragment_readahead=1, use_threads=False):
            if not batch.num_rows:
                continue
            held.append(batch)
            rows += batch.num_rows
            if rows >= batch_rows:  # parts are small: gather them into pieces of batch_rows
                seen = True
                yield _frame_of(pa.Table.from_batches(held), plan, meta)
                held, rows = [], 0
    except Exception as exc:  # noqa: BLE001 - corrupt part
        raise _unreadable(path, exc) from None
    if held or not seen:
        table = pa.Table.from_batches(held) if held else \
            dataset.schema.empty_table().select(plan["scan"])
        yield _frame_of(table, plan, meta)


def _unreadable(path, exc) -> SweepError:
    return SweepError(f"{results_path(path)}: cannot read ({_reason(exc)}); re-run `sweep "
                      "search` (finished batches are kept) to rewrite it")


def _scan_plan(dataset: ds.Dataset, meta: dict, columns, filters) -> dict:
    """The columns to scan and the filter of a read, and the columns to give back."""
    constants = dict(meta.get("constants") or {})
    names = dataset.schema.names
    order = list(meta.get("columns") or []) or names + [c for c in constants if c not in names]
    extra = [c for c in ("rank", "pareto") if c not in names and c not in constants]
    order += [c for c in extra if c not in order]
    want = order if columns is None else [c for c in columns if c in order or c in extra]
    expr, empty = _filter_expr(dataset, constants, filters)
    scan = [c for c in want if c in names]
    if ("rank" in want or "pareto" in want) and "rank" not in names and "config_id" in names \
            and "config_id" not in scan:
        scan.append("config_id")
    return {"want": want, "scan": scan, "expr": expr, "empty": empty, "constants": constants}


def _frame_of(table: pa.Table, plan: dict, meta: dict) -> pd.DataFrame:
    """A scanned table as the frame `read_results` gives: dictionaries decoded, constant
    columns, `rank` and `pareto` put back, columns in the order asked."""
    want, constants = plan["want"], plan["constants"]
    table = pa.Table.from_arrays(
        [c.cast(c.type.value_type) if pa.types.is_dictionary(c.type) else c
         for c in table.columns], names=table.column_names)
    df = table.to_pandas()
    n = len(df)
    put = {c: _repeated(constants[c], n) for c in want if c in constants and c not in df.columns}
    if put:  # at once, not one insertion per column
        df = pd.concat([df, pd.DataFrame(put)], axis=1)
    if "rank" in want and "rank" not in df.columns:
        ranks = {int(cid): i for cid, i in (meta.get("ranks") or [])}
        ids = df["config_id"].to_numpy() if "config_id" in df.columns else np.zeros(n, int)
        df["rank"] = pd.array([ranks.get(int(i)) for i in ids], dtype="Int64") if ranks \
            else pd.array([pd.NA] * n, dtype="Int64")
    if "pareto" in want and "pareto" not in df.columns:
        front = set(int(i) for i in meta.get("pareto") or [])
        df["pareto"] = (df["config_id"].isin(front).to_numpy() if "config_id" in df.columns
                        else np.zeros(n, dtype=bool))
    return df[[c for c in want if c in df.columns]]


def _repeated(value, n: int) -> pd.Series:
    """`pd.Series([value] * n, dtype=_dtype_of(value))`, typed from one element then taken
    (no list of n values to type)."""
    if not n:  # typed as the empty list is
        return pd.Series([], dtype=_dtype_of(value))
    one = pd.Series([value], dtype=_dtype_of(value))
    return pd.Series(one.array.take(np.zeros(n, dtype=np.intp)))


def _dtype_of(value):
    if isinstance(value, bool):
        return bool
    if isinstance(value, int):
        return np.int64
    if isinstance(value, float):
        return np.float64
    return None


def result_counts(path: str | Path) -> dict:
    """counts() of a finished run from its metadata (or by scanning `status` if absent)."""
    dataset, meta = open_results(path)
    if meta.get("counts"):
        return dict(meta["counts"])
    df, _ = read_results(path, columns=["status"])
    return counts(df)


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    text = text if len(text) <= 120 else text[:117] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def warn(msg: str) -> None:
    """One line on stderr: something was recovered and the sweep goes on."""
    print("warning: " + " ".join(str(msg).split()), file=sys.stderr, flush=True)


class _Unreadable(Exception):
    """manifest.json exists but cannot be read or parsed."""


# the shortest interval between two rewrites of manifest.json while batches are recorded
MANIFEST_EVERY_S = 1.0


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
        self._unsaved = 0  # batches recorded since the manifest was last saved
        self._saved = 0  # batches the manifest on disk lists
        self._save_after = 0.0  # time.monotonic() from which record_part saves again

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
        self._remove_results()
        for name in ("ranking.csv", "pareto.csv", "optuna.db", "optuna.journal"):
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
                    if p.is_dir():
                        shutil.rmtree(p)
                    else:
                        p.unlink()
                except OSError:
                    pass

    def _remove_results(self) -> None:
        p = self.dir / RESULTS_NAME
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif p.exists() or p.is_symlink():
            p.unlink()

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
            found[bid] = {"file": path.name, "rows": int(rows), "sha256": sha256(path),
                          **{k: meta[k] for k in PART_FIELDS if k in meta}}
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
        if entry["file"] == "" and entry.get("rows") == 0 and isinstance(entry.get("counts"),
                                                                          dict):
            return None  # a batch with nothing simulated: its counters are the whole record
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
        self._saved = len(doc["batches"])

    def _write_manifest(self, complete: bool) -> None:
        try:
            self._save_manifest(complete)
        except OSError as exc:
            raise self._write_error(self.manifest_path, exc) from None

    def _write_error(self, path: Path, exc: OSError) -> SweepError:
        return SweepError(f"{path}: cannot write ({exc.strerror or _reason(exc)}); kept "
                          f"{self._saved} finished batches in {self.dir}: free space "
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

    def part_path(self, batch_id: str) -> Path:
        return self.parts_dir / f"{batch_id}.parquet"

    def part_meta(self, batch_id: str) -> dict:
        """Metadata a worker writes into the part of `batch_id` (read back on rebuild)."""
        return {"batch_id": batch_id, "fingerprint": self.fingerprint}

    def record_part(self, batch_id: str, entry: dict) -> None:
        """Record a part that a worker wrote (its file, rows, sha256 and counters) in the
        manifest; until it is saved a re-run computes that batch again. The manifest (every
        batch's entry) is rewritten at most every MANIFEST_EVERY_S seconds, or ten times the
        last rewrite's duration if longer, so that its cost stays a small share of the run
        however many batches it lists (rewriting it per batch was quadratic: a 10^9-candidate
        grid has 5,309 batches); `flush` saves what is left (the grid and Optuna call it at
        the end, on Ctrl-C and on errors)."""
        self.batches[batch_id] = entry
        self._unsaved += 1
        if time.monotonic() >= self._save_after:
            self.flush()

    def flush(self) -> None:
        """Save the recorded batches not yet in the manifest (atomically)."""
        if not self._unsaved:
            return
        t0 = time.monotonic()
        try:
            self._save_manifest(complete=False)
        except OSError as exc:
            raise self._write_error(self.manifest_path, exc) from None
        took = time.monotonic() - t0
        self._unsaved = 0
        # (MANIFEST_EVERY_S 0: after every batch)
        self._save_after = time.monotonic() + (max(MANIFEST_EVERY_S, 10.0 * took)
                                               if MANIFEST_EVERY_S > 0 else 0.0)

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
        """Publish a whole frame (the Optuna path) as the results dataset: one part."""
        consts = constant_columns(df, exclude=("config_id", "trial", "rank", "pareto", "status"))
        meta = {**(meta or {}), "counts": counts(df), "columns": list(df.columns),
                "constants": consts}
        return self._publish([("table", compact_table(df, consts))], len(df), meta)

    def finalize_parts(self, meta: dict) -> Path:
        """Publish the recorded parts (the grid path) as the results dataset, without reading
        them: each is hard-linked (copied where links are not possible) into the folder."""
        items = [("file", self.parts_dir / self.batches[b]["file"]) for b in sorted(self.batches)
                 if self.batches[b].get("file")]  # a batch with no simulated row has no file
        rows = sum(int(self.batches[b].get("rows", 0)) for b in self.batches)
        return self._publish(items, rows, meta)

    def _publish(self, items: list, rows: int, meta: dict) -> Path:
        """results.parquet/ built in a temp folder, then renamed into place; `_sweep.json` is
        written last, so a folder without it is never taken for finished results."""
        path = self.dir / RESULTS_NAME
        tmp = Path(tempfile.mkdtemp(prefix=f".{RESULTS_NAME}.", suffix=".tmp", dir=self.dir))
        try:
            files = []
            for i, (kind, what) in enumerate(items):
                name = f"part-{i:06d}.parquet"
                if kind == "table":
                    _atomic_write_table(tmp / name, what)
                else:
                    try:
                        os.link(what, tmp / name)
                    except OSError:
                        shutil.copyfile(what, tmp / name)
                files.append(name)
            info = {"schema_version": SCHEMA_VERSION, "fingerprint": self.fingerprint,
                    **self.info, **meta, "files": files, "rows": int(rows)}
            _atomic_write_bytes(tmp / DATASET_META, json.dumps(info, default=str).encode())
            self._remove_results()
            os.replace(tmp, path)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise self._write_error(path, exc) from None
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._write_manifest(complete=True)
        return path


# ---------------------------------------------------------------------------------------------
# Derived columns, ranking, Pareto set, summary
# ---------------------------------------------------------------------------------------------
def gpu_prices(gpus, override: float | dict | None = None, instances=()) -> dict:
    """USD per GPU-hour for each GPU id and each instance id (catalog default unless
    overridden: one price for all, or {id: price}). An instance's own price wins over its
    GPU's in add_costs."""
    from sim_core import catalog

    def given(key):
        if isinstance(override, dict):
            return override.get(str(key).lower())
        return override

    out = {}
    for g in set(gpus):
        if given(g) is not None:
            out[g] = float(given(g))
            continue
        try:
            out[g] = float(catalog.get_gpu(g).price_per_hour)
        except Exception:  # noqa: BLE001 - unknown price: cost stays NaN
            out[g] = float("nan")
    for i in set(instances or ()):
        if not i:
            continue
        try:
            price = catalog.get_instance(i).price_per_gpu_hour
        except Exception:  # noqa: BLE001 - unknown instance: cost stays NaN
            price = None
        value = given(i)
        out[i] = float(value if value is not None else price if price is not None
                       else float("nan"))
    return out


def row_prices(df: pd.DataFrame, prices: dict) -> pd.Series:
    """Each row's USD per GPU-hour: its instance type's where it names one (NaN, cost
    unknown, for a type without a sourced or given price: never its GPU's generic price),
    else its GPU's."""
    price = _looked_up(df["gpu"], prices)
    if "instance" in df.columns:
        inst = df["instance"]
        named = (inst.notna() & (inst.astype(str) != "")).to_numpy()
        price = price.where(~named, _looked_up(inst, prices))
    return price


def _looked_up(col: pd.Series, prices: dict) -> pd.Series:
    """`col.map(prices).astype(float)`, looking up each distinct value once (a grid batch has
    a few GPU types in 10^5 rows)."""
    codes, uniq = pd.factorize(col)
    values = np.append(pd.Series(uniq, dtype=object).map(prices).astype(float).to_numpy(),
                       np.nan)  # code -1 (missing) takes the last: NaN
    return pd.Series(values[codes], index=col.index, name=col.name)


def add_costs(df: pd.DataFrame, prices: dict, cost_unit: str = "mtok") -> pd.DataFrame:
    """cost_per_step_usd = num_gpus * step_time * price/3600; per million tokens too."""
    if not len(df) or "step_time_s" not in df.columns:
        for c in ("price_per_hour", "gpu_hours_per_step", "cost_per_step_usd",
                  "cost_per_mtok_usd", "cost_usd"):
            if c not in df.columns:
                df[c] = np.nan if len(df) else pd.Series(dtype=float)
        return df
    price = row_prices(df, prices)
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
        # in (first, second) order a row is kept when its second value is below every
        # earlier row's (a running minimum, vectorized)
        order = np.lexsort((values[:, 1], values[:, 0]))
        second = values[order, 1]
        before = np.concatenate([[np.inf], np.minimum.accumulate(second)[:-1]])
        keep[:] = False
        keep[order[second < before]] = True
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


def sort_key(objectives: list[str]) -> tuple[list[str], list[bool]]:
    """Columns and directions that order the rows that fit (as `rank` numbers them)."""
    cols = objective_columns(objectives)
    return [c for c, _ in cols] + ["config_id"], [a for _, a in cols] + [True]


def rankable(df: pd.DataFrame, objectives: list[str]) -> pd.DataFrame:
    """The rows `rank` numbers: status ok with a value for the first objective."""
    if not len(df) or "status" not in df.columns:
        return df.iloc[:0]
    first = objective_columns(objectives)[0][0]
    return df[(df["status"] == "ok") & df[first].notna()]


def pareto_rows(df: pd.DataFrame, objectives: list[str]) -> pd.DataFrame:
    """The non-dominated rows among `rankable` rows (every row for one objective)."""
    sub = rankable(df, objectives)
    cols = objective_columns(objectives)
    if len(cols) < 2 or not len(sub):
        return sub.iloc[:0]
    vals = np.column_stack([sub[c].to_numpy(float) * (1 if a else -1) for c, a in cols])
    return sub[pareto_mask(np.nan_to_num(vals, nan=np.inf))]


class Leaderboard:
    """Top K rows by the objectives and the Pareto set, merged part by part.

    Each Ray task sends its local top K and local Pareto set; the union of local top Ks holds
    the global top K and the Pareto set of the union of local sets is the global one, so the
    driver keeps O(K + Pareto) rows whatever the size of the space. Counts add up."""

    def __init__(self, objectives: list[str], keep: int):
        self.objectives, self.keep = list(objectives), int(keep)
        self.top = pd.DataFrame()
        self.pareto = pd.DataFrame()
        self.counts = {"total": 0, "invalid": 0, "oom": 0, "simulated": 0, "ok": 0}
        self.reasons: dict[str, int] = {}

    def local(self, df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
        """(top K, Pareto set) of one part's rows (run where the part is).

        The same rows as sorting the `rankable` rows and `pareto_rows` of them, but only the
        objective columns and config_id are sorted and compared; the K + Pareto rows are then
        taken whole (a part has some 100 columns and 10^4 rows)."""
        if not len(df) or "status" not in df.columns:
            sub = rankable(df, self.objectives)
            return sub.reset_index(drop=True), sub.reset_index(drop=True)
        obj = objective_columns(self.objectives)
        pos = np.flatnonzero(((df["status"] == "ok") & df[obj[0][0]].notna()).to_numpy())
        if not len(pos):
            sub = df.iloc[pos]
            return sub.reset_index(drop=True), sub.reset_index(drop=True)
        cols, asc = sort_key(self.objectives)
        key = df[list(dict.fromkeys(cols))].iloc[pos].reset_index(drop=True)
        order = key.sort_values(cols, ascending=asc, kind="stable").index.to_numpy()
        top = df.iloc[pos[order[: self.keep]]]
        if len(obj) < 2:
            pareto = df.iloc[pos[:0]]
        else:
            vals = np.column_stack([key[c].to_numpy(float) * (1 if a else -1) for c, a in obj])
            pareto = df.iloc[pos[pareto_mask(np.nan_to_num(vals, nan=np.inf))]]
        return top.reset_index(drop=True), pareto.reset_index(drop=True)

    def add(self, top: pd.DataFrame, pareto: pd.DataFrame, counts: dict | None = None,
            reasons: dict | None = None) -> None:
        cols, asc = sort_key(self.objectives)
        if len(top):
            both = pd.concat([d for d in (self.top, top) if len(d)], ignore_index=True)
            self.top = both.sort_values(cols, ascending=asc, kind="stable").head(self.keep) \
                .reset_index(drop=True)
        if len(pareto):
            both = pd.concat([d for d in (self.pareto, pareto) if len(d)], ignore_index=True)
            both = both.drop_duplicates("config_id")
            self.pareto = pareto_rows(both, self.objectives).reset_index(drop=True)
        for k, v in (counts or {}).items():
            self.counts[k] = self.counts.get(k, 0) + int(v)
        for k, v in (reasons or {}).items():
            self.reasons[k] = self.reasons.get(k, 0) + int(v)

    def ranked(self, scan=None) -> tuple[pd.DataFrame, pd.DataFrame]:
        """(top K with `rank` 1..K and `pareto`, Pareto set sorted with its exact ranks).

        Pareto rows beyond the top K get their rank by counting the rows that sort before
        them; `scan()` yields frames of the objective columns, config_id and status."""
        cols, asc = sort_key(self.objectives)
        top = self.top.copy()
        top["rank"] = pd.array(np.arange(1, len(top) + 1), dtype="Int64")
        front = set(self.pareto["config_id"].astype(int)) if len(self.pareto) else set()
        top["pareto"] = top["config_id"].isin(front) if len(top) else pd.Series(dtype=bool)
        par = self.pareto.sort_values(cols, ascending=asc, kind="stable").reset_index(drop=True) \
            if len(self.pareto) else self.pareto.copy()
        known = dict(zip(top["config_id"].astype(int), top["rank"]))
        ranks = [known.get(int(c)) for c in par["config_id"]] if len(par) else []
        missing = [i for i, r in enumerate(ranks) if r is None]
        if missing and scan is not None:
            before = np.zeros(len(missing), dtype=np.int64)
            keys = par.iloc[missing]
            for chunk in scan():
                before += _counts_before(rankable(chunk, self.objectives), keys, cols, asc)
            for j, i in enumerate(missing):
                ranks[i] = int(before[j]) + 1
        if len(par):
            par["rank"] = pd.array(ranks, dtype="Int64")
            par["pareto"] = True
        return top, par


def _counts_before(df: pd.DataFrame, rows: pd.DataFrame, cols: list[str], asc: list[bool]
                   ) -> np.ndarray:
    """For each row of `rows`, how many rows of df come before it (`_sorts_before` counted):
    df sorted once in that order, then a binary search per row and column within the rows
    tied so far (not one pass over df per row)."""
    keys = []
    for c, a in zip(cols, asc):
        v = df[c].to_numpy(float)
        v = np.where(np.isnan(v), np.inf if a else -np.inf, v)
        keys.append(v if a else -v)  # ascending in every column; NaN last
    order = np.lexsort(keys[::-1]) if len(df) else np.zeros(0, dtype=np.int64)
    keys = [k[order] for k in keys]
    out = np.zeros(len(rows), dtype=np.int64)
    for j, (_, row) in enumerate(rows.iterrows()):
        q = [float(row[c]) if a else -float(row[c]) for c, a in zip(cols, asc)]
        if any(x != x for x in q):  # a NaN ties with nothing: the plain count
            out[j] = int(_sorts_before(df, row, cols, asc).sum())
            continue
        lo, hi = 0, len(df)
        for k, x in zip(keys, q):
            left = int(np.searchsorted(k[lo:hi], x, "left"))
            right = int(np.searchsorted(k[lo:hi], x, "right"))
            out[j] += left
            lo, hi = lo + left, lo + right
            if lo == hi:
                break
    return out


def _sorts_before(df: pd.DataFrame, row: pd.Series, cols: list[str], asc: list[bool]) -> np.ndarray:
    """Rows of df that come before `row` in the lexicographic order of cols (NaN last)."""
    out = np.zeros(len(df), dtype=bool)
    tie = np.ones(len(df), dtype=bool)
    for c, a in zip(cols, asc):
        v = df[c].to_numpy(float)
        r = float(row[c])
        v = np.where(np.isnan(v), np.inf if a else -np.inf, v)
        less = (v < r) if a else (v > r)
        out |= tie & less
        tie &= v == r
    return out


def best(df: pd.DataFrame, n: int) -> pd.DataFrame:
    if "rank" not in df.columns:
        return df.iloc[:0]
    return df[df["rank"].notna()].sort_values("rank").head(n)


def write_tables(df: pd.DataFrame, out_dir: Path, objectives: list[str], top: int) -> None:
    """ranking.csv (and pareto.csv) of a ranked frame, each written atomically."""
    pareto = df[df["pareto"]].sort_values("rank") if len(objectives) > 1 else df.iloc[0:0]
    write_ranked_tables(df, pareto, out_dir, objectives, top)


def write_ranked_tables(top: pd.DataFrame, pareto: pd.DataFrame, out_dir: Path,
                        objectives: list[str], n: int) -> None:
    """ranking.csv (and pareto.csv) from the ranked rows the driver kept."""
    ranking = best(top, n)
    cols = ["rank"] + [c for c in ranking.columns if c != "rank"]
    tables = {"ranking.csv": ranking[cols] if len(ranking) else pd.DataFrame(columns=cols)}
    if len(objectives) > 1:
        pcols = ["rank"] + [c for c in pareto.columns if c != "rank"] if len(pareto) else cols
        tables["pareto.csv"] = pareto[pcols] if len(pareto) else pd.DataFrame(columns=pcols)
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
    return summary_text(best(df, 10), counts(df), config_cols, seconds, objectives, out_dir,
                        evaluated)


def summary_text(top: pd.DataFrame, c: dict, config_cols: list[str], seconds: float,
                 objectives: list[str], out_dir: Path, evaluated: int | None = None) -> str:
    """The end-of-search text from the ranked rows and the counts (no full frame needed)."""
    evaluated = c["total"] if evaluated is None else evaluated
    rate = evaluated / seconds if seconds > 0 else float("nan")
    lines = []
    top = best(top, 10)
    if len(top):
        lines.append(f"top {len(top)} by {objectives[0]} (fits only):")
        lines.append(table(top, config_cols))
    else:
        lines.append("no configuration fits in memory")
    lines.append(f"configurations: {c['total']:,} total, {c['invalid']:,} invalid, "
                 f"{c['oom']:,} oom, {c['simulated']:,} simulated ({c['ok']:,} fit)")
    if c.get("pruned"):
        lines.append(f"  {c['pruned']:,} pruned by bound, not simulated: "
                     f"{c.get('pruned_memory', 0):,} by the memory bound (cannot fit), "
                     f"{c.get('pruned_time', 0):,} by the time bound (cannot reach the top "
                     "K); search.prune: false simulates them")
    if c.get("duplicate"):
        lines.append(f"  {c['duplicate']:,} repeat another but for a no-op setting (sequence "
                     "parallelism at tp 1, vpp at pp 1): evaluated once")
    lines.append(f"time: {seconds:.1f} s, {rate:,.0f} configurations/s; results in {out_dir}")
    return "\n".join(lines)
