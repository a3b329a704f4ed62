"""Generation on the rollout engine: prefill, decode, the KV cache and the length tail.

Why each part, and where the rule comes from:
- **KV cache capacity.** vLLM sizes its cache as `total x gpu_memory_utilization - peak`, the
  peak being the weights, the activation peak of a profiling forward of max_num_batched_tokens
  tokens and non-torch allocations (vllm-project/vllm 0012cf6, vllm/v1/worker/gpu_worker.py
  `determine_available_memory`). KV heads are split over TP up to the number of KV heads and
  replicated beyond (vllm/model_executor/models/llama.py: `num_kv_heads = max(1,
  total_num_kv_heads // tp_size)`); MLA caches its latent on every TP rank.
- **Continuous batching.** The scheduler admits requests while the cache has blocks and fewer
  than max_num_seqs run (verl v0.7.0 rollout.yaml: max_num_seqs 1024, chunked prefill and
  prefix caching on). Concurrency is the smaller of max_num_seqs and the cache's tokens over
  the cache a running sequence holds on average: prompt + E[L^2] / (2 E[L]) (a running
  sequence seen at a random step is length-biased: renewal theory).
- **Decode step.** Every layer runs its GEMMs, which read the replica's weights (MoE: only the
  experts the batch's tokens route to, 1 - (1 - k/E)^B of them) at the GPU's HBM bandwidth
  times a fitted efficiency or compute 2 x active params FLOPs per token at `compute.py`'s
  GEMM efficiency, whichever is longer (routed experts spread over the EP group when expert
  parallelism spans more GPUs than the engine's TP x PP), and then its attention, which reads each running
  sequence's cache at the same bandwidth (kernels in sequence: the times add); plus 2 TP
  all-reduces per layer of the
  batch's hidden states (latency-bound, `nccl.py`) and a fitted per-step overhead
  (scheduler, sampling, launches). Pipeline stages run pp micro-batches: the weights are read
  once per micro-batch, so PP does not shorten the weight read of a step, it splits the cache.
- **MoE decode.** MLA's down-projection and the router are replicated on every TP rank (vLLM
  deepseek_v2.py `disable_tp=True`): read whole by each. An EP group wider than the engine
  (attention data-parallel replicas) gathers all its replicas' tokens before the experts, so
  the experts touched follow the group's batch. A collective whose group spans nodes costs a
  fitted latency beyond nccl.py's (catalogs/rl.yaml `decode.internode_collective_s`, fitted
  on published two-node DeepSeek-R1 TPOT by `calibrate.py`; single-node MoE rows need none).
- **The length tail.** The step lasts until the longest response ends. Response lengths
  follow a mixture: a fraction p of the responses never emits EOS and runs to the cap (a
  point mass at the maximum: the truncated responses NeMo RL logs as `truncation_rate` and
  verl as `response_length/clip_ratio`), the others an exponential law clipped at the
  maximum, its scale solved so that the mixture's mean is the given mean (catalogs/rl.yaml
  `length.truncated_fraction`, from a published truncation rate; a run may state its own
  `response_len.clip_ratio`). The last min(N, concurrency) sequences decode together while
  the batch shrinks as S(k) = P(L > k) = p + (1 - p) exp(-k / theta), until fewer than half
  a sequence is expected to remain; the sequences before them run at full concurrency.
  With p N >= 1/2 the longest response of a synchronous step runs to the cap. Where the
  step lasts as long as its longest response (synchronous training), adding replicas stops
  helping once each replica's batch is in its tail.
- **Prefill.** Compute-bound GEMMs and causal attention over the unique prompts (GRPO's
  responses to one prompt share it through prefix caching), at `compute.py`'s efficiency for
  chunks of max_num_batched_tokens tokens.
"""

from __future__ import annotations

import numpy as np

from .. import nccl
from ..columns import Batch
from ..compute import roofline_gemm_efficiency
from . import decode_stacks, engine_host, inputs, mla_decode, sglang_memory
from .inputs import constants

GRID = 48  # points over the tail of the length distribution
GIB = 2.0 ** 30


