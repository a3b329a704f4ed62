"""Plain data types shared by every part of the simulator.

The simulator is a pure function from *columns* (one numpy array per field, one row per
configuration) to columns of predictions. These types describe the fixed things a column is
derived from (a model's shape, a GPU, a cluster) and the names and defaults of every column,
so that the catalogs, the search engine and the core agree on one vocabulary.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .tasks import FINETUNE_COLUMNS, TASKS

# ---------------------------------------------------------------------------------------------
# Enumerations: string values a user writes, and the small integer codes the core computes with.
# ---------------------------------------------------------------------------------------------
RECOMPUTE = ("none", "selective", "full")
# nvfp4 / mxfp4: FP4 (E2M1) training of the layers' GEMMs with block scales (sim_core/fp4.py):
# NVFP4 (1x16 E4M3 scales + a per-tensor FP32 scale; TE NVFP4BlockScaling) on Blackwell, MXFP4
# (1x32 E8M0 scales; AMD Primus-Turbo) on CDNA4
PRECISION = ("bf16", "fp8", "nvfp4", "mxfp4")
ACTIVATION = ("gelu", "swiglu", "relu2")
ATTENTION = ("mha", "mla")  # mha covers MHA/GQA/MQA through kv_heads
# Flash-attention kernel family: fa2 (FlashAttention-2, torch SDPA's flash backend) or fa3
# (FlashAttention-3 / cuDNN fused attention, what Transformer Engine uses on Hopper+); triton
# (flash-attention's Triton kernel flash_attn_triton, llm-foundry's `attn_impl: triton`) and fa1
# (FlashAttention-1, what llm-foundry's `attn_impl: flash` ran before flash-attn 2); flex
# (FlexAttention: torch.nn.attention.flex_attention, a Triton kernel torch.compile generates;
# torchtitan's model arg attn_type "flex", pytorch/torchtitan e347b1e
# torchtitan/models/llama3/model/args.py); unfused (no flash kernel: the full s x s scores are
# written by one batched GEMM, softmaxed, dropped out and multiplied by V: Megatron-Core's
# `--attention-backend unfused` / local DotProductAttention, Megatron-LM before FlashAttention;
# compute.unfused_attention_times). Appended: earlier codes keep their meaning.
ATTENTION_KERNEL = ("fa3", "fa2", "triton", "fa1", "flex", "unfused")
# Context-parallel communication: ring (Megatron cp_comm_type p2p: K/V blocks passed round a
# ring behind the attention), allgather (K/V all-gathered once per layer), a2a (Ulysses: q, k,
# v all-to-all'd to full sequence / heads-over-cp before attention and the output back after;
# TE AttnFuncWithCPAndQKVOA2A, DeepSpeed DistributedAttention, verl's Ulysses SP). Appended:
# earlier codes keep their meaning.
CP_COMM = ("ring", "allgather", "a2a")
# FP8 scaling recipe (compute.fp8_recipe_table prices each from the code that implements it):
# delayed (TE DelayedScaling: amax history), tensorwise (TE Float8CurrentScaling / torchao
# tensorwise: amax of the current tensor), rowwise and rowwise_with_gw_hp (torchao axiswise
# scales; the latter keeps the weight-gradient GEMM in bf16), blockwise (TE Float8BlockScaling,
# DeepSeek-V3's 1x128 / 128x128 blocks), mxfp8 (TE MXFP8BlockScaling / torchao mx, Blackwell)
FP8_RECIPE = ("delayed", "tensorwise", "rowwise", "rowwise_with_gw_hp", "blockwise", "mxfp8")
# Cross-entropy implementation, which sets the bytes held per logit around the loss (memory.py)
# and the bytes its kernels move over the logits (workload.LOSS_TRAFFIC): fused (Megatron-Core's
# fused vocab-parallel CE, --cross-entropy-loss-fusion with the native impl), compiled
# (torch.compile'd CE), eager (PyTorch F.cross_entropy on an fp32 upcast), eager_parallel
# (PyTorch DTensor loss_parallel), fp32_parallel (nanotron's sharded_cross_entropy on fp32-cast
# logits), vocab_parallel (Megatron's unfused vocab-parallel CE: the Megatron-LM CLI default),
# te (Transformer Engine's Triton parallel_cross_entropy: --cross-entropy-fusion-impl te)
LOSS_IMPL = ("fused", "compiled", "eager", "eager_parallel", "fp32_parallel", "vocab_parallel",
             "te")
# Which training framework runs the job (sim_core/frameworks.py, catalogs/frameworks.yaml):
# it sets the defaults of the fields below and which settings exist at all
FRAMEWORK = ("megatron-core", "nemo", "torchtitan", "deepspeed", "nanotron", "llm-foundry",
             "torchtune", "hf-trl")  # the last two: fine-tuning frameworks (sim_core/tasks.py)
# Pipeline schedule of a non-interleaved pipeline: one-forward-one-backward keeps at most pp
# micro-batches in flight; all-forward-all-backward (GPipe, nanotron's AFAB) keeps all of them.
# The interleaved schedule is 1f1b with vpp > 1.
PP_SCHEDULE = ("1f1b", "afab")
# MoE token dispatcher (Megatron-Core --moe-token-dispatcher-type, core_v0.15.3): allgather
# (all-gather tokens over the tp x ep group), alltoall (NCCL all-to-all of the routed copies),
# flex (DeepEP's fused dispatch/combine kernels, --moe-enable-deepep). See sim_core/moe.py.
MOE_DISPATCHER = ("alltoall", "allgather", "flex")
# MoE-specific activation recompute (Megatron-Core --recompute-modules, core_v0.15.3): none,
# moe_act (the routed experts' activation function is recomputed, its output not kept) or moe
# (the whole MoE layer is checkpointed: only its input is kept; dispatch and combine replay)
MOE_RECOMPUTE = ("none", "moe_act", "moe")


@dataclass(frozen=True)
class ModelSpec:
    """Shape of a decoder-only transformer. MoE fields stay 0 for dense models."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    activation: str = "gelu"
    tied_embeddings: bool = False
    head_dim: int = 0  # 0 = hidden // heads
    seq_len: int = 0  # default training sequence length (0 = must be given by the run)
    # Mixture of experts
    experts: int = 0
    top_k: int = 0
    expert_ffn: int = 0
    shared_experts: int = 0
    first_dense_layers: int = 0
    # Multi-head latent attention (DeepSeek-V2/V3); 0 = not MLA
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    # Sliding-window attention (Mistral, Gemma, GPT-OSS): a windowed layer's query attends to
    # the last `sliding_window` keys, itself included (HF transformers masking_utils
    # sliding_window_overlay: kv_idx > q_idx - sliding_window); 0 = every layer full causal.
    # window_attn_skip_freq N: Megatron-Core's field of the same name (core_v0.15.3
    # transformer/utils.py is_layer_window_attention): layer l (1-indexed) is windowed unless
    # l % N == 0, i.e. one full layer after N-1 windowed ones; 0 = every layer windowed
    sliding_window: int = 0
    window_attn_skip_freq: int = 0
    # Group-limited routing (DeepSeek-V3: HF config n_group 8, topk_group 4 = Megatron-Core
    # moe_router_num_groups / moe_router_group_topk, core_v0.15.3 moe/moe_utils.py
    # group_limited_topk): the experts split into router_groups contiguous groups, a token's
    # top_k experts come from its router_group_topk best groups; 0 = unrestricted top-k
    router_groups: int = 0
    router_group_topk: int = 0
    source: str = ""

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    def columns(self) -> dict:
        """The model's fields as run-frame columns (see MODEL_COLUMNS)."""
        d = asdict(self)
        d.pop("source")
        d["model"] = d.pop("name")
        return d


