"""Catalogs of models, GPUs and clusters: load, validate, look up.

Data lives in ``sim_core/catalogs/{models,gpus,clusters}.yaml`` (each entry cites its source).
Everything is loaded once (``functools.lru_cache``) and validated on load: a bad entry raises
:class:`CatalogError` naming the file, the entry and the field.

Lookups are case-insensitive and treat ``_`` like ``-`` (``"Llama3_70B"`` finds ``llama3-70b``).
An unknown name raises a one-line :class:`CatalogError` with a did-you-mean suggestion and the
allowed names.

FP8 on GPUs without FP8 tensor cores (A100: ``peak_tflops["fp8"] == 0`` in the catalog): the
GPUSpec keeps the 0 (the hardware fact), while :func:`gpu_table` (column ``peak_fp8``) and
:func:`peak_tflops` fall back to the bf16 peak, i.e. an fp8 run on such a GPU is priced as bf16.
``gpu_table()["has_fp8"]`` tells the two cases apart.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
from pathlib import Path

from . import catalog_yaml
from . import gpu_names as _gpu_names
from . import model_names as _model_names
from .specs import ACTIVATION, ClusterSpec, GPUSpec, InstanceSpec, ModelSpec

__all__ = [
    "CatalogError", "get_model", "get_gpu", "get_cluster", "default_cluster_for_gpu",
    "model_names", "resolve_model", "gpu_names", "cluster_names", "model_from_dict",
    "cluster_from_dict",
    "gpu_table", "peak_tflops", "param_count", "active_param_count", "CATALOG_DIR",
    "get_instance", "instance_names", "instance_cluster", "unavailable_instances", "transports",
]

CATALOG_DIR = Path(__file__).resolve().parent / "catalogs"
MODELS_FILE, GPUS_FILE, CLUSTERS_FILE = "models.yaml", "gpus.yaml", "clusters.yaml"
INSTANCES_FILE = "instances.yaml"
DTYPES = ("fp32", "tf32", "bf16", "fp8")
# Block-scaled formats, listed only for the parts whose datasheet gives them (OCP MX formats on
# CDNA4 and Blackwell, NVIDIA's NVFP4 on Blackwell). Absent = the part has no such peak (0).
OPTIONAL_DTYPES = ("mxfp8", "mxfp6", "mxfp4", "nvfp4")
VENDORS = ("nvidia", "amd", "huawei")


class CatalogError(ValueError):
    """A catalog entry or an inline spec is invalid, or a name is unknown."""


# ---------------------------------------------------------------------------------------------
# Names
# ---------------------------------------------------------------------------------------------
def _norm(name) -> str:
    return str(name).strip().lower().replace("_", "-").replace(" ", "-")


def _suggest(word: str, choices) -> str | None:
    """Best guess for a mistyped name: a name the word is a prefix of (or vice versa) first,
    else the closest by difflib ratio."""
    choices = [str(c) for c in choices]
    word = str(word)
    ratio = lambda c: difflib.SequenceMatcher(None, word, c).ratio()  # noqa: E731
    pref = [c for c in choices if word and (c.startswith(word) or word.startswith(c))]
    if pref:
        return max(pref, key=ratio)
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.5)
    return close[0] if close else None


def _check_entry(d, name: str, file: str, allowed) -> None:
    """A catalog file's entry is a mapping of known fields: one line naming the entry, the
    unknown field (with did-you-mean) and what is allowed, otherwise."""
    if not isinstance(d, dict):
        raise CatalogError(f"{file}: entry {name!r}: expected a mapping of fields, got {d!r}")
    for key in d:
        if key not in allowed:
            hint = _suggest(str(key), allowed)
            tail = f"; did you mean {hint!r}?" if hint else ""
            raise CatalogError(f"{file}: entry {name!r}: unknown field {key!r}{tail} "
                               f"allowed: {', '.join(allowed)}")


def _unknown(kind: str, name, choices) -> CatalogError:
    choices = list(choices)
    hint = _suggest(_norm(name), choices)
    msg = f"unknown {kind} {str(name)!r}"
    if hint:
        msg += f": did you mean {hint!r}?"
    else:
        msg += ";"
    see = f" (`sweep catalog {kind}s` lists them)" if kind in ("model", "gpu", "instance") \
        else ""
    return CatalogError(f"{msg} allowed: {', '.join(choices)}{see}")


# ---------------------------------------------------------------------------------------------
# Field validation
# ---------------------------------------------------------------------------------------------
def _where(file: str, entry: str, field: str) -> str:
    return f"{file}: entry {entry!r}: field {field!r}"


def _as_int(value, where: str, *, minimum: int) -> int:
    """Integers only (bool rejected; an integral float such as 4096.0 is accepted)."""
    ok = isinstance(value, int) and not isinstance(value, bool)
    if not ok and isinstance(value, float) and value.is_integer():
        value, ok = int(value), True
    if not ok and hasattr(value, "dtype") and getattr(value.dtype, "kind", "") in "iu":  # numpy
        value, ok = int(value), True
    if not ok:
        raise CatalogError(f"{where}: expected an integer, got {value!r}")
    if value < minimum:
        rng = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise CatalogError(f"{where}: must be {rng}, got {value}")
    return int(value)


def _as_float(value, where: str, *, positive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        if hasattr(value, "dtype") and getattr(value.dtype, "kind", "") in "iuf":
            value = float(value)
        else:
            raise CatalogError(f"{where}: expected a number, got {value!r}")
    value = float(value)
    if value != value or value in (float("inf"), float("-inf")):
        raise CatalogError(f"{where}: must be finite, got {value}")
    if positive and value <= 0:
        raise CatalogError(f"{where}: must be > 0, got {value}")
    if not positive and value < 0:
        raise CatalogError(f"{where}: must be >= 0, got {value}")
    return value


def _as_bool(value, where: str) -> bool:
    if isinstance(value, bool):
        return value
    if hasattr(value, "dtype") and getattr(value.dtype, "kind", "") == "b":
        return bool(value)
    raise CatalogError(f"{where}: expected true/false, got {value!r}")


def _as_str(value, where: str) -> str:
    if not isinstance(value, str):
        raise CatalogError(f"{where}: expected a string, got {value!r}")
    return value


# ---------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------
_MODEL_FIELDS = {f.name: f for f in dataclasses.fields(ModelSpec)}
_MODEL_REQUIRED = ("layers", "hidden", "heads", "ffn", "vocab")
_MODEL_POSITIVE = ("layers", "hidden", "heads", "vocab")
_MODEL_NONNEG = ("kv_heads", "ffn", "head_dim", "seq_len", "experts", "top_k", "expert_ffn",
                 "shared_experts", "first_dense_layers", "q_lora_rank", "kv_lora_rank",
                 "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "sliding_window",
                 "window_attn_skip_freq", "router_groups", "router_group_topk")
_MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
_MOE_FIELDS = ("top_k", "expert_ffn", "shared_experts", "first_dense_layers")
#: keys an inline model (YAML ``model: {...}``) may use
INLINE_MODEL_KEYS = tuple(k for k in _MODEL_FIELDS if k != "name") + ("name", "base")


def _build_model(d: dict, name: str, file: str) -> ModelSpec:
    """Validate one model mapping and build its ModelSpec (``file`` is used in messages)."""
    allowed = [k for k in _MODEL_FIELDS if k != "name"]
    _check_entry(d, name, file, allowed)
    d = dict(d)
    moe = bool(d.get("experts"))
    if moe and "ffn" not in d and not d.get("first_dense_layers") and d.get("expert_ffn"):
        d["ffn"] = d["expert_ffn"]  # all layers MoE: the dense width is unused
    for key in _MODEL_REQUIRED:
        if key not in d or d[key] is None:
            raise CatalogError(f"{_where(file, name, key)}: required field is missing")
    w = functools.partial(_where, file, name)
    out: dict = {}
    for key in _MODEL_POSITIVE:
        out[key] = _as_int(d[key], w(key), minimum=1)
    for key in _MODEL_NONNEG:
        value = d.get(key, 0)
        out[key] = _as_int(0 if value is None else value, w(key), minimum=0)
    act = _as_str(d.get("activation", "gelu"), w("activation")).lower()
    if act not in ACTIVATION:
        hint = _suggest(act, ACTIVATION)
        tail = f"; did you mean {hint!r}?" if hint else ""
        raise CatalogError(f"{w('activation')}: unknown activation {act!r}{tail} "
                           f"allowed: {', '.join(ACTIVATION)}")
    out["activation"] = act
    out["tied_embeddings"] = _as_bool(d.get("tied_embeddings", False), w("tied_embeddings"))
    out["source"] = _as_str(d.get("source", ""), w("source"))

    # ---- cross-field rules ----
    h, a = out["hidden"], out["heads"]
    if out["kv_heads"] == 0:
        out["kv_heads"] = a
    mla = out["kv_lora_rank"] > 0
    if mla:
        for key in ("qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
            if out[key] <= 0:
                raise CatalogError(f"{w(key)}: MLA (kv_lora_rank > 0) needs a positive {key}")
    else:
        for key in _MLA_FIELDS:
            if out[key]:
                raise CatalogError(f"{w(key)}: MLA field set but kv_lora_rank is 0")
    if out["head_dim"] == 0 and not mla and h % a:
        raise CatalogError(f"{w('heads')}: heads ({a}) must divide hidden ({h}) "
                           f"unless head_dim is given")
    if a % out["kv_heads"]:
        raise CatalogError(f"{w('kv_heads')}: kv_heads ({out['kv_heads']}) must divide "
                           f"heads ({a})")
    if out["window_attn_skip_freq"] and not out["sliding_window"]:
        raise CatalogError(f"{w('window_attn_skip_freq')}: set but sliding_window is 0 "
                           f"(give the window in tokens)")
    if bool(out["router_groups"]) != bool(out["router_group_topk"]):
        raise CatalogError(f"{w('router_group_topk')}: router_groups and router_group_topk go "
                           f"together (both > 0, or both 0 for unrestricted top-k)")
    if out["router_groups"] and (out["experts"] % out["router_groups"]
                                 or out["router_group_topk"] > out["router_groups"]):
        raise CatalogError(f"{w('router_groups')}: must divide experts ({out['experts']}) and "
                           f"be >= router_group_topk ({out['router_group_topk']})")
    if out["experts"] > 0:
        if out["top_k"] <= 0:
            raise CatalogError(f"{w('top_k')}: MoE (experts > 0) needs top_k > 0")
        if out["top_k"] > out["experts"]:
            raise CatalogError(f"{w('top_k')}: top_k ({out['top_k']}) exceeds experts "
                               f"({out['experts']})")
        if out["expert_ffn"] <= 0:
            raise CatalogError(f"{w('expert_ffn')}: MoE (experts > 0) needs expert_ffn > 0")
        if out["first_dense_layers"] >= out["layers"]:
            raise CatalogError(f"{w('first_dense_layers')}: must be < layers ({out['layers']})")
        if out["first_dense_layers"] > 0 and out["ffn"] <= 0:
            raise CatalogError(f"{w('ffn')}: dense layers (first_dense_layers > 0) need ffn > 0")
    else:
        for key in _MOE_FIELDS:
            if out[key]:
                raise CatalogError(f"{w(key)}: MoE field set but experts is 0")
        if out["ffn"] <= 0:
            raise CatalogError(f"{w('ffn')}: must be a positive integer, got {out['ffn']}")
    return ModelSpec(name=name, **out)


def _build_entries(entries: dict, build, file: str) -> dict:
    """Validate every entry of a catalog file into its spec, keyed by normalised id."""
    out = {}
    for key, entry in entries.items():
        name = _check_id(key, file)
        out[name] = build(entry, name, file)
    return out


def _lookup(kind: str, name: str, table: dict):
    """``table[name]`` (case-insensitive, ``_`` == ``-``) or a one-line did-you-mean error."""
    spec = table.get(_norm(name))
    if spec is None:
        raise _unknown(kind, name, table)
    return spec


@functools.lru_cache(maxsize=None)
def _models() -> dict[str, ModelSpec]:
    return _build_entries(_load_yaml(MODELS_FILE), _build_model, MODELS_FILE)


def get_model(name: str) -> ModelSpec:
    """The catalog model ``name`` (case-insensitive, ``_`` == ``-``)."""
    return _lookup("model", name, _models())


def model_names() -> list[str]:
    return list(_models())


def resolve_model(name) -> tuple[str | None, str]:
    """(catalog id or None, how it was read) for a model as a table names it: a published
    spelling ("Llama 3.1 8B"), a checkpoint ("Qwen/Qwen2.5-7B-Instruct") or a checkpoint with a
    catalog model's architecture (model_names.yaml); see sim_core/model_names.py."""
    return _model_names.resolve(name, _models())


