"""Time Hugging Face transformers' own decoder layers (Qwen2, Qwen3, Llama), forward and
backward, on one GPU, and write them as a kernel table (the format of `measure.py`).

Why: the RL trainers' FSDP paths (verl's FSDP workers, NeMo RL's DTensor policy) train the
transformers model classes as they are, so their training and log-prob passes run HF's eager
layers (its RMSNorm module, rotary with rotate_half, SwiGLU as act(gate) * up, attention through
SDPA), not the fused layers `measure.py --only layers` builds. The simulator prices them as
"eager" kernels (rl/nemo_rl.py DTENSOR_KERNELS, rl/verl.py KERNELS); this table says what those
layers cost on the GPU at the shapes the RL rows train.

    python -m sim_core.calibration.measure_hf_layers --out hf.csv [--budget-s 90]

Layer shapes come from the catalog (sim_core/catalogs/models.yaml); each layer is built from a
transformers config of that shape with `attn_implementation="sdpa"` (FlashAttention-2 through
SDPA: the flash-attn package is not needed), bf16 weights, one causal sequence per batch entry,
position ids 0..s-1; backward = (forward + backward) - forward, weight gradients included.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from .measure import Timer, _row, _Writer, add_timed, failed_note, open_cuda

# catalog model -> transformers model family whose decoder layer it uses
HF_LAYER_MODELS = {
    "qwen2.5-0.5b": "qwen2", "qwen2.5-1.5b": "qwen2", "qwen2.5-7b": "qwen2",
    "qwen3-4b": "qwen3", "llama3.1-8b": "llama", "qwen3-32b": "qwen3",
}
# (sequence, micro-batch): one 2k sequence, four of them, one 8k sequence
HF_LAYER_SHAPES = ((2048, 1), (2048, 4), (8192, 1))
_PREFIX = {"qwen2": "Qwen2", "qwen3": "Qwen3", "llama": "Llama"}


def build_layer(transformers, model: str, family: str):
    """The family's decoder layer and rotary module at the catalog model's shape."""
    import importlib

    from .. import catalog

    spec = catalog.get_model(model)
    mod = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    config_cls = getattr(transformers, f"{_PREFIX[family]}Config")
    kw = dict(hidden_size=spec.hidden, intermediate_size=spec.ffn,
              num_attention_heads=spec.heads, num_key_value_heads=spec.kv_heads or spec.heads,
              num_hidden_layers=1, vocab_size=1024, max_position_embeddings=65536)
    if spec.head_dim:
        kw["head_dim"] = spec.head_dim
    cfg = config_cls(**kw)
    cfg._attn_implementation = "sdpa"
    layer = getattr(mod, f"{_PREFIX[family]}DecoderLayer")(cfg, layer_idx=0)
    rotary = getattr(mod, f"{_PREFIX[family]}RotaryEmbedding")(config=cfg)
    return layer, rotary, spec


def time_hf_layer(torch, transformers, timer, model: str, family: str, seq: int,
                  batch: int) -> dict:
    layer, rotary, spec = build_layer(transformers, model, family)
    layer = layer.to("cuda", torch.bfloat16)
    rotary = rotary.to("cuda")
    x = torch.randn(batch, seq, spec.hidden, device="cuda", dtype=torch.bfloat16,
                    requires_grad=True)
    pos = torch.arange(seq, device="cuda").unsqueeze(0).expand(batch, -1)
    cos, sin = rotary(x, pos)
    g = torch.randn_like(x)
    params = list(layer.parameters())

    def call():
        out = layer(x, attention_mask=None, position_ids=pos, position_embeddings=(cos, sin))
        return out[0] if isinstance(out, tuple) else out

    def fwd(_):
        with torch.no_grad():
            call()

    def both(_):
        torch.autograd.grad(call(), [x, *params], g)
    t_fwd, s_fwd = timer(fwd)
    t_both, s_both = timer(both)
    return {"fwd": (t_fwd, s_fwd), "bwd": (max(t_both - t_fwd, 1e-3), s_both)}


def run(out: Path, budget_s: float, log=print) -> int:
    torch, mods, dev, gpu, source = open_cuda("measure_hf_layers",
                                              "PyTorch with CUDA and transformers", "transformers")
    transformers = mods["transformers"]
    w = _Writer(out, [
        f"HF decoder layers measured by python -m sim_core.calibration.measure_hf_layers on "
        f"{time.strftime('%Y-%m-%d')}",
        f"device: {dev['name']}, {dev['sm_count']} SMs; torch {torch.__version__}, transformers "
        f"{transformers.__version__}; attn_implementation sdpa (default SDPA backend choice)",
        "one layer, tp 1, bf16; bwd = (fwd+bwd) - fwd, weight gradients included"])
    timer = Timer(torch)
    t0 = time.monotonic()
    for model, family in HF_LAYER_MODELS.items():
        for seq, batch in HF_LAYER_SHAPES:
            if time.monotonic() - t0 > budget_s:
                log(f"stopped at the {budget_s:.0f} s budget")
                log(f"wrote {w.rows} rows to {out}")
                return 0
            row = dict(op_class="layer", dtype="bf16", batch=batch, seq=seq, kernel="sdpa",
                       model=model, tp=1, tokens=seq * batch, op=f"hf_{family}_decoder_layer")
            try:
                res = time_hf_layer(torch, transformers, timer, model, family, seq, batch)
            except Exception as exc:
                w.add(_row(gpu, source, **row, note=failed_note(exc)))
                continue
            add_timed(w, gpu, source, row, res)
            torch.cuda.empty_cache()
        log(f"{model}: {w.rows} rows, {time.monotonic() - t0:.0f} s")
    log(f"wrote {w.rows} rows to {out}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m sim_core.calibration.measure_hf_layers",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="kernel table CSV to write")
    p.add_argument("--budget-s", type=float, default=90.0,
                   help="stop starting new layers after this many seconds")
    a = p.parse_args(argv)
    return run(a.out, a.budget_s)


if __name__ == "__main__":
    sys.exit(main())