def decode_constants(overrides: dict | None = None) -> dict:
    """The decode step's constants: the global fitted ones (catalogs/rl.yaml `decode`) and,
    as `stacks`, the per-stack rows that replace them for a vendor and engine
    (`decode_stacks`, rl/decode_stacks.py). Overriding hbm_efficiency or step_overhead_s
    (a fit's grid) prices every row with the override: the stack rows are dropped unless the
    overrides give `stacks` themselves."""
    k = dict(constants()["decode"])
    k["stacks"] = list(constants().get("decode_stacks") or [])
    if overrides:
        if any(key in overrides for key in decode_stacks.KEYS) and "stacks" not in overrides:
            k["stacks"] = []
        k.update(overrides)
    return k


# ---- the length distribution -------------------------------------------------------------
def length_scale(mean, mx):
    """Scale theta of the exponential law clipped at mx whose mean is `mean`:
    theta (1 - exp(-mx/theta)) = mean (monotone in theta; bisection in log space)."""
    mean = np.asarray(mean, dtype=np.float64)
    mx = np.asarray(mx, dtype=np.float64)
    r = np.clip(mean / np.maximum(mx, 1.0), 1e-6, 0.999)
    lo = np.full(r.shape, np.log(1e-4))
    hi = np.full(r.shape, np.log(1e4))
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        t = np.exp(mid)
        f = t * (1 - np.exp(-1.0 / t))  # mean / mx at theta / mx = t
        lo = np.where(f < r, mid, lo)
        hi = np.where(f < r, hi, mid)
    return np.exp(0.5 * (lo + hi)) * mx


def length_moments(mean, mx):
    """(theta, E[L], E[L^2]) of the clipped exponential law."""
    th = length_scale(mean, mx)
    e = np.exp(-mx / th)
    m1 = th * (1 - e)
    m2 = 2 * th * th * (1 - e * (1 + mx / th))
    return th, m1, m2


def truncated_fraction(b: Batch) -> np.ndarray:
    """p, the fraction of responses that run to the cap without an EOS: the run's own
    `response_clip_ratio` where stated, else catalogs/rl.yaml `length.truncated_fraction`;
    bounded so that the responses that end on their own keep at least half of the mean
    (p x max <= mean / 2: the mixture must be able to have the stated mean)."""
    p0 = float(constants()["length"]["truncated_fraction"])
    stated = b.floats("response_clip_ratio")
    p = np.where(np.isnan(stated), p0, stated)
    mx = np.maximum(b.response_max, 1.0)
    return np.clip(np.minimum(p, 0.5 * b.response_mean / mx), 0.0, 0.999)


def length_law(mean, mx, p):
    """The mixture of `p` at the cap and a clipped exponential body: (theta of the body,
    E[L], E[L^2]) with E[L] = mean (the body's mean is (mean - p max) / (1 - p))."""
    mean = np.minimum(np.asarray(mean, dtype=np.float64), mx)
    body = np.maximum((mean - p * mx) / (1 - p), 1e-3)
    th, b1, b2 = length_moments(body, mx)
    return th, p * mx + (1 - p) * b1, p * mx * mx + (1 - p) * b2


def survival_end(count, th, p, mx):
    """The length k at which `count` x S(k) = 1/2 (S the mixture's survival; under half a
    sequence expected to remain), or the cap when count x p >= 1/2."""
    r = (0.5 / np.maximum(count, 1e-9) - p) / (1 - p)
    k = -th * np.log(np.clip(r, 1e-300, 1.0))
    return np.where(r > 0, np.minimum(k, mx), mx)


# ---- memory -------------------------------------------------------------------------------
def weight_bytes(b: Batch) -> np.ndarray:
    return np.where(b.rollout_precision == 1, 1.0, 2.0)


def expert_shards(b: Batch) -> np.ndarray:
    """GPUs the routed experts are spread over: the engine's TP x PP GPUs, or the EP group
    when expert parallelism spans more (vLLM `enable_expert_parallel`: EP = TP x DP, attention
    data-parallel across the replicas)."""
    return np.maximum(b.rollout_tp * b.rollout_pp, b.rollout_ep)


def weights_per_gpu(b: Batch) -> np.ndarray:
    """Bytes of weights each rollout GPU holds."""
    g = b.rollout_tp * b.rollout_pp
    return (b.dense_params / g + b.routed_params / expert_shards(b)) * weight_bytes(b)


