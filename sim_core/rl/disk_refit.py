"""Weight update through shared storage (AReaL v0.3): the trainer saves, the engines load.

AReaL v0.3.0 does not broadcast the new weights over NCCL. After every `train_step` its model
worker saves the policy as a Hugging Face checkpoint into the cluster's shared file root
(inclusionAI/AReaL v0.3.0 realhf/system/model_worker.py, the `param-sync-save` block after
`train_step`: `__save_model` into `PARAM_REALLOC_PATH/<step>`, then the new version is
published), and the generation-server manager calls every SGLang server's
`/update_weights_from_disk` on that directory (realhf/system/gserver_manager.py
`check_new_params` / `flush_requests_and_update_weights`). The paper says the same (arXiv
2505.24298 sec. 4.1: trainers "store the resulting parameters in distributed storage"; Fig. 2
"Parameter Save/Load").

- **Write.** The save gathers each tensor over TP and writes each pipeline stage's part as
  `torch.save` shards of at most 10 GB (realhf/impl/model/conversion/hf_registry.py `save`:
  `REAL_SAVE_MAX_SHARD_SIZE_BYTE` default 1e10, the shards of a stage spread over its DP x TP
  ranks): pp x ceil(stage bytes / 10 GB) writers, in the parameter dtype (fp16 / bf16, 2 B).
  The busiest node writes its writers' share at the storage's per-node bandwidth.
- **Read.** Every engine loads the whole checkpoint: SGLang's loader reads every shard file on
  every TP rank and keeps its slice. The ranks of one node read the same files, so each rollout
  node reads the model once from storage (the page cache serves the node's other readers).
- **Bandwidth.** catalogs/rl.yaml `periodic.storage_gbs_per_node` (a cited sustained write
  figure; no published read figure for these clusters, so reads are priced at the same rate),
  or the row's `storage_gbs_per_node`.

The trainer's save and the engines' load run one after the other (the servers load the
version once it is published), so the refit is their sum; the step composes it as any weight
sync (phases.compose_step).
"""

from __future__ import annotations

import numpy as np

from ..columns import Batch
from . import periodic

SHARD_BYTES = 1e10  # realhf hf_registry.save: REAL_SAVE_MAX_SHARD_SIZE_BYTE default


def seconds(b: Batch, train_pp) -> dict:
    """Per row: the trainer's write (`disk_write_s`), one rollout node's read (`disk_read_s`)
    and their sum (`disk_refit_s`), for every row (the caller picks the rows that refit so)."""
    model = b.params * 2.0  # the HF checkpoint in the parameter dtype
    pp = np.maximum(np.asarray(train_pp, dtype=float), 1.0)
    writers = pp * np.ceil(model / pp / SHARD_BYTES)
    nodes = np.maximum(np.ceil(b.train_gpus / np.maximum(b.gpus_per_node, 1.0)), 1.0)
    bw = periodic.storage_bytes_per_s(b)
    write = model / np.minimum(writers, nodes) / bw
    read = model / bw
    return {"disk_write_s": write, "disk_read_s": read, "disk_refit_s": write + read}


def active(b: Batch) -> np.ndarray:
    """Rows whose weights reach the engines through storage (`refit_via_disk`)."""
    return b.floats("refit_via_disk", 0.0) > 0