@dataclass(frozen=True)
class GPUSpec:
    """One accelerator type. Throughputs are dense (no sparsity), per GPU."""

    name: str
    peak_tflops: dict  # dtype -> dense TFLOP/s, keys fp32, tf32, bf16, fp8 (+ mxfp8, mxfp6,
    # mxfp4, nvfp4 where the part has them: catalog.OPTIONAL_DTYPES)
    hbm_gib: float  # usable HBM capacity in GiB
    hbm_bw_gbs: float  # HBM bandwidth, GB/s
    sm_count: int  # SMs (NVIDIA) or compute units (AMD)
    # 80 Ampere, 90 Hopper, 100 Blackwell; AMD Instinct by gfx target: 942 CDNA3 (MI300X,
    # MI325X), 950 CDNA4 (MI355X). Selects the efficiency and NCCL/RCCL tables.
    sm_arch: int
    nvlink_bw_gbs: float  # scale-up (NVLink / Infinity Fabric) bandwidth per GPU per direction
    nvls: bool  # NVLink SHARP (in-switch reduction) available
    price_per_hour: float  # default on-demand price per GPU-hour, USD
    tdp_w: float = 0.0
    source: str = ""
    vendor: str = "nvidia"  # nvidia (CUDA, NCCL) or amd (ROCm, RCCL)
    # Switchless full mesh: the number of direct scale-up links per GPU (AMD Instinct: 7 x16
    # Infinity Fabric links, one to each peer of an 8-GPU node); nvlink_bw_gbs is their sum.
    # 0 = switched (NVSwitch): every GPU reaches every peer at its full bandwidth.
    mesh_links: int = 0


