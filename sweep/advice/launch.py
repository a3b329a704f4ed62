"""Launch files of a recommended configuration: a Slurm batch script and a SkyPilot task.

Both start the framework's own recipe (megatron_args.sh, torchtitan.toml, nanotron.yaml,
deepspeed_config.json written next to them by `write_recipe`) with torchrun on every node: one
torchrun per node (srun --ntasks-per-node=1, or SkyPilot's run on each node), nproc-per-node
= the GPUs per node, nnodes = the nodes of the chosen layout. The keys they use are checked
against lists taken from the projects' code (sweep/advice/data/known_flags/sbatch.tsv,
skypilot.tsv): `unknown_sbatch_options`, `unknown_skypilot_keys`.
"""

from __future__ import annotations

import math
import re
import shlex

import yaml

from .export import KNOWN_FLAGS_DIR, config_of, describe

SBATCH_SOURCE = "SchedMD/slurm 284c3b95f0 (doc/man/man1/sbatch.1)"
SKYPILOT_SOURCE = "skypilot-org/skypilot 00052dfe0d (sky/utils/schemas.py)"
RDZV_PORT = 29500
# SkyPilot accelerator names (skypilot-catalog vms.csv AcceleratorName) of catalog GPUs; used only
# when the configuration names no instance type (an instance gives cloud + instance_type)
SKYPILOT_ACCELERATORS = {"a100-40gb": "A100", "a100-80gb": "A100-80GB", "h100-sxm": "H100",
                         "h200": "H200", "b200": "B200", "gb200": "GB200", "mi300x": "MI300X"}


def layout(row) -> dict:
    """nodes, gpus_per_node and the parallel sizes of a results row."""
    d = config_of(row)
    gpn = int(d["gpus_per_node"])
    return {"nodes": math.ceil(int(d["num_gpus"]) / gpn), "gpus_per_node": gpn,
            "tp": int(d["tp"]), "pp": int(d["pp"]), "dp": int(d["dp"]), "cp": int(d["cp"]),
            "ep": int(d["ep"])}


def _program(d: dict) -> tuple[list[str], str]:
    """(torchrun's program and its arguments, shell lines that prepare them) per framework:
    the recipe file each framework's launcher reads."""
    fw = str(d.get("framework") or "megatron-core")
    if fw == "torchtitan":  # torchtitan run_train.sh: torchrun ... -m torchtitan.train
        return ["-m", "torchtitan.train", "--job.config_file", "torchtitan.toml"], ""
    if fw == "nanotron":  # nanotron README: torchrun ... run_train.py --config-file
        return ["run_train.py", "--config-file", "nanotron.yaml"], ""
    if fw == "deepspeed":  # a training script that takes DeepSpeed's --deepspeed_config
        return ["train.py", "--deepspeed", "--deepspeed_config", "deepspeed_config.json"], ""
    # Megatron-LM (megatron-core, nemo, llm-foundry rows run the Megatron flags as exported)
    return ["pretrain_gpt.py", '"${MEGATRON_ARGS[@]}"'], "source ./megatron_args.sh"


def _torchrun(lay: dict, node_rank: str, master: str, rdzv_id: str) -> list[str]:
    return ["torchrun", f"--nnodes={lay['nodes']}", f"--nproc-per-node={lay['gpus_per_node']}",
            f"--node-rank={node_rank}", f"--rdzv-id={rdzv_id}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={master}:{RDZV_PORT}"]


def _header(d: dict, lay: dict, source: str) -> list[str]:
    return [f"# {d.get('model')}: {describe(d)}",
            f"# layout: {lay['nodes']} nodes x {lay['gpus_per_node']} GPUs, tp {lay['tp']} "
            f"pp {lay['pp']} dp {lay['dp']} cp {lay['cp']} ep {lay['ep']} (dp derived)",
            f"# keys checked against {source}"]


def slurm_script(row) -> str:
    """sbatch script: one torchrun per node through srun, rendezvous on the first node."""
    d = config_of(row)
    lay = layout(row)
    prog, prep = _program(d)
    name = re.sub(r"[^A-Za-z0-9._-]", "-", f"sweep-{d.get('model') or 'run'}")[:64]
    run = _torchrun(lay, "$SLURM_NODEID", "$MASTER_ADDR", "$SLURM_JOB_ID") + prog
    lines = ["#!/bin/bash", *_header(d, lay, SBATCH_SOURCE),
             f"#SBATCH --job-name={name}",
             f"#SBATCH --nodes={lay['nodes']}",
             "#SBATCH --ntasks-per-node=1",
             f"#SBATCH --gpus-per-node={lay['gpus_per_node']}",
             "#SBATCH --exclusive",
             "#SBATCH --output=%x-%j.out",
             "set -euo pipefail",
             'cd "$SLURM_SUBMIT_DIR"  # the recipe/ folder: submit with `sbatch launch.sbatch`',
             'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
             "export MASTER_ADDR"]
    if prep:
        lines.append(prep)
    # single quotes: each node expands its own SLURM_NODEID
    lines.append("srun --ntasks-per-node=1 bash -c '" + " ".join(run).replace("'", "'\\''")
                 + "'")
    return "\n".join(lines) + "\n"


