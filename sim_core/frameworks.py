"""Framework profiles: which training framework runs the job, as an input of the simulator.

Each framework (Megatron-Core, NeMo, torchtitan, DeepSpeed, nanotron, llm-foundry) keeps
different buffers, fuses different ops and offers different schedules. catalogs/frameworks.yaml
holds one small table per framework, every entry read from that framework's code; this module
turns it into (1) the defaults of the run fields a file leaves unset (`resolve_frame`; a field
set by hand wins), (2) per-configuration arrays for the memory model (`memory_arrays`) and
(3) the settings a framework does not have, as invalid-configuration rules (`rules`).
`python -m sim_core.frameworks --markdown` prints docs/frameworks.md.
"""

from __future__ import annotations

import functools
import sys
from importlib import resources

import numpy as np
import pandas as pd

from . import catalog_yaml
from .specs import ATTENTION_KERNEL, CATEGORICAL, FRAMEWORK, PARALLEL_COLUMNS, PRECISION

DEFAULT_FRAMEWORK = "megatron-core"


@functools.lru_cache(maxsize=1)
def profiles() -> dict:
    """framework id -> its profile (defaults, memory, supports), in specs.FRAMEWORK order."""
    text = resources.files("sim_core").joinpath("catalogs/frameworks.yaml").read_text()
    table = catalog_yaml.read(text)["frameworks"]
    missing = [f for f in FRAMEWORK if f not in table]
    if missing or set(table) - set(FRAMEWORK):
        raise ValueError(f"catalogs/frameworks.yaml: frameworks must be exactly {FRAMEWORK}")
    return {f: table[f] for f in FRAMEWORK}


@functools.lru_cache(maxsize=1)
def profile_fields() -> tuple[str, ...]:
    """Run fields whose default comes from the framework (the same set for every profile)."""
    fields = list(profiles()[DEFAULT_FRAMEWORK]["defaults"])
    for name, prof in profiles().items():
        if list(prof["defaults"]) != fields:
            raise ValueError(f"catalogs/frameworks.yaml: {name} must set defaults for {fields}")
    return tuple(fields)


def default_value(framework: str, field: str, tp: int = 1):
    """The value `framework` gives `field` when the run leaves it unset."""
    entry = profiles()[framework]["defaults"][field]
    return entry["value_tp"] if tp > 1 and "value_tp" in entry else entry["value"]


def resolve_frame(df: pd.DataFrame) -> pd.DataFrame:
    """Fill every profile field that is absent or missing in a row with that row's framework
    default. Idempotent; rows that set a field keep it."""
    fields = profile_fields()
    fw_col = df["framework"] if "framework" in df.columns else None
    need = [f for f in fields if f not in df.columns or df[f].isna().any()]
    if fw_col is not None and fw_col.isna().any():
        need = list(fields)
    if not need and fw_col is not None:
        return df
    out = df.copy()
    fw = (fw_col.fillna(DEFAULT_FRAMEWORK) if fw_col is not None
          else pd.Series(DEFAULT_FRAMEWORK, index=df.index)).astype(str).str.lower()
    out["framework"] = fw
    unknown = ~fw.isin(FRAMEWORK)
    if unknown.any():
        from .catalog import CatalogError

        raise CatalogError(f"framework: unknown value '{fw[unknown].iloc[0]}'; allowed: "
                           f"{', '.join(FRAMEWORK)}")
    tp = pd.to_numeric(out["tp"], errors="coerce").fillna(1).to_numpy() if "tp" in out \
        else np.ones(len(out))
    fw_values = fw.to_numpy()
    groups = [(name, fw_values == name) for name in fw.unique()]
    added = {}
    for field in need:
        fill = np.empty(len(out), dtype=object)
        for name, rows in groups:
            entry = profiles()[name]["defaults"][field]
            fill[rows] = entry["value"]
            if "value_tp" in entry:
                fill[rows & (tp > 1)] = entry["value_tp"]
        if field in out.columns:
            have = out[field]
            merged = have.astype(object).where(have.notna(), pd.Series(fill, index=out.index))
        else:  # absent: the defaults themselves (what the merge gives, without pandas' where)
            merged = pd.Series(fill, index=out.index, dtype=object)
        kind = PARALLEL_COLUMNS.get(field)
        if isinstance(kind, bool):
            merged = merged.astype(bool)
        elif isinstance(kind, int):
            merged = merged.astype(np.int64)
        if field in out.columns:
            out[field] = merged
        else:
            added[field] = merged
    if added:  # new columns appended at once, in `need` order
        out = pd.concat([out, pd.DataFrame(added, index=out.index)], axis=1)
    if "attention_kernel" in need and "gpu" in out.columns:
        _rocm_attention(out, df, fw_values)
    return out