def model_from_dict(d: dict, name: str = "inline") -> ModelSpec:
    """Build and validate an inline model, e.g. from YAML ``model: {layers: 32, ...}``.

    Keys are ModelSpec fields (layers, hidden, heads, kv_heads, ffn, vocab, activation,
    tied_embeddings, head_dim, seq_len, experts, top_k, expert_ffn, shared_experts,
    first_dense_layers, q_lora_rank, kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim,
    v_head_dim, sliding_window, window_attn_skip_freq, router_groups, router_group_topk,
    source) plus ``name`` and ``base`` (a catalog id whose fields are the defaults:
    ``{base: llama3-8b, layers: 16}``). Required (unless ``base``): layers, hidden, heads, ffn,
    vocab; ffn may be omitted for an all-MoE model (it then defaults to expert_ffn).
    """
    if isinstance(d, ModelSpec):
        return d
    if not isinstance(d, dict):
        raise CatalogError(f"model {name!r}: expected a mapping of fields, got {d!r}")
    for key in d:
        if key not in INLINE_MODEL_KEYS:
            hint = _suggest(str(key), INLINE_MODEL_KEYS)
            tail = f": did you mean {hint!r}?" if hint else ";"
            raise CatalogError(f"model {name!r}: unknown key {key!r}{tail} "
                               f"allowed: {', '.join(INLINE_MODEL_KEYS)}")
    d = dict(d)
    name = str(d.pop("name", name))
    base = d.pop("base", None)
    if base is not None:
        fields = dataclasses.asdict(get_model(base))
        fields.pop("name")
        fields["source"] = f"derived from catalog model {get_model(base).name!r}"
        fields.update(d)
        d = fields
    return _build_model(d, name, "inline model")