def kv_split(b: Batch) -> np.ndarray:
    """How many ways a layer's cache is split over the TP ranks."""
    return np.where(b.mla > 0, 1.0, np.minimum(b.rollout_tp, b.kv_heads))


def kv_bytes_per_token_gpu(b: Batch) -> np.ndarray:
    return b.layers / b.rollout_pp * b.kv_elems * b.kv_cache_bytes / kv_split(b)


def batched_tokens(b: Batch) -> np.ndarray:
    """Tokens per engine step (vLLM `max_num_batched_tokens`): the run's where it states one
    (verl's DeepSeek-V3 script sets prompt + response caps), else catalogs/rl.yaml's."""
    k = constants()["vllm"]["max_num_batched_tokens"]
    own = b.floats("max_num_batched_tokens", 0.0)
    return np.where(np.nan_to_num(own) > 0, own, float(k))


def rollout_memory(b: Batch, resident_gib=None) -> dict:
    """Per GPU of the rollout engine (bytes): weights, the profiling activation peak, the KV
    cache vLLM allocates and the tokens it holds per replica. SGLang rows follow SGLang's
    `mem_fraction_static` (sglang_memory.py); resident_gib: what the colocated trainer keeps
    on the GPU while the engine generates (SGLang's fraction applies to the memory left)."""
    g = b.rollout_tp * b.rollout_pp
    k = constants()["vllm"]
    w = weights_per_gpu(b)
    T = batched_tokens(b)
    # profiling forward: the MLP's gate+up output and a few hidden-sized buffers of T tokens,
    # plus the sampler's fp32 logits of max_num_seqs rows (vLLM's dummy sampler run)
    width = np.where(b.experts > 0, 2 * b.expert_ffn * b.top_k, 2 * b.ffn) / b.rollout_tp
    # MoE: vLLM's Triton fused-MoE path allocates its workspace per call for the T tokens x
    # top_k routed copies: `cache13` of T x top_k x max(N, K) (gate+up output, then reused for
    # the down-projection output of width K = hidden) and `cache2` of T x top_k x N/2 (the
    # activation), N = 2 x expert_ffn / tp (vllm-project/vllm 13cb3e44
    # vllm/model_executor/layers/fused_moe/fused_moe.py fused_experts_impl); the profiling
    # forward's peak holds it in place of the dense MLP width
    n_w1 = 2 * b.expert_ffn / b.rollout_tp
    moe_ws = b.top_k * (np.maximum(n_w1, b.hidden) + n_w1 / 2)
    width = np.where(b.experts > 0, moe_ws, width)
    act = T * (width + 4 * b.hidden) * 2 + b.max_num_seqs * b.vocab * 4 / b.rollout_tp
    other = k["non_kv_overhead_gib"] * GIB
    budget = b.gpu_memory_utilization * b.hbm_gib * GIB
    kv = budget - w - act - other
    peak = budget
    rest = act + other
    sg = b.rollout_engine == inputs.ENGINE.index("sglang")
    if np.any(sg):
        res = np.zeros(len(b)) if resident_gib is None else np.asarray(resident_gib, float)
        dpa = np.maximum(expert_shards(b) / g, 1.0)
        s = sglang_memory.memory(b, w, res, dpa, spec_tokens(b) > 0)
        kv = np.where(sg, s["kv"], kv)
        peak = np.where(sg, s["peak"], peak)
        rest = np.where(sg, s["reserve"] + s["init"] + s["trainer_context"], rest)
    tokens = np.maximum(kv, 0.0) / kv_bytes_per_token_gpu(b)
    return {"rollout_weights_gib": w / GIB, "rollout_activation_gib": rest / GIB,
            "kv_cache_gib": kv / GIB, "kv_tokens": tokens,
            "rollout_peak_gib": peak / GIB}


# ---- one decode step ----------------------------------------------------------------------
def _gemm_hw(b: Batch) -> Batch:
    return Batch(sm_arch=b.sm_arch, sm_count=b.sm_count, gemm_max_bf16=b.gemm_max_bf16,
                 gemm_max_fp8=b.gemm_max_fp8)


def _col(x):
    return np.asarray(x, dtype=np.float64)[:, None]