def skypilot_task(row) -> dict:
    """SkyPilot task: resources (the instance type, or the accelerator), num_nodes, run."""
    from sim_core import catalog

    d = config_of(row)
    lay = layout(row)
    prog, prep = _program(d)
    res: dict = {}
    if d.get("instance"):
        inst = catalog.get_instance(d["instance"])
        res = {"cloud": inst.provider, "instance_type": inst.type,
               "accelerators": f"{SKYPILOT_ACCELERATORS.get(inst.gpu, inst.gpu.upper())}:"
                               f"{inst.gpus_per_node}"}
        if inst.provider in ("aws", "gcp", "azure"):
            res["network_tier"] = "best"  # the cloud's GPU fabric (EFA, GPUDirect, IB)
    elif d["gpu"] in SKYPILOT_ACCELERATORS:
        res = {"accelerators": f"{SKYPILOT_ACCELERATORS[d['gpu']]}:{lay['gpus_per_node']}"}
    master = '$(echo "$SKYPILOT_NODE_IPS" | head -n1)'
    run = _torchrun(lay, "$SKYPILOT_NODE_RANK", master, "sweep") + prog
    body = "\n".join([x for x in (prep, " ".join(run)) if x]) + "\n"
    return {"name": re.sub(r"[^a-z0-9-]", "-", f"sweep-{str(d.get('model') or 'run').lower()}"),
            "resources": res, "num_nodes": lay["nodes"], "workdir": ".", "run": body}


def skypilot_yaml(row) -> str:
    d = config_of(row)
    head = "\n".join(_header(d, layout(row), SKYPILOT_SOURCE))
    return head + "\n" + yaml.dump(skypilot_task(row), Dumper=_BlockDumper, sort_keys=False,
                                   default_flow_style=False)


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings (the run script) as YAML literal blocks."""


_BlockDumper.add_representer(
    str, lambda dumper, v: dumper.represent_scalar("tag:yaml.org,2002:str", v,
                                                   style="|" if "\n" in v else None))


FILES = {"slurm": ("launch.sbatch", slurm_script), "skypilot": ("skypilot.yaml", skypilot_yaml)}


# ---------------------------------------------------------------------------------------------
# Key checks
# ---------------------------------------------------------------------------------------------
def _known(name: str, kind: str) -> set[str]:
    text = (KNOWN_FLAGS_DIR / f"{name}.tsv").read_text()
    rows = [ln.split("\t") for ln in text.splitlines() if ln and not ln.startswith("#")]
    return {r[0] for r in rows if len(r) > 1 and r[1] == kind}


def unknown_sbatch_options(script: str) -> list[str]:
    """#SBATCH options and SLURM_* variables of a script that sbatch does not declare."""
    opts = {m.group(1) for m in re.finditer(r"^#SBATCH\s+(--[A-Za-z0-9-]+)", script, re.M)}
    env = set(re.findall(r"\$\{?(SLURM_[A-Z_]+)", script))
    return sorted((opts - _known("sbatch", "option")) | (env - _known("sbatch", "env")))


def unknown_skypilot_keys(task: dict) -> list[str]:
    """Dotted keys, cloud names and SKYPILOT_* variables of a task that SkyPilot does not
    declare."""
    keys = set()
    for k, v in task.items():
        keys.add(k)
        if isinstance(v, dict):
            keys |= {f"{k}.{kk}" for kk in v}
    bad = keys - _known("skypilot", "key")
    cloud = (task.get("resources") or {}).get("cloud")
    if cloud is not None and cloud not in _known("skypilot", "cloud"):
        bad.add(f"resources.cloud={cloud}")
    env = set(re.findall(r"\$\{?(SKYPILOT_[A-Z_]+)", str(task.get("run", ""))))
    return sorted(bad | (env - _known("skypilot", "env")))


def torchrun_layout(command: str) -> dict:
    """nnodes and nproc-per-node of the torchrun line of a launch file (tests read back)."""
    toks = shlex.split(command.replace("'", " "), comments=False)
    out = {}
    for t in toks:
        for key in ("--nnodes", "--nproc-per-node"):
            if t.startswith(key + "="):
                out[key[2:]] = int(t.split("=", 1)[1])
    return out