# ---------------------------------------------------------------------------------------------
# Parameter counts (used to check catalog shapes against advertised sizes)
# ---------------------------------------------------------------------------------------------
def _resolve_model(spec) -> ModelSpec:
    if isinstance(spec, ModelSpec):
        return spec
    if isinstance(spec, dict):
        return model_from_dict(spec)
    return get_model(spec)


def _layer_params(m: ModelSpec) -> tuple[int, int, int, int]:
    """(attention, dense MLP, one expert, norms) parameters of one layer."""
    h, a = m.hidden, m.heads
    kv = m.kv_heads or a
    if m.kv_lora_rank > 0:  # multi-head latent attention (DeepSeek-V2/V3)
        dqk = m.qk_nope_head_dim + m.qk_rope_head_dim
        q = (h * m.q_lora_rank + m.q_lora_rank * a * dqk) if m.q_lora_rank else h * a * dqk
        attn = (q + h * (m.kv_lora_rank + m.qk_rope_head_dim)
                + m.kv_lora_rank * a * (m.qk_nope_head_dim + m.v_head_dim)
                + a * m.v_head_dim * h)
    else:
        hd = m.head_dim or h // a
        attn = h * a * hd + 2 * h * kv * hd + a * hd * h
    mats = 3 if m.activation == "swiglu" else 2
    return attn, mats * h * m.ffn, mats * h * m.expert_ffn, 2 * h