def step_time(b: Batch, batch, ctx, k: dict, host: bool = True) -> np.ndarray:
    """Seconds of one decode step of a replica running `batch` sequences whose caches hold
    `ctx` tokens on average. batch, ctx: arrays of shape (n, G) (or (n,)). `host=False`: the
    GPU step alone, without the engine's host work per running sequence."""
    two_d = np.ndim(batch) == 2
    c = _col if two_d else (lambda x: np.asarray(x, dtype=np.float64))
    batch = np.maximum(np.asarray(batch, dtype=np.float64), 1e-9)
    # speculative decoding: each sequence's step verifies its k drafted tokens with the last
    # accepted one (k + 1 query tokens through the GEMMs, the experts, TP and EP traffic; the
    # cache is read once per sequence), after k draft passes (spec_draft_cost)
    spec_k = np.where(spec_active(b, batch), c(spec_tokens(b)), 0.0)
    seqs = batch
    batch = batch * (1.0 + spec_k)
    tp, pp = c(b.rollout_tp), c(b.rollout_pp)
    wb = c(weight_bytes(b))
    routed = c(b.routed_params)
    E = np.maximum(c(b.experts), 1.0)
    # an EP group wider than the engine gathers the tokens of all its attention-data-parallel
    # replicas before the experts (vLLM DP + EP, SGLang --enable-dp-attention, TensorRT-LLM
    # enable_attention_dp): the experts a GPU reads are those the group's tokens touch
    dp_ep = np.maximum(c(expert_shards(b)) / (tp * pp), 1.0)
    touched = np.where(c(b.experts) > 0, 1 - (1 - c(b.top_k) / E) ** (batch * dp_ep), 0.0)
    # per GPU; PP reads its stage's weights once per micro-batch (pp of them per step); the
    # replicated weights (MLA down-projections, router) are read whole by every TP rank
    repl = c(b.replicated_params)
    w_read = ((c(b.dense_params) - repl) / tp + repl
              + routed * touched * pp / c(expert_shards(b))) * wb
    kv_read = seqs * ctx * c(b.layers) * c(b.kv_elems) * c(b.kv_cache_bytes) / (
        pp * c(kv_split(b)))
    # the bandwidth fraction and fixed per-step time of each row's accelerator/engine stack
    # (catalogs/rl.yaml decode_stacks; the global fitted values where no stack row matches)
    eff_k, ovh_k = decode_stacks.resolve(b, k)
    bw = c(b.hbm_bw_gbs) * 1e9 * c(eff_k)
    fp8 = c(b.rollout_precision) == 1
    peak = np.where(fp8, c(b.peak_fp8), c(b.peak_bf16)) * 1e12
    hw = _gemm_hw(b)
    if two_d:
        hw = Batch({kk: v[:, None] for kk, v in hw.items()})
    eff = roofline_gemm_efficiency(hw, batch / pp, c(b.ffn) / tp, c(b.hidden),
                                   np.broadcast_to(fp8, np.shape(batch)))
    t_cmp = 2 * c(b.active_params) * batch / (tp * pp) / (peak * np.maximum(eff, 1e-3))
    # TP: 2 all-reduces per layer of the micro-batch's hidden states (bf16), over the nodes
    # the TP group spans (an engine wider than a node all-reduces across the network)
    net = {kk: c(v) for kk, v in inputs.network(b).items()}
    nbytes = batch / pp * c(b.hidden) * 2
    nodes = np.broadcast_to(np.ceil(tp / c(b.gpus_per_node)), np.shape(nbytes))
    ar = nccl.collective_time("all_reduce", nbytes, tp, nodes, net)["time_s"]
    ep = c(b.rollout_ep)
    moe = c(b.moe_layers)
    # with EP the MoE layers dispatch and combine the routed copies by all-to-all over the EP
    # group instead of all-reducing their output over TP
    ar_calls = np.where(ep > 1, 2 * c(b.layers) - moe, 2 * c(b.layers))
    # a collective of a decode step whose group spans nodes costs a further latency beyond
    # nccl.py's (catalogs/rl.yaml decode.internode_collective_s, fitted on published multi-node
    # DeepSeek-R1 TPOT; single-node decode rows need none)
    xnode = k.get("internode_collective_s", 0.0)
    ar = ar + np.where(nodes > 1, xnode, 0.0)
    t_tp = np.where(tp > 1, ar_calls * ar, 0.0)
    a2a_bytes = batch / pp * c(b.top_k) * c(b.hidden) * 2
    ep_nodes = np.broadcast_to(np.ceil(ep / c(b.gpus_per_node)), np.shape(a2a_bytes))
    a2a = nccl.collective_time("all_to_all", a2a_bytes, np.broadcast_to(ep, np.shape(a2a_bytes)),
                               ep_nodes, net)["time_s"] + np.where(ep_nodes > 1, xnode, 0.0)
    t_tp = t_tp + np.where(ep > 1, 2 * moe * a2a, 0.0)
    # the GEMMs (weights read or FLOPs, whichever is longer) and the attention kernels (the
    # cache read) run one after the other in every layer: their times add
    t_gemm = np.maximum(w_read / bw, t_cmp)
    # enforce_eager (no CUDA graphs): every kernel of every layer is launched from the host;
    # priced per layer from a published eager-vs-graph decode measurement (catalogs/rl.yaml)
    eager = c(b.enforce_eager) * c(b.layers) * constants()["vllm"]["eager_overhead_per_layer_s"]
    t_samp = batch * c(b.vocab) * c(sampler_bytes(b)) / bw
    # the attention reads each sequence's cache; FlashMLA's padded 64-row tiles can make it
    # compute-bound instead on a compute-poor Hopper part (H20): the longer of the two
    on_vllm = c(b.rollout_engine) == inputs.ENGINE.index("vllm")
    t_attn = np.maximum(kv_read / bw, mla_decode.compute_time(b, seqs, ctx, spec_k, c, on_vllm))
    step = t_gemm + t_attn + t_tp + c(ovh_k) + eager + t_samp
    # vLLM V0: Python work per running sequence between GPU steps (scheduling, input
    # preparation, output processing), serial with them
    v0 = c(v0_host_per_seq(b)) * seqs
    # the draft: DeepSeek-V3's MTP module is one transformer block + a projection on the
    # main model's hidden state (DeepSeek-V3 technical report, arXiv 2412.19437, sec. 2.2),
    # run once per drafted token: ~1/layers of a step each
    gpu = step * (1.0 + spec_k / c(b.layers))
    if not host:
        return gpu
    # vLLM V1 and SGLang: the engine's per-request loops between steps (engine_host.py),
    # added where the engine runs them serially (V1 at 0.8-0.10), the longer of the two where
    # it overlaps them with the next step (SGLang's overlap scheduler)
    serial, overlapped = engine_host.per_seq_s(b)
    return engine_host.combine(gpu + v0, seqs, c(serial), c(overlapped))