@dataclass(frozen=True)
class ClusterSpec:
    """How GPUs are packaged and wired. Bandwidths are per direction."""

    name: str
    gpu: str
    gpus_per_node: int = 8
    nics_per_node: int = 8
    nic_bw_gbs: float = 50.0  # per NIC, GB/s (400 Gb/s = 50 GB/s)
    intra_latency_us: float = 2.0
    inter_latency_us: float = 5.0
    source: str = ""


@dataclass(frozen=True)
class InstanceSpec:
    """A cloud instance type: a node of a GPU, its network and its price (instances.yaml)."""

    name: str
    provider: str  # aws | gcp | azure | oci | lambda | ...
    type: str  # the provider's own name (p5.48xlarge): what a launcher asks for
    gpu: str
    gpus_per_node: int
    nics_per_node: int
    nic_gbps: float  # line rate per NIC, Gb/s
    transport: str  # efa | tcpx | tcpxo | roce | infiniband
    inter_latency_us: float  # per network step, from the transport unless given
    latency_basis: str  # nccl-constant | catalog-convention | assumption | given
    price_per_gpu_hour: float | None  # None: no sourced price (the run must give one)
    price_kind: str = ""  # on-demand | capacity-block | catalog
    price_date: str = ""
    price_source: str = ""
    assumed: tuple = ()  # fields whose value is an assumption
    source: str = ""

    @property
    def nic_bw_gbs(self) -> float:
        """GB/s per NIC per direction (clusters.yaml convention)."""
        return self.nic_gbps / 8.0


# ---------------------------------------------------------------------------------------------
# Run-frame columns: every configuration is one row with these fields.
# ---------------------------------------------------------------------------------------------
MODEL_COLUMNS = {
    # name: default (None = required)
    "model": "",
    "layers": None,
    "hidden": None,
    "heads": None,
    "kv_heads": 0,  # 0 = heads
    "ffn": None,
    "vocab": None,
    "activation": "gelu",
    "tied_embeddings": False,
    "head_dim": 0,
    "experts": 0,
    "top_k": 0,
    "expert_ffn": 0,
    "shared_experts": 0,
    "first_dense_layers": 0,
    "q_lora_rank": 0,
    "kv_lora_rank": 0,
    "qk_rope_head_dim": 0,
    "qk_nope_head_dim": 0,
    "v_head_dim": 0,
    "sliding_window": 0,  # 0 = no sliding-window attention (ModelSpec)
    "window_attn_skip_freq": 0,  # one full-attention layer in N; 0 = all windowed
    "router_groups": 0,  # 0 = unrestricted top-k routing (ModelSpec)
    "router_group_topk": 0,
}

RUN_COLUMNS = {
    "framework": "megatron-core",
    "seq_len": None,
    "global_batch": None,  # sequences per optimizer step
    "precision": "bf16",
}