def _count(m: ModelSpec, active: bool) -> int:
    attn, mlp, expert, norms = _layer_params(m)
    h = m.hidden
    embed = m.vocab * h * (1 if m.tied_embeddings else 2) + h  # + final norm
    if m.experts == 0:
        return m.layers * (attn + mlp + norms) + embed
    n_moe = m.layers - m.first_dense_layers
    routed = m.top_k if active else m.experts
    moe_layer = attn + norms + h * m.experts + (routed + m.shared_experts) * expert
    return m.first_dense_layers * (attn + mlp + norms) + n_moe * moe_layer + embed


def param_count(spec) -> int:
    """Total parameters incl. embedding and LM head (once if tied); biases and learned
    position embeddings are not counted. ``spec``: ModelSpec, catalog id or inline dict."""
    return _count(_resolve_model(spec), active=False)


def active_param_count(spec) -> int:
    """Parameters touched per token: dense part + top_k routed + shared experts (equals
    param_count for dense models); embeddings and LM head included."""
    return _count(_resolve_model(spec), active=True)


# ---------------------------------------------------------------------------------------------
# GPUs
# ---------------------------------------------------------------------------------------------
_GPU_KEYS = tuple(f.name for f in dataclasses.fields(GPUSpec) if f.name != "name")
_GPU_REQUIRED = tuple(f.name for f in dataclasses.fields(GPUSpec)
                      if f.name != "name" and f.default is dataclasses.MISSING)


def _build_gpu(d: dict, name: str, file: str) -> GPUSpec:
    _check_entry(d, name, file, _GPU_KEYS)
    for key in _GPU_REQUIRED:
        if key not in d or d[key] is None:
            raise CatalogError(f"{_where(file, name, key)}: required field is missing")
    w = functools.partial(_where, file, name)
    peaks = d["peak_tflops"]
    if not isinstance(peaks, dict):
        raise CatalogError(f"{w('peak_tflops')}: expected a mapping dtype -> TFLOP/s")
    for key in peaks:
        if key not in DTYPES + OPTIONAL_DTYPES:
            raise CatalogError(f"{w('peak_tflops')}: unknown dtype {key!r}; "
                               f"allowed: {', '.join(DTYPES + OPTIONAL_DTYPES)}")
    pk = {}
    for dt in DTYPES:
        if dt not in peaks:
            raise CatalogError(f"{w('peak_tflops')}: missing dtype {dt!r} (use 0 if unsupported)")
        pk[dt] = _as_float(peaks[dt], f"{w('peak_tflops')}[{dt}]", positive=dt == "bf16")
    for dt in OPTIONAL_DTYPES:
        if dt in peaks:
            pk[dt] = _as_float(peaks[dt], f"{w('peak_tflops')}[{dt}]", positive=True)
    if pk["fp8"] and pk["fp8"] < pk["bf16"]:
        raise CatalogError(f"{w('peak_tflops')}: fp8 peak below bf16 peak (dense figures?)")
    arch = _as_int(d["sm_arch"], w("sm_arch"), minimum=70)
    vendor = _norm(_as_str(d.get("vendor", "nvidia"), w("vendor")))
    if vendor not in VENDORS:
        raise CatalogError(f"{w('vendor')}: unknown vendor {d['vendor']!r}; "
                           f"allowed: {', '.join(VENDORS)}")
    return GPUSpec(
        name=name, peak_tflops=pk,
        hbm_gib=_as_float(d["hbm_gib"], w("hbm_gib"), positive=True),
        hbm_bw_gbs=_as_float(d["hbm_bw_gbs"], w("hbm_bw_gbs"), positive=True),
        sm_count=_as_int(d["sm_count"], w("sm_count"), minimum=1),
        sm_arch=arch,
        nvlink_bw_gbs=_as_float(d["nvlink_bw_gbs"], w("nvlink_bw_gbs"), positive=True),
        nvls=_as_bool(d["nvls"], w("nvls")),
        price_per_hour=_as_float(d["price_per_hour"], w("price_per_hour"), positive=False),
        tdp_w=_as_float(d.get("tdp_w", 0.0), w("tdp_w"), positive=False),
        source=_as_str(d.get("source", ""), w("source")),
        vendor=vendor,
        mesh_links=_as_int(d.get("mesh_links", 0), w("mesh_links"), minimum=0),
    )


@functools.lru_cache(maxsize=None)
def _gpus() -> dict[str, GPUSpec]:
    return _build_entries(_load_yaml(GPUS_FILE), _build_gpu, GPUS_FILE)


def get_gpu(name: str) -> GPUSpec:
    """The catalog entry for a catalog id or a product name as tools and tables print it
    ("AMD Instinct MI300X VF", "NVIDIA H100 80GB HBM3": sim_core/gpu_names.py), else a
    one-line did-you-mean error."""
    table = _gpus()
    if _norm(name) not in table and _gpu_names.ambiguous(name):
        raise _unknown("gpu", name, table)  # "h100": choose h100-sxm, h100-pcie, ...
    gid = _gpu_names.resolve(name, table)
    if gid in table:
        return table[gid]
    if gid:
        raise CatalogError(f"GPU {str(name)!r} is {gid}, which the catalog has no entry for; "
                           f"allowed: {', '.join(table)} (`sweep catalog gpus` lists them)")
    hint = _gpu_names.suggest(name, table)
    if hint:
        raise CatalogError(f"unknown gpu {str(name)!r}: did you mean {hint!r}? allowed: "
                           f"{', '.join(table)} (`sweep catalog gpus` lists them)")
    raise _unknown("gpu", name, table)