def v0_host_per_seq(b: Batch) -> np.ndarray:
    """Host seconds per running sequence per decode step that vLLM's V0 engine spends between
    GPU steps (0 for V1, SGLang and TensorRT-LLM): V0 schedules over sequence groups, rebuilds
    the model's input tensors and sampling metadata from Python objects every step and builds
    an output object per sequence, all on the thread that launches the next step
    (catalogs/rl.yaml vllm.v0_host_per_seq_s, read off a published profile of V0's scheduling
    time against the running requests). With CUDA graphs, V0's asynchronous output processor
    (vLLM >= 0.6.0) overlaps the output processing with the next GPU step: that share
    (vllm.v0_async_output_share) is hidden; with enforce_eager vLLM turns it off."""
    k = constants()["vllm"]
    v0 = (np.asarray(b.rollout_vllm_v0, dtype=float) > 0) & (
        np.asarray(b.rollout_engine, dtype=np.int64) == inputs.ENGINE.index("vllm"))
    eager = np.asarray(b.enforce_eager, dtype=float) > 0
    hidden = np.where(eager, 0.0, float(k["v0_async_output_share"]))
    return np.where(v0, float(k["v0_host_per_seq_s"]) * (1.0 - hidden), 0.0)


def spec_tokens(b: Batch) -> np.ndarray:
    """Drafted tokens per decode step (vLLM `speculative_config.num_speculative_tokens`; 0 =
    no speculative decoding)."""
    return np.nan_to_num(b.floats("spec_tokens", 0.0))