CLUSTER_COLUMNS = {
    "gpu": None,  # GPU catalog id
    "num_gpus": None,
    "gpus_per_node": 8,
    "nics_per_node": 0,  # 0 = from the cluster/GPU defaults
    "nic_bw_gbs": 0.0,  # 0 = from defaults
    # board power limit (nvidia-smi -pl), W; 0 = the GPU's rated power (gpus.yaml tdp_w).
    # Sets the sustained tensor clock (compute.power_clock_scale); never above the rating
    "power_limit_w": 0.0,
    # per-step latencies of the NCCL model; 0 = from the GPU's default cluster (an instance
    # type sets them from its transport: sweep/config/files.py, catalogs/instances.yaml)
    "intra_latency_us": 0.0,
    "inter_latency_us": 0.0,
}

PARALLEL_COLUMNS = {
    "tp": 1,
    "pp": 1,
    "dp": 0,  # 0 = derived: num_gpus / (tp * pp * cp)
    "cp": 1,
    "ep": 1,
    "etp": 0,  # expert tensor parallel; 0 = same as tp
    "vpp": 1,  # virtual pipeline stages (model chunks) per pipeline rank
    "micro_batch": 1,
    "pp_schedule": "1f1b",
    "recompute": "none",
    "sequence_parallel": False,
    "zero": 1,  # 0 none, 1 optimizer states, 2 + grads, 3 + params (3 == FSDP full shard)
    "distributed_optimizer": True,  # Megatron name for zero>=1 on optimizer states
    "overlap_grad_reduce": True,
    "overlap_param_gather": True,
    "tp_comm_overlap": False,
    "moe_a2a_overlap": False,
    "grad_reduce_fp32": True,  # fp32 main-grad buffer and reduction (Megatron-LM script default)
    # Megatron-Core's precision-aware optimizer with bf16 Adam moments (--use-precision-aware-
    # optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16; optimizer_config.py core_v0.15.3):
    # exp_avg and exp_avg_sq take 2 B each instead of 4 (fp32 master weights kept), 12 -> 8 B
    "adam_bf16_states": False,
    # Megatron-Core multi-token prediction (mtp_num_layers; transformer/multi_token_prediction.py
    # core_v0.15.3): each MTP layer runs on the last pipeline stage an embedding lookup, two
    # RMSNorms, eh_proj (2h -> h, column-parallel), one transformer layer of the decoder's spec,
    # a final norm, and the shared output head + loss again (models/gpt/gpt_model.py L542-581)
    "mtp_layers": 0,
    # decoder layers on the last pipeline rank where a pipeline layout moves some off it to
    # make room for the loss and MTP (Megatron-Core pipeline_model_parallel_layout); 0 = the
    # even split's layers per stage
    "pp_last_stage_layers": 0,
    # Megatron-Core's uneven split that counts the embedding as one layer on the first pipeline
    # stage and the loss as one on the last (account_for_embedding_in_pipeline_split,
    # account_for_loss_in_pipeline_split; transformer_block.py get_num_layers_to_build,
    # core_v0.15.0): sim_core/pp_split.py
    "account_for_embedding_in_pipeline_split": False,
    "account_for_loss_in_pipeline_split": False,
    "attention_kernel": "fa3",
    # norms, rotary, activation functions fused into few kernels (Transformer Engine,
    # torch.compile); False = eager PyTorch, one kernel per elementary op
    "fused_elementwise": True,
    # the GLU activation (SwiGLU) as one fused kernel that saves its input and recomputes
    # act(gate) in backward; False = eager act(gate) * up, which keeps act(gate) as well
    "fused_glu": True,
    # MoE routing: dropless (every token reaches its experts) or token dropping with a capacity
    # factor; expert_skew is the Zipf exponent of expert popularity (0 = balanced)
    # context parallel communication: ring (p2p, overlapped with attention), allgather or a2a
    # (Ulysses all-to-all, workload._comms)
    "cp_comm": "ring",
    # cp_comm a2a with fewer KV heads per TP rank than cp: False = refused (TE v2.8
    # AttnFuncWithCPAndQKVOA2A asserts k heads % cp_size == 0; DeepSpeed's single_all_to_all
    # splits K/V heads as Q's); True = KV heads repeated up to cp before the all-to-all (verl
    # v0.5.0 models/transformers/monkey_patch.py: repeats = max(sp // kv_heads, 1), so cp must
    # be a multiple of the KV heads). The RL training frame sets it for verl's Ulysses SP.
    "cp_kv_repeat": False,
    # how the loss is computed (LOSS_IMPL): Megatron's unfused vocab-parallel cross-entropy by
    # default (its CLI default; the framework profile sets it); torchtitan runs eager (2024) or
    # compiled (2025) PyTorch cross-entropy
    "loss_impl": "vocab_parallel",
    # FP8 primary weights: parameters stored and all-gathered in FP8 (TE fp8_model_params)
    "fp8_param_gather": False,
    # FP8 weight copies kept across the micro-batches of a step: Megatron-Core passes TE's
    # is_first_microbatch so each weight is quantised once per step; False is its
    # disable_parameter_transpose_cache (is_first_microbatch=None: TE quantises every weight
    # in every forward, megatron/core/extensions/transformer_engine.py TELinear.forward), which
    # Megatron-Bridge's fine-tuning perf configs set (compute._stage_core prices the casts)
    "fp8_weight_cache": True,
    "fp8_recipe": "delayed",  # FP8_RECIPE; the framework profile sets it (frameworks.yaml)
    # attention dropout probability (Megatron --attention-dropout): a flash kernel applies it
    # in-kernel; the unfused kernel runs it as a pass over the s x s probabilities and keeps its
    # mask and output for backward. 0 = none (Llama-style recipes; Megatron's CLI default is 0.1)
    "attention_dropout": 0.0,
    "moe_dropless": True,
    "capacity_factor": 1.0,
    "expert_skew": 0.0,
    # MoE dispatch path (sim_core/moe.py; Megatron-Core core_v0.15.3 flags in sweep/advice/export.py).
    # moe_a2a_overlap above is --overlap-moe-expert-parallel-comm (combined 1F1B EP overlap)
    "moe_dispatcher": "alltoall",
    "moe_permute_fusion": False,  # --moe-permute-fusion (TE fused permute/unpermute kernels)
    "moe_router_fusion": False,  # --moe-router-fusion (TE fused top-k + scores + aux loss)
    "moe_delay_wgrad": False,  # --delay-wgrad-compute (needs moe_a2a_overlap)
    "moe_shared_expert_overlap": False,  # --moe-shared-expert-overlap (alltoall only)
    "moe_recompute": "none",  # MOE_RECOMPUTE; with recompute none (selective modules moe_act/moe)
    # Megatron-Core's selective recompute modules (--recompute-modules, with recompute
    # selective): a list of names (sim_core/recompute.py MODULES), a bit mask in the Batch;
    # 0 = none listed (recompute selective is then op-level selective checkpointing)
    "recompute_modules": 0,
}