def resolve_gpu(name) -> str | None:
    """Catalog id of a GPU name (catalog id or product name), or None. Unlike get_gpu, a bare
    family name ("H100") is read as its first part (gpu_names.yaml `ambiguous`): run tables
    and log headers use it that way."""
    gid = _gpu_names.resolve(name, _gpus())
    return gid if gid in _gpus() else None


def gpu_names() -> list[str]:
    return list(_gpus())


def peak_tflops(gpu, dtype: str = "bf16") -> float:
    """Dense peak TFLOP/s of ``gpu`` (id or GPUSpec) for ``dtype``; fp8 on a GPU without FP8
    tensor cores (fp8 == 0) falls back to the bf16 peak; a block-scaled format the part does
    not have (mxfp4 on MI300X) is 0."""
    spec = gpu if isinstance(gpu, GPUSpec) else get_gpu(gpu)
    dt = _norm(dtype)
    if dt not in DTYPES + OPTIONAL_DTYPES:
        raise _unknown("dtype", dtype, DTYPES + OPTIONAL_DTYPES)
    value = spec.peak_tflops.get(dt, 0.0)
    if dt == "fp8" and value <= 0:
        return spec.peak_tflops["bf16"]
    return value


# ---------------------------------------------------------------------------------------------
# Clusters
# ---------------------------------------------------------------------------------------------
_CLUSTER_KEYS = tuple(f.name for f in dataclasses.fields(ClusterSpec) if f.name != "name")


def _build_cluster(d: dict, name: str, file: str) -> ClusterSpec:
    _check_entry(d, name, file, _CLUSTER_KEYS)
    w = functools.partial(_where, file, name)
    if "gpu" not in d or d["gpu"] is None:
        raise CatalogError(f"{w('gpu')}: required field is missing")
    gpus = _gpus()
    gpu = _norm(_as_str(d["gpu"], w("gpu")))
    if gpu not in gpus:
        hint = _suggest(gpu, gpus)
        tail = f": did you mean {hint!r}?" if hint else ";"
        raise CatalogError(f"{w('gpu')}: unknown gpu {d['gpu']!r}{tail} "
                           f"allowed: {', '.join(gpus)}")
    defaults = {f.name: f.default for f in dataclasses.fields(ClusterSpec)}
    get = lambda k: d.get(k, defaults[k])  # noqa: E731
    gpn = _as_int(get("gpus_per_node"), w("gpus_per_node"), minimum=1)
    return ClusterSpec(
        name=name, gpu=gpu, gpus_per_node=gpn,
        nics_per_node=_as_int(get("nics_per_node"), w("nics_per_node"), minimum=1),
        nic_bw_gbs=_as_float(get("nic_bw_gbs"), w("nic_bw_gbs"), positive=True),
        intra_latency_us=_as_float(get("intra_latency_us"), w("intra_latency_us"), positive=True),
        inter_latency_us=_as_float(get("inter_latency_us"), w("inter_latency_us"), positive=True),
        source=_as_str(get("source"), w("source")),
    )


@functools.lru_cache(maxsize=None)
def _clusters() -> tuple[dict[str, ClusterSpec], dict[str, str]]:
    raw = _load_yaml(CLUSTERS_FILE)
    for key in raw:
        if key not in ("clusters", "defaults"):
            raise CatalogError(f"{CLUSTERS_FILE}: unknown top-level key {key!r}; "
                               f"expected 'clusters' and 'defaults'")
    entries = raw.get("clusters") or {}
    if not isinstance(entries, dict):
        raise CatalogError(f"{CLUSTERS_FILE}: 'clusters' must be a mapping")
    clusters = _build_entries(entries, _build_cluster, CLUSTERS_FILE)
    raw_defaults = raw.get("defaults") or {}
    if not isinstance(raw_defaults, dict):
        raise CatalogError(f"{CLUSTERS_FILE}: 'defaults' must be a mapping gpu -> cluster")
    defaults = {}
    gpus = _gpus()
    for gpu, cl in raw_defaults.items():
        g, c = _norm(gpu), _norm(cl)
        where = f"{CLUSTERS_FILE}: defaults: entry {str(gpu)!r}"
        if g not in gpus:
            raise CatalogError(f"{where}: unknown gpu {str(gpu)!r}")
        if c not in clusters:
            raise CatalogError(f"{where}: unknown cluster {str(cl)!r}")
        if clusters[c].gpu != g:
            raise CatalogError(f"{where}: cluster {c!r} has gpu {clusters[c].gpu!r}, not {g!r}")
        defaults[g] = c
    missing = [g for g in gpus if g not in defaults]
    if missing:
        raise CatalogError(f"{CLUSTERS_FILE}: defaults: no default cluster for gpu(s) "
                           f"{', '.join(missing)}")
    return clusters, defaults


