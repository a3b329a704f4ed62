"""`sweep catalog gpus|instances|models|frameworks`: what a run or space file can name.

One line each: the id, the key figures and the source (shortened), so that an unknown name's
error ("`sweep catalog gpus` lists them") has somewhere to send the user.
"""

from __future__ import annotations

import argparse

NAME = "catalog"
HELP = "list the GPUs, cloud instance types, models and frameworks a run file can name"
KINDS = ("gpus", "instances", "models", "frameworks")
SOURCE_CHARS = 90  # of a source, in a listing (the catalog YAML has it whole)


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("kind", choices=KINDS, help="what to list")
    p.add_argument("--full", action="store_true", help="print sources whole")


def _short(text: str, full: bool) -> str:
    text = " ".join(str(text).split())
    return text if full or len(text) <= SOURCE_CHARS else text[:SOURCE_CHARS - 3] + "..."


def _stand_ins() -> dict:
    """catalogs/efficiency.yaml `stand_ins`: {sm_arch: what its constants borrow}."""
    from importlib import resources

    import yaml

    text = resources.files("sim_core").joinpath("catalogs/efficiency.yaml").read_text()
    return {int(k): v for k, v in (yaml.safe_load(text).get("stand_ins") or {}).items()}


def gpu_lines(full: bool = False) -> list[str]:
    from sim_core import catalog

    out = []
    stand_ins = _stand_ins()
    for name in catalog.gpu_names():
        g = catalog.get_gpu(name)
        fp8 = f"fp8 {g.peak_tflops['fp8']:,.0f}" if g.peak_tflops["fp8"] else "no fp8"
        # FP4 training formats (sim_core/fp4.py): their dense peaks; GEMM ceiling = FP8's
        fp4 = "".join(f", {f} {g.peak_tflops[f]:,.0f}" for f in ("nvfp4", "mxfp4")
                      if g.peak_tflops.get(f))
        note = f" [{stand_ins[g.sm_arch]}]" if g.sm_arch in stand_ins else ""
        out.append(f"{name:<12} bf16 {g.peak_tflops['bf16']:,.0f} TFLOP/s, {fp8}{fp4}, "
                   f"{g.hbm_gib:g} GiB at {g.hbm_bw_gbs:,.0f} GB/s, link {g.nvlink_bw_gbs:g} GB/s, "
                   f"${g.price_per_hour:g}/GPU-h{note} | {_short(g.source, full)}")
    return out


def instance_lines(full: bool = False) -> list[str]:
    from sim_core import catalog

    out = []
    for name in catalog.instance_names():
        i = catalog.get_instance(name)
        price = (f"${i.price_per_gpu_hour:g}/GPU-h {i.price_kind} ({i.price_date})"
                 if i.price_per_gpu_hour is not None else "no sourced price (give price_per_hour)")
        assumed = f" [assumed: {', '.join(i.assumed)}]" if i.assumed else ""
        lat = f"{i.inter_latency_us:g} us" + (" assumed" if i.latency_basis == "assumption" else "")
        out.append(f"{name:<18} {i.provider} {i.type}: {i.gpus_per_node} x {i.gpu}, "
                   f"{i.nics_per_node} x {i.nic_gbps:g} Gb/s {i.transport} (latency {lat}), "
                   f"{price}{assumed} | {_short(i.price_source or i.source, full)}")
    for name, i in catalog.unavailable_instances().items():
        out.append(f"{name:<18} {i.provider} {i.type}: {i.gpus_per_node} x {i.gpu} -- "
                   f"unavailable: gpu {i.gpu!r} is not in the GPU catalog")
    return out


def model_lines(full: bool = False) -> list[str]:
    from sim_core import catalog

    out = []
    for name in catalog.model_names():
        m = catalog.get_model(name)
        moe = f", {m.experts} experts top-{m.top_k}" if m.experts else ""
        out.append(f"{name:<20} {catalog.param_count(name) / 1e9:,.1f}B params, {m.layers} "
                   f"layers, hidden {m.hidden}, {m.heads} heads{moe} | {_short(m.source, full)}")
    return out


def framework_lines(full: bool = False) -> list[str]:
    from sim_core import frameworks

    out = []
    for name, p in frameworks.profiles().items():
        sup = p.get("supports", {})
        zero = ",".join(str(z) for z in sup.get("zero", []))
        out.append(f"{name:<14} {p.get('title', '')}; zero {zero or '-'}, pp "
                   f"{'yes' if sup.get('pp') else 'no'} | {_short(p.get('code', ''), full)}")
    return out


LINES = {"gpus": gpu_lines, "instances": instance_lines, "models": model_lines,
         "frameworks": framework_lines}


def run(args) -> int:
    print("\n".join(LINES[args.kind](args.full)))
    return 0