def spec_active(b: Batch, batch) -> np.ndarray:
    """Whether a replica running `batch` sequences drafts: speculative decoding on, and at most
    `spec_max_running` requests running where the run sets that switch (0: no switch). batch:
    (n,) or (n, G)."""
    lim = np.nan_to_num(b.floats("spec_max_running", 0.0))
    batch = np.asarray(batch, dtype=float)
    if batch.ndim == 2:
        lim = lim[:, None]
    on = spec_tokens(b) > 0
    return (on[:, None] if batch.ndim == 2 else on) & ((lim <= 0) | (batch <= lim))


def tokens_per_step(b: Batch) -> np.ndarray:
    """Tokens a sequence gains per decode step: 1 + a + a^2 + ... + a^k for k drafted tokens
    each accepted with probability a given the previous (the run's `spec_acceptance`, else
    catalogs/rl.yaml spec.acceptance)."""
    k_ = spec_tokens(b)
    a0 = float(constants().get("spec", {}).get("acceptance", 0.0))
    a = b.floats("spec_acceptance")
    a = np.clip(np.where(np.isnan(a), a0, a), 0.0, 0.999)
    return np.where(k_ > 0, (1.0 - a ** (k_ + 1.0)) / (1.0 - a), 1.0)


def sampler_bytes(b: Batch) -> np.ndarray:
    """Bytes of HBM traffic per running sequence per vocabulary entry of one decode step's
    sampler (catalogs/rl.yaml sampler_bytes_per_logit: vLLM's V1 sampler counted op by op; the
    log-softmax and rank only where the rollout requests log-probabilities). Every GPU of the
    engine samples over the whole vocabulary (the logits are all-gathered over TP), so it is
    not divided by TP."""
    table = constants()["sampler_bytes_per_logit"]
    eng = np.asarray(b.rollout_engine, dtype=np.int64)
    lp = np.asarray(b.rollout_logprobs, dtype=float) > 0
    with_lp = np.array([float(table[e]["logprobs"]) for e in inputs.ENGINE])[eng]
    plain = np.array([float(table[e]["plain"]) for e in inputs.ENGINE])[eng]
    return np.where(lp, with_lp, plain)


def prefill_time(b: Batch, prompt_tokens, prompt_len) -> np.ndarray:
    """Seconds of prefill for `prompt_tokens` tokens of prompts `prompt_len` long, per replica."""
    g = b.rollout_tp * b.rollout_pp
    fp8 = b.rollout_precision == 1
    peak = np.where(fp8, b.peak_fp8, b.peak_bf16) * 1e12
    chunk = batched_tokens(b)
    eff = roofline_gemm_efficiency(_gemm_hw(b), np.asarray(chunk, dtype=float),
                                   b.ffn / b.rollout_tp, b.hidden, fp8)
    flops = prompt_tokens * (2 * b.active_params + 2 * prompt_len * b.attn_dim * b.layers)
    t = flops / (g * peak * np.maximum(eff, 1e-3))
    # TP: 2 all-reduces per layer of each chunk's hidden states (bf16), not overlapped
    chunks = np.ceil(prompt_tokens / chunk)
    nbytes = np.minimum(prompt_tokens, chunk) * b.hidden * 2
    ar = nccl.collective_time("all_reduce", nbytes, b.rollout_tp,
                              np.ceil(b.rollout_tp / b.gpus_per_node), inputs.network(b))["time_s"]
    nodes = np.ceil(b.rollout_tp / b.gpus_per_node)
    ar = ar + np.where(nodes > 1, decode_constants().get("internode_collective_s", 0.0), 0.0)
    return t + np.where(b.rollout_tp > 1, chunks * 2 * b.layers * ar, 0.0)


def reprefill_time(b: Batch, conc, ctx) -> np.ndarray:
    """Seconds a replica spends prefilling its running requests again after a weight update,
    where the run does (`reprefill_on_update`; else 0): AReaL's interruptible rollout workers
    "discard KV caches computed by old weights, and re-compute them using the new weights"
    (arXiv 2505.24298 sec. 4.1; v0.3.0 gserver_manager.py posts `update_weights_from_disk` with
    `allow_interrupt=True`, and partial_rollout.py resubmits each interrupted request with its
    tokens so far). Once per update: the `conc` running sequences, each holding `ctx` tokens
    on average, through prefill_time."""
    on = b.floats("reprefill_on_update", 0.0) > 0
    conc = np.asarray(conc, dtype=float)
    t = prefill_time(b, conc * ctx, ctx)
    return np.where(on, t, 0.0)