def get_cluster(name: str) -> ClusterSpec:
    """A catalog cluster, or a cloud instance type seen as a cluster (``aws-p5``)."""
    clusters = _clusters()[0]
    if _norm(name) not in clusters and (_norm(name) in _instances()[0]
                                        or _norm(name) in _instances()[1]):
        return instance_cluster(name)
    return _lookup("cluster", name, clusters)


def cluster_names() -> list[str]:
    return list(_clusters()[0])


def default_cluster_for_gpu(gpu: str) -> ClusterSpec:
    """The cluster whose NIC/latency figures a bare ``{gpu: ..., num_gpus: ...}`` gets."""
    spec = get_gpu(gpu)
    clusters, defaults = _clusters()
    return clusters[defaults[spec.name]]


def cluster_from_dict(d: dict, name: str | None = None) -> ClusterSpec:
    """Resolve a YAML ``cluster:`` mapping to a ClusterSpec.

    ``{name: dgx-h100}`` takes a catalog cluster; ``{gpu: h100-sxm}`` takes the GPU's default
    cluster; any ClusterSpec field given (gpus_per_node, nics_per_node, nic_bw_gbs,
    intra_latency_us, inter_latency_us) overrides it. Run-level keys such as ``num_gpus`` are
    ignored here. A ``gpu`` that differs from the named cluster's GPU keeps the cluster's
    network but swaps the GPU.
    """
    if not isinstance(d, dict):
        raise CatalogError(f"cluster: expected a mapping, got {d!r}")
    d = dict(d)
    cname = d.pop("name", None) or d.pop("cluster", None)
    if cname is not None:
        base = get_cluster(cname)
    elif d.get("gpu") is not None:
        base = default_cluster_for_gpu(d["gpu"])
    else:
        raise CatalogError("cluster: give a cluster 'name' or a 'gpu'")
    ignored = {"num_gpus", "num_nodes"}
    fields = dataclasses.asdict(base)
    fields.pop("name")
    for key, value in d.items():
        if key in ignored:
            continue
        if key not in _CLUSTER_KEYS:
            allowed = ("name", "gpu") + tuple(k for k in _CLUSTER_KEYS if k != "gpu")
            hint = _suggest(str(key), allowed + tuple(ignored))
            tail = f": did you mean {hint!r}?" if hint else ";"
            raise CatalogError(f"cluster: unknown key {key!r}{tail} "
                               f"allowed: {', '.join(allowed + tuple(sorted(ignored)))}")
        if value is not None:
            fields[key] = value
    return _build_cluster(fields, name or base.name, "inline cluster")


# ---------------------------------------------------------------------------------------------
# Cloud instance types
# ---------------------------------------------------------------------------------------------
TRANSPORTS = ("efa", "tcpx", "tcpxo", "roce", "infiniband")
PRICE_KINDS = ("on-demand", "capacity-block", "catalog")
_INSTANCE_KEYS = ("provider", "type", "gpu", "gpus_per_node", "nics_per_node", "nic_gbps",
                  "transport", "inter_latency_us", "price_per_gpu_hour", "price_kind",
                  "price_date", "price_source", "assumed", "source")
_INSTANCE_REQUIRED = ("provider", "type", "gpu", "gpus_per_node", "nics_per_node", "nic_gbps",
                      "transport", "source")


def _build_transport(d: dict, name: str, file: str) -> dict:
    w = functools.partial(_where, file, f"transports.{name}")
    if name not in TRANSPORTS:
        raise CatalogError(f"{file}: transports: unknown transport {name!r}; "
                           f"allowed: {', '.join(TRANSPORTS)}")
    if not isinstance(d, dict) or set(d) - {"inter_latency_us", "basis", "source"}:
        raise CatalogError(f"{w('(fields)')}: expected inter_latency_us, basis, source")
    basis = _as_str(d.get("basis", ""), w("basis"))
    if basis not in ("nccl-constant", "catalog-convention", "assumption", "measured"):
        raise CatalogError(f"{w('basis')}: expected nccl-constant, catalog-convention, "
                           f"assumption or measured, got {basis!r}")
    return {"inter_latency_us": _as_float(d.get("inter_latency_us"), w("inter_latency_us"),
                                          positive=True),
            "basis": basis, "source": _as_str(d.get("source", ""), w("source"))}