# Failures, checkpoints and restarts (sim_core/goodput.py, catalogs/reliability.yaml).
# 0 (or -1 for ckpt_async) = the default: the GPU generation's published rate, 1 GB/s of
# storage per server, a 10-minute restart, the Young/Daly interval, the framework's own save
RELIABILITY_COLUMNS = {
    "mtbf_node_hours": 0.0,  # mean server-hours between job-interrupting failures
    "storage_gbs": 0.0,  # checkpoint write/read bandwidth the job gets, GB/s (aggregate)
    "restart_min": 0.0,  # detection + rescheduling + process start, minutes (without the load)
    "ckpt_interval_steps": 0,  # optimizer steps between checkpoints
    "ckpt_async": -1,  # 1 asynchronous save, 0 synchronous, -1 the framework's default
}

ALL_COLUMNS = {**MODEL_COLUMNS, **RUN_COLUMNS, **CLUSTER_COLUMNS, **PARALLEL_COLUMNS,
               **RELIABILITY_COLUMNS, **FINETUNE_COLUMNS}  # fine-tuning: sim_core/tasks.py

CATEGORICAL = {"recompute": RECOMPUTE, "precision": PRECISION, "activation": ACTIVATION,
               "attention_kernel": ATTENTION_KERNEL, "cp_comm": CP_COMM,
               "loss_impl": LOSS_IMPL, "framework": FRAMEWORK, "pp_schedule": PP_SCHEDULE,
               "moe_dispatcher": MOE_DISPATCHER, "moe_recompute": MOE_RECOMPUTE,
               "fp8_recipe": FP8_RECIPE, "task": TASKS}