def _rocm_attention(out: pd.DataFrame, df: pd.DataFrame, fw_values) -> None:
    """Rows on an AMD GPU that left attention_kernel unset take their framework's ROCm kernel
    (CK flash-attention, the fa2 family): FA3/cuDNN attention does not exist on ROCm."""
    rocm = rocm_rows(out["gpu"])
    if not rocm.any():
        return
    unset = (df["attention_kernel"].isna().to_numpy() if "attention_kernel" in df.columns
             else np.ones(len(out), dtype=bool))
    fill = out["attention_kernel"].to_numpy(dtype=object).copy()
    for name in np.unique(fw_values[rocm & unset]):
        kernel = (profiles()[name].get("rocm") or {}).get("attention_kernel")
        if kernel:
            fill[rocm & unset & (fw_values == name)] = kernel
    out["attention_kernel"] = fill


def rocm_rows(gpu: pd.Series) -> np.ndarray:
    """True where the row's GPU is an AMD part (catalog vendor), one lookup per distinct id;
    ids the catalog does not know are left to the catalog's own error later."""
    from . import catalog

    codes, uniq = pd.factorize(gpu.astype(str), use_na_sentinel=False)  # hashed, not sorted
    amd = np.zeros(len(uniq), dtype=bool)
    for i, g in enumerate(uniq):
        try:
            amd[i] = catalog.get_gpu(str(g)).vendor == "amd"
        except catalog.CatalogError:
            continue
    return amd[np.asarray(codes)]


# ---------------------------------------------------------------------------------------------
# Memory layout arrays, one element per configuration
# ---------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _memory_table() -> dict[str, np.ndarray]:
    rows = [p["memory"] for p in profiles().values()]
    return {
        "grad_shard_zero": np.array([r["grad_shard_zero"] for r in rows], dtype=np.float64),
        "ddp_bucket_bytes": np.array([r["ddp_bucket_bytes"] for r in rows], dtype=np.float64),
        "optimizer_shard_zero": np.array([r["optimizer_shard_zero"] for r in rows],
                                         dtype=np.float64),
        # fp32 master weights + Adam m, v (12) unless the framework trains in pure bf16
        "optimizer_bytes": np.array([r.get("optimizer_bytes", 12.0) for r in rows],
                                    dtype=np.float64),
        "lp_grad_bytes": np.array([[float(r["lp_grad_bytes"].get(z, 0.0)) for z in range(4)]
                                   for r in rows]),
        # bucket elements at each ZeRO stage 0-3
        "bucket_elems": np.array([[float(r["bucket_elems"].get(z, 0.0)) for z in range(4)]
                                  for r in rows]),
    }


def memory_arrays(framework_code: np.ndarray, zero: np.ndarray) -> dict[str, np.ndarray]:
    """The framework's memory-layout constants for each configuration (see frameworks.yaml)."""
    t = _memory_table()
    code = np.asarray(framework_code, dtype=np.int64)
    z = np.clip(np.asarray(zero), 0, 3).astype(np.int64)
    cz = code * 4 + z  # (framework, ZeRO stage) in the row-major tables of 4 stages
    return {"grad_shard_zero": t["grad_shard_zero"].take(code),
            "ddp_bucket_bytes": t["ddp_bucket_bytes"].take(code),
            "optimizer_shard_zero": t["optimizer_shard_zero"].take(code),
            "optimizer_bytes": t["optimizer_bytes"].take(code),
            "lp_grad_bytes": np.ravel(t["lp_grad_bytes"]).take(cz),
            "bucket_elems": np.ravel(t["bucket_elems"]).take(cz)}


@functools.lru_cache(maxsize=1)
def _checkpoint_table() -> dict[str, np.ndarray]:
    rows = [p["checkpoint"] for p in profiles().values()]
    return {k: np.array([r[k] for r in rows], dtype=np.float64 if "bytes" in k else bool)
            for k in ("weights_bytes", "optimizer_bytes", "dedup", "async", "async_supported")}


def checkpoint_arrays(framework_code: np.ndarray) -> dict[str, np.ndarray]:
    """What each configuration's framework saves per parameter and how (frameworks.yaml
    `checkpoint`): weights_bytes, optimizer_bytes, dedup, async, async_supported."""
    t = _checkpoint_table()
    code = np.asarray(framework_code, dtype=np.int64)
    return {k: v[code] for k, v in t.items()}