def _build_instance(d: dict, name: str, file: str, transports: dict) -> InstanceSpec:
    _check_entry(d, name, file, _INSTANCE_KEYS)
    w = functools.partial(_where, file, name)
    for key in _INSTANCE_REQUIRED:
        if d.get(key) is None:
            raise CatalogError(f"{w(key)}: required field is missing")
    transport = _as_str(d["transport"], w("transport"))
    if transport not in transports:
        raise CatalogError(f"{w('transport')}: unknown transport {transport!r}; "
                           f"allowed: {', '.join(transports)}")
    if d.get("inter_latency_us") is not None:
        lat, basis = _as_float(d["inter_latency_us"], w("inter_latency_us"), positive=True), "given"
    else:
        lat, basis = transports[transport]["inter_latency_us"], transports[transport]["basis"]
    price = d.get("price_per_gpu_hour")
    kind, date, psrc = (d.get(k, "") or "" for k in ("price_kind", "price_date", "price_source"))
    if price is not None:
        price = _as_float(price, w("price_per_gpu_hour"), positive=True)
        if kind not in PRICE_KINDS:
            raise CatalogError(f"{w('price_kind')}: expected one of {', '.join(PRICE_KINDS)}, "
                               f"got {kind!r}")
        for key, value in (("price_date", date), ("price_source", psrc)):
            if not _as_str(value, w(key)).strip():
                raise CatalogError(f"{w(key)}: a price needs its {key[6:]} (no source, no price)")
    assumed = d.get("assumed") or []
    if not isinstance(assumed, list) or not all(a in _INSTANCE_KEYS for a in assumed):
        raise CatalogError(f"{w('assumed')}: expected a list of field names")
    return InstanceSpec(
        name=name, provider=_as_str(d["provider"], w("provider")),
        type=_as_str(d["type"], w("type")), gpu=_norm(_as_str(d["gpu"], w("gpu"))),
        gpus_per_node=_as_int(d["gpus_per_node"], w("gpus_per_node"), minimum=1),
        nics_per_node=_as_int(d["nics_per_node"], w("nics_per_node"), minimum=1),
        nic_gbps=_as_float(d["nic_gbps"], w("nic_gbps"), positive=True),
        transport=transport, inter_latency_us=lat, latency_basis=basis,
        price_per_gpu_hour=price, price_kind=str(kind), price_date=str(date),
        price_source=str(psrc), assumed=tuple(assumed),
        source=_as_str(d["source"], w("source")))


@functools.lru_cache(maxsize=None)
def _instances() -> tuple[dict[str, InstanceSpec], dict[str, InstanceSpec], dict]:
    """(usable instances, instances whose GPU the GPU catalog lacks, transports)."""
    raw = _load_yaml(INSTANCES_FILE)
    for key in raw:
        if key not in ("transports", "instances"):
            raise CatalogError(f"{INSTANCES_FILE}: unknown top-level key {key!r}; "
                               f"expected 'transports' and 'instances'")
    transports = {str(k): _build_transport(v, str(k), INSTANCES_FILE)
                  for k, v in (raw.get("transports") or {}).items()}
    entries = raw.get("instances") or {}
    if not isinstance(entries, dict):
        raise CatalogError(f"{INSTANCES_FILE}: 'instances' must be a mapping")
    built = _build_entries(entries, lambda d, n, f: _build_instance(d, n, f, transports),
                           INSTANCES_FILE)
    gpus = _gpus()
    usable = {k: v for k, v in built.items() if v.gpu in gpus}
    missing = {k: v for k, v in built.items() if v.gpu not in gpus}
    return usable, missing, transports


def get_instance(name: str) -> InstanceSpec:
    """The catalog instance type ``name`` (case-insensitive, ``_`` == ``-``)."""
    usable, missing, _ = _instances()
    spec = missing.get(_norm(name))
    if spec is not None:
        raise CatalogError(f"instance {spec.name!r} needs gpu {spec.gpu!r}, which the GPU "
                           f"catalog does not have (see `sweep catalog gpus`)")
    return _lookup("instance", name, usable)


def instance_names() -> list[str]:
    return list(_instances()[0])


def unavailable_instances() -> dict[str, InstanceSpec]:
    """Instances listed in instances.yaml whose GPU the GPU catalog lacks (not usable)."""
    return dict(_instances()[1])


def transports() -> dict:
    return dict(_instances()[2])


def instance_cluster(name: str) -> ClusterSpec:
    """The instance type as a ClusterSpec (network figures; the intra-node latency from the
    GPU's default cluster), for the NCCL model and `sweep calibrate nccl --cluster`."""
    inst = get_instance(name)
    base = default_cluster_for_gpu(inst.gpu)
    return ClusterSpec(name=inst.name, gpu=inst.gpu, gpus_per_node=inst.gpus_per_node,
                       nics_per_node=inst.nics_per_node, nic_bw_gbs=inst.nic_bw_gbs,
                       intra_latency_us=base.intra_latency_us,
                       inter_latency_us=inst.inter_latency_us,
                       source=f"instance {inst.name} ({inst.provider} {inst.type})")


# ---------------------------------------------------------------------------------------------
# Vectorized lookup table
# ---------------------------------------------------------------------------------------------
GEMM_CEILINGS_FILE = "data/kernels/published/rocm_gemm_ceilings.csv"


@functools.lru_cache(maxsize=None)
def gemm_ceilings() -> dict:
    """{gpu: {"bf16": f, "fp8": f}}: the compute model's gemm_max for GPUs with a published
    GEMM ceiling (data/kernels/published, each row cited): the published TFLOP/s over the
    dense peak, divided by the curve's K factor at the published shape. Its wave factor is
    left out: a "max-achievable" figure is the best shape's, a full last wave."""
    import io
    from importlib import resources

    import numpy as np
    import pandas as pd

    text = resources.files("sim_core").joinpath(GEMM_CEILINGS_FILE).read_text()
    df = pd.read_csv(io.StringIO(text), comment="#")
    out: dict = {}
    table = _load_yaml("efficiency.yaml")["arch"]
    for r in df.itertuples():
        spec = get_gpu(r.gpu)
        dt = "fp8" if r.dtype == "fp8" else "bf16"
        k_half = table[spec.sm_arch]["gemm_k_half"][dt]
        shape = float(r.k) / (float(r.k) + k_half)  # compute.gemm_curve's K factor
        frac = float(r.tflops) / peak_tflops(spec, dt)
        out.setdefault(spec.name, {})[dt] = float(np.round(frac / shape, 4))
    return out