# ---- a step's generation ------------------------------------------------------------------
def generate(b: Batch, overrides: dict | None = None, resident_gib=None) -> dict:
    """Generation phase of one RL step for every configuration.

    Returns seconds (gen_time_s with the length tail; gen_time_throughput_s as if the tail's
    idle slots were filled, what streaming asynchronous rollouts approach), prefill and decode
    apart, the concurrency the cache allows, the KV cache and the tokens generated."""
    k = decode_constants(overrides)
    mem = rollout_memory(b, resident_gib)
    reps = np.maximum(b.replicas, 1.0)
    n_seq = np.ceil(b.sequences / reps)  # sequences per replica (an even split of the batch)
    mx = np.maximum(b.response_max, 1.0)
    p = truncated_fraction(b)
    th, m1, m2 = length_law(b.response_mean, mx, p)
    inflight_ctx = b.prompt_len + m2 / (2 * m1)
    # what the scheduler reserves per admitted request: the cache it holds on average
    # (vLLM, SGLang: blocks as tokens come), or prompt + max output (TensorRT-LLM's
    # GUARANTEED_NO_EVICT capacity scheduler)
    reserve = np.where(b.rollout_engine == 2, b.prompt_len + mx, inflight_ctx)
    cap = np.floor(mem["kv_tokens"] / reserve)
    conc = np.maximum(np.minimum(np.minimum(b.max_num_seqs, n_seq), cap), 1.0)
    # saturated part: the sequences beyond the last `conc`, at full concurrency
    sat_tokens = np.maximum(n_seq - conc, 0.0) * m1
    # speculative decoding: every step where the replica drafts advances a sequence by
    # tokens_per_step tokens (spec_active: a switch may turn drafting off above a batch size)
    tps = tokens_per_step(b)
    tps_conc = np.where(spec_active(b, conc), tps, 1.0)
    t_sat = sat_tokens / conc * step_time(b, conc, inflight_ctx, k) / tps_conc
    # tail: `conc` sequences shrinking as S(k) until < 1/2 remains expected
    last = np.minimum(n_seq, conc)
    # a synchronous step waits for the slowest replica: the tail lasts until under half a
    # sequence is expected to remain among all replicas' last sequences (last x replicas),
    # the replica holding the longest response decoding it alone once its own others are done
    k_rep = survival_end(last, th, p, mx)
    k_end = survival_end(last * reps, th, p, mx)
    u = (np.arange(GRID) + 0.5) / GRID
    kk = k_end[:, None] * u[None, :]
    alive = last[:, None] * (p[:, None] + (1 - p[:, None]) * np.exp(-kk / th[:, None]))
    alive = np.where(kk > k_rep[:, None], np.maximum(alive, 1.0), alive)
    dk = (k_end / GRID)[:, None]
    tps_tail = np.where(spec_active(b, alive), tps[:, None], 1.0)
    t_tail = (step_time(b, alive, b.prompt_len[:, None] + kk, k) * dk / tps_tail).sum(axis=1)
    # prefill of the unique prompts of this replica (prefix caching shares a prompt's n copies)
    prompts = np.ceil(b.prompts_per_step / reps)
    t_pre = prefill_time(b, prompts * b.prompt_len, b.prompt_len)
    decode = t_sat + t_tail
    thr = n_seq * m1 / conc * step_time(b, conc, inflight_ctx, k) / tps_conc
    return {
        "reprefill_time_s": reprefill_time(b, conc, inflight_ctx),
        "gen_time_s": t_pre + decode,
        "gen_time_throughput_s": t_pre + thr,
        "prefill_time_s": t_pre,
        "decode_time_s": decode,
        "decode_tail_s": t_tail,
        "concurrency": conc,
        "longest_response": k_end,
        "truncated_fraction": p,
        "response_tokens": b.sequences * m1,
        **mem,
        "kv_fits": (mem["kv_tokens"] >= b.prompt_len + b.response_max),
    }
