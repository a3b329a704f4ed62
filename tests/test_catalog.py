"""Catalog loader: contents, advertised sizes, validation and error messages."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from sim_core import catalog
from sim_core.catalog import CatalogError
from sim_core.specs import ACTIVATION, ClusterSpec, GPUSpec, ModelSpec

B = 1e9


# ---------------------------------------------------------------------------------------------
# Contents
# ---------------------------------------------------------------------------------------------
REQUIRED_MODELS = [
    "gpt3-1.7b", "gpt3-3.6b", "gpt3-7.5b", "gpt3-18b", "gpt3-39b", "gpt3-76b", "gpt3-145b",
    "gpt3-175b", "gpt3-310b", "gpt3-530b", "gpt3-1t", "gpt3-5b", "gpt3-20b",
    "megatron-gpt-1.7b", "megatron-gpt-462b",
    "llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b", "llama3-70b", "llama3.1-8b",
    "llama3.1-70b", "llama3.1-405b",
    "mpt-1b", "mpt-3b", "mpt-7b", "mpt-13b", "mpt-30b", "mpt-70b",
    "nemotron-4-340b", "nemotron-8b", "nemotron-22b",
    "mixtral-8x7b", "mixtral-8x22b", "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3",
    "gpt-oss-120b", "gpt-oss-20b", "kimi-k2", "deepseek-v2", "deepseek-v2-lite",
]
REQUIRED_GPUS = ["a100-40gb", "a100-80gb", "h100-sxm", "h100-96gb", "h800", "h200", "b200",
                 "gb200"]
REQUIRED_CLUSTERS = ["dgx-a100", "dgx-h100", "dgx-h800", "hgx-h200", "dgx-b200",
                     "llm-foundry-a100-80gb"]


def test_required_entries_present():
    assert set(REQUIRED_MODELS) <= set(catalog.model_names())
    assert set(REQUIRED_GPUS) <= set(catalog.gpu_names())
    assert set(REQUIRED_CLUSTERS) <= set(catalog.cluster_names())


@pytest.mark.parametrize("name", sorted(set(catalog.model_names())))
def test_every_model_is_valid_and_sourced(name):
    m = catalog.get_model(name)
    assert isinstance(m, ModelSpec) and m.name == name
    assert m.source.strip(), f"{name} has no source"
    assert m.activation in ACTIVATION
    assert m.kv_heads > 0 and m.heads % m.kv_heads == 0
    assert m.seq_len > 0
    if m.experts:
        assert 0 < m.top_k <= m.experts and m.expert_ffn > 0
    # columns() feeds the run frame: every field but source, model id under "model"
    cols = m.columns()
    assert cols["model"] == name and "source" not in cols


@pytest.mark.parametrize("name", sorted(set(catalog.gpu_names())))
def test_every_gpu_is_valid_and_sourced(name):
    g = catalog.get_gpu(name)
    assert isinstance(g, GPUSpec) and g.source.strip()
    # the four required dtypes, plus block-scaled formats only where a datasheet gives them
    assert {"fp32", "tf32", "bf16", "fp8"} <= set(g.peak_tflops)
    assert set(g.peak_tflops) <= set(catalog.DTYPES + catalog.OPTIONAL_DTYPES)
    # tf32 0 only on CDNA4 (no TF32 in hardware: emulated through BF16) and CDNA2 (gfx90a:
    # FP32 matrix, no TF32 datatype)
    assert g.peak_tflops["bf16"] > g.peak_tflops["tf32"] > g.peak_tflops["fp32"] > 0 or \
        (g.sm_arch in (910, 950, 2201) and g.peak_tflops["tf32"] == 0)
    assert all(g.peak_tflops[d] >= g.peak_tflops["fp8"] for d in catalog.OPTIONAL_DTYPES
               if d in g.peak_tflops)
    # 2201: Huawei's DaVinci dav-c220 (CANN NpuArch; the Ascend 910C die, ascend-a3)
    assert g.sm_arch in (80, 90, 100, 910, 942, 950, 2201)
    assert (g.vendor == "amd") == (900 < g.sm_arch < 1000)
    assert (g.vendor == "huawei") == (g.sm_arch == 2201)
    # AMD nodes are full Infinity Fabric meshes from CDNA3 on; MI250X's GCDs are not (rings)
    assert (g.mesh_links > 0) == (940 < g.sm_arch < 1000)
    # a price of 0 only where the entry says no public price was found (give --price)
    assert g.price_per_hour > 0 or "no public on-demand price" in g.source.lower()
    # a power of 0 only where the entry says no public figure was found (ascend-a3)
    assert g.tdp_w > 0 or "no public power figure" in g.source.lower()
    assert catalog.default_cluster_for_gpu(name).gpu == name


@pytest.mark.parametrize("name", sorted(set(catalog.cluster_names())))
def test_every_cluster_is_valid_and_sourced(name):
    c = catalog.get_cluster(name)
    assert isinstance(c, ClusterSpec) and c.source.strip()
    assert c.gpu in catalog.gpu_names()
    assert c.nics_per_node >= 1 and c.nic_bw_gbs > 0
    assert 0 < c.intra_latency_us <= c.inter_latency_us


def test_gpu_figures():
    a100, h100, h800, b200 = (catalog.get_gpu(n) for n in ("a100-80gb", "h100-sxm", "h800", "b200"))
    assert a100.peak_tflops["bf16"] == 312 and a100.peak_tflops["fp8"] == 0
    assert h100.peak_tflops["bf16"] == pytest.approx(989, rel=0.01)
    assert h100.peak_tflops["fp8"] == pytest.approx(2 * h100.peak_tflops["bf16"], rel=1e-3)
    assert b200.peak_tflops["bf16"] == 2250
    assert catalog.get_gpu("h200").peak_tflops == h100.peak_tflops
    assert {g.name: g.nvlink_bw_gbs for g in (a100, h100, h800, b200)} == {
        "a100-80gb": 300, "h100-sxm": 450, "h800": 200, "b200": 900}
    assert 79 < h100.hbm_gib < 80 and 79 < a100.hbm_gib < 80  # torch-reported GiB
    assert catalog.get_gpu("h200").hbm_gib > 139
    # the 500 W HBM2e part is slower than the 700 W SXM and has more memory
    h96 = catalog.get_gpu("h100-96gb")
    assert h96.tdp_w == 500 and h96.peak_tflops["bf16"] < h100.peak_tflops["bf16"]
    assert h96.hbm_gib > h100.hbm_gib and h96.hbm_bw_gbs < h100.hbm_bw_gbs


def test_cluster_figures():
    assert catalog.get_cluster("dgx-a100").nic_bw_gbs == 25
    assert catalog.get_cluster("dgx-h100").nic_bw_gbs == 50
    assert catalog.get_cluster("dgx-b200").nics_per_node == 8
    foundry = catalog.get_cluster("llm-foundry-a100-80gb")
    assert foundry.nics_per_node * foundry.nic_bw_gbs * 8 == 1600  # 1600 Gbps RoCE per node
    assert catalog.default_cluster_for_gpu("h100-sxm").name == "dgx-h100"
    assert catalog.default_cluster_for_gpu("A100_80GB").name == "dgx-a100"


# ---------------------------------------------------------------------------------------------
# Advertised sizes
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, total, tol", [
    ("gpt3-1.7b", 1.7, 0.04), ("gpt3-7.5b", 7.5, 0.02), ("gpt3-18b", 18.4, 0.02),
    ("gpt3-39b", 39.1, 0.02), ("gpt3-76b", 76.1, 0.02), ("gpt3-145b", 145.6, 0.02),
    ("gpt3-175b", 175.0, 0.02), ("gpt3-310b", 310.1, 0.02), ("gpt3-530b", 529.6, 0.02),
    ("gpt3-1t", 1008.0, 0.02), ("gpt3-5b", 5.0, 0.03), ("gpt3-20b", 20.0, 0.03),
    ("megatron-gpt-1.7b", 1.7, 0.03), ("megatron-gpt-7.1b", 7.1, 0.02),
    ("megatron-gpt-16b", 16, 0.02), ("megatron-gpt-32b", 32, 0.02),
    ("megatron-gpt-70b", 70, 0.02), ("megatron-gpt-119b", 119, 0.02),
    ("megatron-gpt-177b", 177, 0.02), ("megatron-gpt-314b", 314, 0.02),
    ("megatron-gpt-462b", 462, 0.02),
    ("llama2-7b", 6.74, 0.02), ("llama2-13b", 13.0, 0.02), ("llama2-70b", 69.0, 0.02),
    ("llama3-8b", 8.03, 0.02), ("llama3-70b", 70.6, 0.02), ("llama3.1-405b", 405.0, 0.02),
    ("mpt-1b", 1.3, 0.03), ("mpt-3b", 2.65, 0.03), ("mpt-7b", 6.7, 0.02),
    ("mpt-13b", 12.9, 0.02), ("mpt-30b", 30.0, 0.02), ("mpt-70b", 64.9, 0.02),
    ("nemotron-4-340b", 340.0, 0.02), ("nemotron-8b", 8.5, 0.05), ("nemotron-22b", 22.0, 0.05),
    ("mixtral-8x7b", 46.7, 0.02), ("mixtral-8x22b", 141.0, 0.02),
    ("qwen3-30b-a3b", 30.5, 0.02), ("qwen3-235b-a22b", 235.0, 0.02),
    ("qwen2.5-0.5b", 0.49, 0.03), ("qwen3-4b", 4.0, 0.03), ("qwen3-8b", 8.2, 0.02),
    ("qwen3-14b", 14.8, 0.02),
    ("deepseek-v3", 671.0, 0.02), ("gpt-oss-120b", 116.8, 0.02),
    ("gpt-oss-20b", 20.9, 0.02), ("kimi-k2", 1040.0, 0.02), ("deepseek-v2", 236.0, 0.02),
    ("deepseek-v2-lite", 15.7, 0.02),
    # models the RL frameworks' examples train (issue 40); sizes from the model cards
    ("qwen3-0.6b", 0.6, 0.02), ("qwen3-1.7b", 1.7, 0.02), ("qwen2.5-1.5b", 1.54, 0.02),
    ("qwen2.5-3b", 3.09, 0.02), ("qwen2.5-14b", 14.7, 0.02), ("qwen2.5-72b", 72.7, 0.02),
    ("mistral-7b-v0.1", 7.24, 0.02), ("mistral-nemo-12b", 12.2, 0.02),
    ("deepseek-llm-7b", 7.0, 0.02),
    # GLM-4.5's 355B counts its MTP layer, which the catalog leaves out (as for DeepSeek-V3)
    ("glm-4.5", 355.0, 0.02), ("glm-4.5-air", 106.0, 0.02), ("glm-4.7-flash", 30.0, 0.02),
    ("moonlight-16b-a3b", 16.0, 0.02), ("gemma-3-1b", 1.0, 0.02),
    ("mistral-small-24b", 24.0, 0.02),
    # issue 40 RL checkpoints: Qwen3-Coder model card 480B; Mistral-7B-v0.3 7.25B on the hub
    ("qwen3-coder-480b-a35b", 480.0, 0.02), ("mistral-7b-v0.3", 7.25, 0.02),
])
def test_total_params_match_advertised(name, total, tol):
    assert catalog.param_count(name) / B == pytest.approx(total, rel=tol)


@pytest.mark.parametrize("name, active, tol", [
    ("mixtral-8x7b", 12.9, 0.03), ("mixtral-8x22b", 39.0, 0.03),
    ("qwen3-30b-a3b", 3.3, 0.04), ("qwen3-235b-a22b", 22.0, 0.03),
    ("deepseek-v3", 37.0, 0.03),
    # OpenAI's 5.1B excludes the input embedding; ours counts both embedding matrices
    ("gpt-oss-120b", 5.13 + 0.58, 0.03),
    ("kimi-k2", 32.0, 0.04), ("deepseek-v2", 21.0, 0.04),
    # DeepSeek's 2.4B, like OpenAI's figure, leaves out the input embedding (0.21B)
    ("deepseek-v2-lite", 2.4 + 0.21, 0.03),
    # Zhipu's 32B / 12B active leave out both embedding matrices (1.55B / 1.24B)
    ("glm-4.5", 32.0 + 1.55, 0.03), ("glm-4.5-air", 12.0 + 1.24, 0.03),
    ("moonlight-16b-a3b", 3.0, 0.03),
    # Qwen3-Coder model card: 35B activated
    ("qwen3-coder-480b-a35b", 35.0, 0.02),
])
def test_active_params_match_advertised(name, active, tol):
    assert catalog.active_param_count(name) / B == pytest.approx(active, rel=tol)


def test_dense_active_equals_total():
    for name in ("llama3-8b", "gpt3-175b", "mpt-7b"):
        assert catalog.active_param_count(name) == catalog.param_count(name)


def test_param_count_accepts_spec_and_dict():
    spec = catalog.get_model("llama3-8b")
    inline = {k: v for k, v in dataclasses.asdict(spec).items() if k not in ("name", "source")}
    assert catalog.param_count(spec) == catalog.param_count(inline) == catalog.param_count("llama3-8b")


# ---------------------------------------------------------------------------------------------
# Lookup and error messages
# ---------------------------------------------------------------------------------------------
def test_lookup_is_case_and_separator_insensitive():
    assert catalog.get_model("Llama3_70B").name == "llama3-70b"
    assert catalog.get_model(" LLAMA3.1-405B ").name == "llama3.1-405b"
    assert catalog.get_gpu("H100_SXM").name == "h100-sxm"
    assert catalog.get_cluster("DGX_H100").name == "dgx-h100"


def test_unknown_gpu_message():
    # a bare family name is several parts: a file or flag must choose (a run table's "H100"
    # is read as the SXM part: catalog.resolve_gpu)
    assert catalog.resolve_gpu("H100") == "h100-sxm"
    for bad in ("h100", "h1000"):
        with pytest.raises(CatalogError) as exc:
            catalog.get_gpu(bad)
        msg = str(exc.value)
        assert "\n" not in msg
        assert msg.startswith(f"unknown gpu '{bad}': did you mean 'h100-sxm'? allowed: a100-40gb, "
                              "a100-80gb")
    assert "b200" in msg


@pytest.mark.parametrize("getter, kind, bad, hint", [
    (catalog.get_model, "model", "llama3-7b", "llama3-70b"),
    (catalog.get_model, "model", "deepseek_v3x", "deepseek-v3"),
    (catalog.get_model, "model", "mixtral", "mixtral-8x7b"),
    (catalog.get_cluster, "cluster", "dgx-h10", "dgx-h100"),
    # "B100" is as near b300 (issue 26) as b200 now: a name with one nearest entry
    (catalog.get_gpu, "gpu", "B20", "b200"),
])
def test_unknown_name_suggests(getter, kind, bad, hint):
    with pytest.raises(CatalogError, match=f"unknown {kind} '{bad}': did you mean '{hint}'"):
        getter(bad)


def test_unknown_without_suggestion_lists_allowed():
    with pytest.raises(CatalogError) as exc:
        catalog.get_gpu("tpu-v5p")
    msg = str(exc.value)
    assert "did you mean" not in msg and "allowed: a100-40gb" in msg and "\n" not in msg


def test_catalog_error_is_value_error():
    assert issubclass(CatalogError, ValueError)


# ---------------------------------------------------------------------------------------------
# Inline models
# ---------------------------------------------------------------------------------------------
LLAMA_LIKE = dict(layers=4, hidden=1024, heads=16, kv_heads=4, ffn=4096, vocab=32000,
                  activation="swiglu")


def test_model_from_dict_ok():
    m = catalog.model_from_dict(LLAMA_LIKE, name="tiny")
    assert m.name == "tiny" and m.kv_heads == 4 and m.activation == "swiglu"
    m2 = catalog.model_from_dict({k: v for k, v in LLAMA_LIKE.items() if k != "kv_heads"})
    assert m2.name == "inline" and m2.kv_heads == 16  # omitted kv_heads = heads


def test_model_from_dict_base():
    m = catalog.model_from_dict({"base": "llama3-8b", "layers": 16}, name="half")
    assert m.layers == 16 and m.hidden == 4096 and m.kv_heads == 8 and m.name == "half"


def test_model_from_dict_moe_and_mla():
    d = dict(LLAMA_LIKE, experts=8, top_k=2, expert_ffn=1024)
    del d["ffn"]  # all-MoE: ffn defaults to expert_ffn
    assert catalog.model_from_dict(d).ffn == 1024
    mla = {k: v for k, v in dataclasses.asdict(catalog.get_model("deepseek-v3")).items()
           if k not in ("name", "source")}
    assert catalog.param_count(catalog.model_from_dict(mla)) == catalog.param_count("deepseek-v3")


def test_model_from_dict_unknown_key_suggests():
    with pytest.raises(CatalogError, match=r"unknown key 'hidden_size': did you mean 'hidden'\?"):
        catalog.model_from_dict(dict(LLAMA_LIKE, hidden_size=1024))
    with pytest.raises(CatalogError, match="did you mean 'kv_heads'"):
        catalog.model_from_dict(dict(LLAMA_LIKE, kv_head=4))


def test_model_from_dict_missing_required():
    d = {k: v for k, v in LLAMA_LIKE.items() if k != "vocab"}
    with pytest.raises(CatalogError, match="'vocab': required field is missing"):
        catalog.model_from_dict(d)


@pytest.mark.parametrize("change, field, text", [
    ({"layers": 0}, "layers", "positive integer"),
    ({"layers": -3}, "layers", "positive integer"),
    ({"hidden": 1024.5}, "hidden", "expected an integer"),
    ({"heads": "16"}, "heads", "expected an integer"),
    ({"layers": True}, "layers", "expected an integer"),
    ({"heads": 24}, "heads", "must divide hidden"),
    ({"kv_heads": 5}, "kv_heads", "must divide heads"),
    ({"activation": "silu"}, "activation", "unknown activation"),
    ({"activation": "swigl"}, "activation", "did you mean 'swiglu'"),
    ({"tied_embeddings": "yes"}, "tied_embeddings", "true/false"),
    ({"experts": 8}, "top_k", "top_k > 0"),
    ({"experts": 8, "top_k": 2}, "expert_ffn", "expert_ffn > 0"),
    ({"experts": 4, "top_k": 8, "expert_ffn": 64}, "top_k", "exceeds experts"),
    ({"top_k": 2}, "top_k", "experts is 0"),
    ({"experts": 8, "top_k": 2, "expert_ffn": 64, "first_dense_layers": 4},
     "first_dense_layers", "< layers"),
    ({"kv_lora_rank": 512}, "qk_rope_head_dim", "MLA"),
    ({"q_lora_rank": 64}, "q_lora_rank", "kv_lora_rank is 0"),
    ({"seq_len": -1}, "seq_len", ">= 0"),
])
def test_model_validation(change, field, text):
    with pytest.raises(CatalogError) as exc:
        catalog.model_from_dict(dict(LLAMA_LIKE, **change), name="bad")
    msg = str(exc.value)
    assert "'bad'" in msg and f"'{field}'" in msg and text in msg


def test_head_dim_lifts_divisibility():
    m = catalog.model_from_dict(dict(LLAMA_LIKE, hidden=2880, heads=64, kv_heads=8, head_dim=64))
    assert m.head_dim == 64


def test_integral_floats_and_numpy_ints_accepted():
    np = pytest.importorskip("numpy")
    m = catalog.model_from_dict(dict(LLAMA_LIKE, layers=np.int64(6), hidden=1024.0))
    assert m.layers == 6 and isinstance(m.layers, int) and m.hidden == 1024


# ---------------------------------------------------------------------------------------------
# Bad catalog files name file, entry and field
# ---------------------------------------------------------------------------------------------
@pytest.fixture
def fake_catalog(tmp_path, monkeypatch):
    """Copy the real catalogs to tmp_path, let a test edit them, reload from there."""
    for f in ("models.yaml", "gpus.yaml", "clusters.yaml"):
        (tmp_path / f).write_text((catalog.CATALOG_DIR / f).read_text())
    monkeypatch.setattr(catalog, "CATALOG_DIR", tmp_path)
    catalog.clear_cache()
    yield tmp_path
    monkeypatch.undo()
    catalog.clear_cache()


def test_bad_model_entry_names_file_entry_field(fake_catalog):
    with open(fake_catalog / "models.yaml", "a") as fh:
        fh.write("\nbroken-model: {layers: 2, hidden: 100, heads: 3, ffn: 400, vocab: 10}\n")
    with pytest.raises(CatalogError, match=r"models\.yaml: entry 'broken-model': field 'heads'"):
        catalog.model_names()


def test_bad_gpu_entry_names_file_entry_field(fake_catalog):
    text = (fake_catalog / "gpus.yaml").read_text().replace("hbm_gib: 79.11", "hbm_gib: -1", 1)
    (fake_catalog / "gpus.yaml").write_text(text)
    with pytest.raises(CatalogError, match=r"gpus\.yaml: entry 'h100-sxm': field 'hbm_gib'"):
        catalog.get_gpu("h100-sxm")


def test_bad_cluster_gpu_is_reported(fake_catalog):
    text = (fake_catalog / "clusters.yaml").read_text().replace("gpu: h100-sxm", "gpu: h100", 1)
    (fake_catalog / "clusters.yaml").write_text(text)
    with pytest.raises(CatalogError, match=r"clusters\.yaml: entry 'dgx-h100': field 'gpu': "
                                           r"unknown gpu 'h100': did you mean 'h100-sxm'"):
        catalog.cluster_names()


def test_missing_default_cluster_is_reported(fake_catalog):
    text = (fake_catalog / "clusters.yaml").read_text().replace("  b200: dgx-b200\n", "")
    (fake_catalog / "clusters.yaml").write_text(text)
    with pytest.raises(CatalogError, match="no default cluster for gpu.*b200"):
        catalog.default_cluster_for_gpu("h100-sxm")


def test_uppercase_id_rejected(fake_catalog):
    with open(fake_catalog / "models.yaml", "a") as fh:
        fh.write("\nMy_Model: {layers: 2, hidden: 64, heads: 4, ffn: 256, vocab: 10}\n")
    with pytest.raises(CatalogError, match="lower-case with dashes"):
        catalog.model_names()


def test_loading_is_cached():
    assert catalog.get_model("llama3-8b") is catalog.get_model("LLAMA3_8B")
    assert catalog.get_gpu("b200") is catalog.get_gpu("b200")


# ---------------------------------------------------------------------------------------------
# gpu_table, peak fallback, inline clusters
# ---------------------------------------------------------------------------------------------
def test_gpu_table():
    t = catalog.gpu_table()
    assert list(t.index) == catalog.gpu_names()
    for col in ("peak_bf16", "peak_fp8", "peak_tf32", "peak_fp32", "hbm_gib", "hbm_bw_gbs",
                "sm_count", "sm_arch", "nvlink_bw_gbs", "nvls", "price_per_hour",
                "nics_per_node", "nic_bw_gbs", "intra_latency_us", "inter_latency_us"):
        assert col in t.columns, col
        float(t[col].iloc[0])  # numeric
    h = t.loc["h100-sxm"]
    assert h.peak_bf16 == pytest.approx(989.4) and h.nic_bw_gbs == 50 and h.nics_per_node == 8
    # A100: no FP8 -> fp8 priced as bf16
    assert t.loc["a100-80gb", "peak_fp8"] == t.loc["a100-80gb", "peak_bf16"] == 312
    assert not t.loc["a100-80gb", "has_fp8"] and t.loc["h100-sxm", "has_fp8"]
    t.loc["h100-sxm", "peak_bf16"] = 0  # a copy: the cached table is unaffected
    assert catalog.gpu_table().loc["h100-sxm", "peak_bf16"] > 0


def test_peak_tflops_fallback():
    assert catalog.peak_tflops("a100-40gb", "fp8") == 312
    assert catalog.peak_tflops("h100-sxm", "fp8") == pytest.approx(1978.9)
    assert catalog.peak_tflops("h100-sxm") == pytest.approx(989.4)
    with pytest.raises(CatalogError, match="did you mean 'fp8'"):
        catalog.peak_tflops("h100-sxm", "fp9")


def test_cluster_from_dict():
    c = catalog.cluster_from_dict({"gpu": "h100-sxm", "num_gpus": 64})
    assert c == catalog.get_cluster("dgx-h100")
    c = catalog.cluster_from_dict({"gpu": "H100_SXM", "nics_per_node": 4})
    assert c.nics_per_node == 4 and c.nic_bw_gbs == 50 and c.gpu == "h100-sxm"
    c = catalog.cluster_from_dict({"name": "llm-foundry-a100-80gb"})
    assert c.gpu == "a100-80gb"
    with pytest.raises(CatalogError, match="did you mean 'nic_bw_gbs'"):
        catalog.cluster_from_dict({"gpu": "b200", "nic_bw_gb": 25})
    with pytest.raises(CatalogError, match="'nics_per_node'.*positive integer"):
        catalog.cluster_from_dict({"gpu": "b200", "nics_per_node": 0})


def test_catalogs_read_with_the_c_parser_are_what_safe_load_gives():
    """sim_core.catalog_yaml takes libyaml's parser where PyYAML has it: the same objects."""
    import yaml

    from sim_core import catalog_yaml

    files = sorted((Path(__file__).resolve().parents[1] / "sim_core" / "catalogs").glob("*.yaml"))
    assert files
    for f in files:
        text = f.read_text()
        assert catalog_yaml.read(text) == yaml.safe_load(text), f.name