ATTENTION_LEVELS_FILE = "data/kernels/published/attention_gpu_levels.csv"


@functools.lru_cache(maxsize=None)
def attention_scales() -> dict:
    """{gpu: {"fa2": s, "fa3": s}}: how much higher a fraction of its own bf16 peak flash
    attention reaches on a GPU with a published level (data/kernels/published/
    attention_gpu_levels.csv, rows `use == level`, each cited) than on H100/H200, where the
    compute model's curves were measured: the published TFLOP/s over the GPU's dense peak,
    divided by the family's Hopper kernel-level maximum (`ref_level`). A part whose tensor
    rate per SM is cut (H20: 148 TFLOP/s on 78 SMs, a quarter of H100's per SM) keeps the
    units that run attention's softmax, so attention loses less to them than on H100."""
    import io
    from importlib import resources

    import pandas as pd

    text = resources.files("sim_core").joinpath(ATTENTION_LEVELS_FILE).read_text()
    df = pd.read_csv(io.StringIO(text), comment="#")
    out: dict = {}
    for r in df[df["use"] == "level"].itertuples():
        spec = get_gpu(r.gpu)
        frac = float(r.tflops) / peak_tflops(spec, "bf16")
        out.setdefault(spec.name, {})[r.kernel] = round(frac / float(r.ref_level), 4)
    return out


@functools.lru_cache(maxsize=None)
def _gpu_table():
    import pandas as pd

    ceilings = gemm_ceilings()
    attn = attention_scales()
    rows = []
    for name, g in _gpus().items():
        c = default_cluster_for_gpu(name)
        has_fp8 = g.peak_tflops["fp8"] > 0
        rows.append(dict(
            gpu=name,
            peak_bf16=g.peak_tflops["bf16"],
            peak_fp8=g.peak_tflops["fp8"] if has_fp8 else g.peak_tflops["bf16"],
            peak_tf32=g.peak_tflops["tf32"],
            peak_fp32=g.peak_tflops["fp32"],
            has_fp8=has_fp8,
            # dense FP4 tensor peaks (0 where the part has no such format: sim_core/fp4.py)
            peak_nvfp4=g.peak_tflops.get("nvfp4", 0.0),
            peak_mxfp4=g.peak_tflops.get("mxfp4", 0.0),
            hbm_gib=g.hbm_gib, hbm_bw_gbs=g.hbm_bw_gbs,
            sm_count=g.sm_count, sm_arch=g.sm_arch,
            nvlink_bw_gbs=g.nvlink_bw_gbs, nvls=g.nvls,
            mesh_links=g.mesh_links, rocm=g.vendor == "amd",
            gemm_max_bf16=ceilings.get(name, {}).get("bf16", 0.0),
            gemm_max_fp8=ceilings.get(name, {}).get("fp8", 0.0),
            # flash attention's level relative to Hopper's curves (attention_scales; 1 = none)
            attn_scale_fa2=attn.get(name, {}).get("fa2", 1.0),
            attn_scale_fa3=attn.get(name, {}).get("fa3", 1.0),
            price_per_hour=g.price_per_hour, tdp_w=g.tdp_w,
            default_cluster=c.name, gpus_per_node=c.gpus_per_node,
            nics_per_node=c.nics_per_node, nic_bw_gbs=c.nic_bw_gbs,
            intra_latency_us=c.intra_latency_us, inter_latency_us=c.inter_latency_us,
        ))
    return pd.DataFrame(rows).set_index("gpu", drop=False)


def gpu_table():
    """One row per GPU (index = gpu id): peak_bf16, peak_fp8 (bf16 fallback where the GPU has
    no FP8; see has_fp8), peak_tf32, peak_fp32, hbm_gib, hbm_bw_gbs, sm_count, sm_arch,
    nvlink_bw_gbs, nvls, mesh_links, rocm (an AMD part: ROCm/RCCL), price_per_hour, tdp_w,
    gemm_max_bf16 / gemm_max_fp8 (measured GEMM ceiling as a fraction of peak, from
    data/kernels/gemm_ceilings.csv; 0 where none is stored), attn_scale_fa2 / attn_scale_fa3
    (attention_scales; 1 where none is published), and from the GPU's default cluster:
    default_cluster, gpus_per_node, nics_per_node, nic_bw_gbs, intra_latency_us,
    inter_latency_us. Returns a copy (safe to modify)."""
    return _gpu_table().copy()


# ---------------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------------
def _load_yaml(filename: str) -> dict:
    import yaml

    path = CATALOG_DIR / filename
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CatalogError(f"{filename}: cannot read catalog file {path}: {exc}") from exc
    try:
        data = catalog_yaml.read(text)
    except yaml.YAMLError as exc:
        raise CatalogError(f"{filename}: invalid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise CatalogError(f"{filename}: top level must be a mapping of entries")
    return data


def _check_id(key, filename: str) -> str:
    name = str(key)
    if name != _norm(name):
        raise CatalogError(f"{filename}: entry {name!r}: ids must be lower-case with dashes "
                           f"(use {_norm(name)!r})")
    return name


def clear_cache() -> None:
    """Forget loaded catalogs (tests that patch CATALOG_DIR call this)."""
    for fn in (_models, _gpus, _clusters, _gpu_table, _instances, gemm_ceilings):
        fn.cache_clear()