# ---------------------------------------------------------------------------------------------
# Settings a framework does not have
# ---------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _support_table() -> dict[str, np.ndarray]:
    sup = [p["supports"] for p in profiles().values()]

    def allowed(field: str, key: str | None = None) -> np.ndarray:
        values = CATEGORICAL[field] if field in CATEGORICAL else range(4)
        return np.array([[v in s[key or field] for v in values] for s in sup])

    return {
        "zero": allowed("zero"),
        "pp_schedule": allowed("pp_schedule"),
        "cp_comm": allowed("cp_comm"),
        "recompute": allowed("recompute"),
        "fp8_recipe": allowed("fp8_recipe", "fp8_recipes"),
        "attention_kernel": allowed("attention_kernel", "attention_kernels"),
        **{k: np.array([bool(s[k]) for s in sup])
           for k in ("pp", "vpp", "cp", "ep", "tp_comm_overlap", "fp8")},
        "fp8_norm_amax": np.array([bool(s.get("fp8_norm_amax")) for s in sup]),
        "pp_zero_max": np.array([s.get("pp_zero_max", 3) for s in sup], dtype=np.float64),
        "rocm": np.array([bool((p.get("rocm") or {}).get("runs")) for p in profiles().values()]),
        # a profile whose ROCm port was read (rocm.code names the code); others are unchecked
        "rocm_read": np.array([bool((p.get("rocm") or {}).get("code"))
                               for p in profiles().values()]),
        "rocm_fp8": np.array([bool((p.get("rocm") or {}).get("fp8")) for p in profiles().values()]),
        # FP4 formats (sim_core/fp4.py) per framework: on NVIDIA (supports.fp4), on ROCm (rocm.fp4)
        **{f"fp4_{f}": np.array([f in (s.get("fp4") or []) for s in sup])
           for f in ("nvfp4", "mxfp4")},
        **{f"rocm_fp4_{f}": np.array([f in ((p.get("rocm") or {}).get("fp4") or [])
                                      for p in profiles().values()]) for f in ("nvfp4", "mxfp4")},
    }


def column(b, name: str) -> np.ndarray:
    """A batch column, or its spec default where a hand-built batch (benchmarks, property tests)
    leaves it out: the default framework's code, the first schedule."""
    if name in b:
        return np.asarray(b[name])
    default = {"framework": FRAMEWORK.index(DEFAULT_FRAMEWORK), "pp_schedule": 0}[name]
    return np.full(len(b.tp), default, dtype=np.int64)


def rules(b) -> list[tuple[str, np.ndarray]]:
    """(reason, violated mask) for settings the configuration's framework does not offer.
    Settings the framework silently ignores (SP at tp = 1, an overlap with nothing to overlap)
    are not violations."""
    s = _support_table()
    fw = column(b, "framework").astype(np.int64)
    sched = column(b, "pp_schedule").astype(np.int64)
    z = np.clip(b.zero, 0, 3).astype(np.int64)
    checks = [(f"ZeRO stage {stage}", ~s["zero"][fw, z] & (z == stage)) for stage in range(4)]
    checks += [(f"{v} pipeline schedule", ~s["pp_schedule"][fw, i] & (sched == i) & (b.pp > 1))
               for i, v in enumerate(CATEGORICAL["pp_schedule"])]
    checks += [(f"cp_comm {v} (context-parallel communication)", ~s["cp_comm"][fw, i]
                & (b.cp_comm == i)
                & (b.cp > 1)) for i, v in enumerate(CATEGORICAL["cp_comm"])]
    checks += [(f"{v} recompute", ~s["recompute"][fw, i] & (b.recompute == i))
               for i, v in enumerate(CATEGORICAL["recompute"])]
    if "fp8_recipe" in b:
        checks += [(f"{v} FP8 recipe", ~s["fp8_recipe"][fw, i] & s["fp8"][fw]
                    & (b.fp8_recipe == i) & (b.precision == 1))
                   for i, v in enumerate(CATEGORICAL["fp8_recipe"])]
    checks += [
        ("pipeline parallelism (pp > 1)", ~s["pp"][fw] & (b.pp > 1)),
        ("interleaved pipeline schedule (vpp > 1)", ~s["vpp"][fw] & (b.vpp > 1)),
        ("ZeRO-2/3 with pipeline parallelism", (b.pp > 1) & (b.zero > s["pp_zero_max"][fw])),
        ("context parallelism (cp > 1)", ~s["cp"][fw] & (b.cp > 1)),
        ("expert parallelism (ep > 1)", ~s["ep"][fw] & (b.ep > 1)),
        ("TP communication overlap", ~s["tp_comm_overlap"][fw] & b.tp_comm_overlap & (b.tp > 1)),
        ("FP8 training", ~s["fp8"][fw] & (b.precision == 1)),
        ("asynchronous checkpointing", ~_checkpoint_table()["async_supported"][fw]
         & (np.asarray(b["ckpt_async"]) == 1 if "ckpt_async" in b else False)),
    ]
    # AMD GPUs: the framework's ROCm port (frameworks.yaml rocm). Peeked at without the
    # batch's own accessors first: the search's space count (sweep.engine.space.rule_axes)
    # records what the rules read, and a space of NVIDIA parts only must keep `gpu` a free axis;
    # with an AMD part present the field is read (and recorded) normally.
    rocm = np.asarray(dict.get(b, "rocm", np.zeros(len(fw)))) > 0
    if rocm.any():
        rocm = np.asarray(b["rocm"]) > 0
        checks += [
            # every refusal cites code (frameworks.yaml rocm.code/source); a framework whose
            # ROCm port was not read is refused as unchecked, not as unable
            ("ROCm support (AMD GPUs)", ~s["rocm"][fw] & s["rocm_read"][fw] & rocm),
            ("ROCm port read for this project (AMD GPUs are offered only with megatron-core, "
             "nemo or torchtitan, whose ROCm code is cited)", ~s["rocm"][fw] & ~s["rocm_read"][fw]
             & rocm),
            ("FA3/cuDNN attention on ROCm (CK flash-attention is the fa2 family)",
             s["rocm"][fw] & rocm & (b.attention_kernel == 0)),
            ("FP8 training on ROCm", s["rocm"][fw] & ~s["rocm_fp8"][fw] & rocm
             & (b.precision == 1)),
            # flash-attn v1 (HazyResearch flash-attention v1.0.x) built CUDA kernels only; ROCm's
            # flash-attention ports start at FA2. Triton has a ROCm backend: triton stays valid.
            ("FlashAttention-1 on ROCm (flash-attn v1 had no ROCm build)",
             s["rocm"][fw] & rocm & (b.attention_kernel == ATTENTION_KERNEL.index("fa1"))),
        ]
    # FP4 training (sim_core/fp4.py): the formats the framework's code has, on NVIDIA
    # (supports.fp4) and in its ROCm build (rocm.fp4); read only where a row asks for FP4
    prec = np.asarray(b.precision)
    if (prec >= 2).any():
        amd = np.asarray(b["rocm"]) > 0
        for f in ("nvfp4", "mxfp4"):
            rows = prec == PRECISION.index(f)
            checks += [(f"{f.upper()} training", rows & ~amd & ~s[f"fp4_{f}"][fw]),
                       (f"{f.upper()} training on ROCm", rows & amd & s["rocm"][fw]
                        & ~s[f"rocm_fp4_{f}"][fw])]
    # Attention kernels a framework's code does not have, after the ROCm rules (an AMD row names
    # what ROCm lacks first). Peeked at as `rocm` is: fa3 and fa2 are open to every framework,
    # so a space without triton or fa1 keeps attention_kernel out of the rules' axes.
    kern = np.asarray(dict.get(b, "attention_kernel", np.zeros(len(fw))))
    if (kern > 1).any():
        kern = np.asarray(b["attention_kernel"]).astype(np.int64)
        checks += [(f"{v} attention kernel", ~s["attention_kernel"][fw, i] & (kern == i))
                   for i, v in enumerate(ATTENTION_KERNEL)]
    out = []
    for what, bad in checks:
        if bad.any():
            # one reason text per framework, so that the reason names it
            for code in np.unique(fw[bad]):
                out.append((f"{FRAMEWORK[code]} has no {what}", bad & (fw == code)))
    return out


# ---------------------------------------------------------------------------------------------
# Documentation
# ---------------------------------------------------------------------------------------------
def markdown() -> str:
    """docs/frameworks.md: every profile's table with its code references."""
    lines = ["# Framework profiles", "",
             "Generated by `python -m sim_core.frameworks --markdown` from "
             "`sim_core/catalogs/frameworks.yaml`; a test keeps the two equal.", "",
             "Which framework runs the job is an input (`framework:` in a run or space file; "
             "a space may vary it). It sets the defaults of the run fields below (a field set "
             "by hand wins), the memory layout of gradients and buffers, and which settings "
             "exist: a setting the framework does not offer makes the configuration `invalid` "
             "with the reason. Every entry names the code it was read from; none is fitted.", ""]
    for fid, p in profiles().items():
        lines += [f"## `{fid}`: {p['title']}", "", f"Code read: {p['code']}.", "",
                  "| field | default | from |", "|---|---|---|"]
        for field, e in p["defaults"].items():
            val = f"`{e['value']}`" + (f" (`{e['value_tp']}` when tp > 1)"
                                       if "value_tp" in e else "")
            lines.append(f"| `{field}` | {val} | {e['source']} |")
        m = p["memory"]
        shard = "never" if m["grad_shard_zero"] > 3 else f"from ZeRO stage {m['grad_shard_zero']}"
        buckets = ", ".join(f"stage {z}: {v:.0e} elements" for z, v in m["bucket_elems"].items())
        lp = ", ".join(f"stage {z}: {v} B" for z, v in m["lp_grad_bytes"].items())
        opt = ("at every stage" if m["optimizer_shard_zero"] == 0
               else f"from ZeRO stage {m['optimizer_shard_zero']}")
        lines += ["", f"Memory: fp32 master weights and Adam states sharded {opt}; "
                  "gradient buffer sharded " + shard
                  + (f"; bf16 gradients held beside it ({lp} per parameter)" if lp else "")
                  + (f"; torch DDP bf16 buckets {m['ddp_bucket_bytes']} B/parameter when dp > 1"
                     if m["ddp_bucket_bytes"] else "")
                  + (f"; fixed bf16 buckets ({buckets})" if buckets else "")
                  + f". From: {m['source']}.", ""]
        s = p["supports"]
        offered = [f"ZeRO {s['zero']}", f"recompute {s['recompute']}",
                   "pipeline " + (f"{s['pp_schedule']}" + (" + interleaved" if s["vpp"] else "")
                                  if s["pp"] else "none")]
        if s.get("pp_zero_max", 3) < 3:
            offered.append(f"pipeline only with ZeRO <= {s['pp_zero_max']}")
        offered += [f"CP {s['cp_comm'] if s['cp'] else 'none'}",
                    f"EP {'yes' if s['ep'] else 'no'}",
                    f"TP comm overlap {'yes' if s['tp_comm_overlap'] else 'no'}",
                    f"FP8 {'recipes ' + str(s['fp8_recipes']) if s['fp8'] else 'no'}",
                    f"attention kernels {s['attention_kernels']}"]
        lines += ["Offers: " + "; ".join(o.replace("'", "") for o in offered)
                  + f". From: {s['source']}.", ""]
        c = p["checkpoint"]
        lines += [f"Checkpoint: {c['weights_bytes']} B/parameter of weights + "
                  f"{c['optimizer_bytes']} B/parameter of optimizer state; "
                  + ("replicated tensors written once, spread over the data-parallel ranks"
                     if c["dedup"] else "replicated tensors not spread (some ranks write more)")
                  + "; save " + ("asynchronous by default" if c["async"] else
                                 "synchronous by default" if c["async_supported"] else
                                 "synchronous only")
                  + f" ({c['flag']}). From: {c['source']}.", ""]
        r = p.get("rocm") or {}
        if r.get("runs"):
            env = " ".join(f"`{k}={v}`" for k, v in r.get("env", {}).items())
            lines += [f"On ROCm (AMD Instinct): runs ({r['code']}); attention "
                      f"`{r['attention_kernel']}` by default; FP8 {'yes' if r.get('fp8') else 'no'}"
                      + (f"; recipes set {env}" if env else "")
                      + (f"; left out: {r['env_not_set']}" if r.get("env_not_set") else "")
                      + f". From: {r['source']}.", ""]
        else:
            lines += [f"On ROCm (AMD Instinct): not offered ({r.get('source', 'no profile')}).", ""]
    return "\n".join(lines)


def main(argv=None) -> None:  # python -m sim_core.frameworks --markdown
    argv = sys.argv[1:] if argv is None else argv
    if argv != ["--markdown"]:
        print("usage: python -m sim_core.frameworks --markdown", file=sys.stderr)
        raise SystemExit(2)
    print(markdown())


if __name__ == "__main__":
    main()
