"""Cloud instance types: the catalog, `cluster: {instance: ...}`, the network they feed into the
NCCL model, per-instance prices, the report's labels, `sweep catalog` and the launch files."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import yaml

from sim_core import catalog, nccl
from sim_core.columns import frame_to_batch
from sim_core.step import network
from sweep.config import parse_run, parse_space
from sweep.engine.space import Space, sim_frame
from sweep.errors import ConfigError

RUN = {"model": "llama3-8b", "seq_len": 4096, "global_batch": 64,
       "parallel": {"tp": 2, "pp": 2}}


def _run(cluster):
    return parse_run({**RUN, "cluster": cluster})


def _net(cluster):
    frame = Space.from_config(_run(cluster)).frame(0, 1)
    return frame, network(frame_to_batch(sim_frame(frame)))


# --------------------------------------------------------------------------------- catalog
def test_every_instance_is_usable_or_waits_for_its_gpu():
    usable, waiting = catalog.instance_names(), catalog.unavailable_instances()
    assert {"aws-p5", "gcp-a3-mega", "azure-nd-h100-v5", "oci-h100", "lambda-h100"} <= set(usable)
    for name, inst in waiting.items():  # the AMD / Blackwell Ultra parts of the other branch
        assert inst.gpu not in catalog.gpu_names()
        with pytest.raises(ValueError, match="not have"):
            catalog.get_instance(name)
    for name in usable:
        inst = catalog.get_instance(name)
        assert inst.gpu in catalog.gpu_names() and inst.source
        if inst.price_per_gpu_hour is not None:  # no source, no price
            assert inst.price_kind and inst.price_date and inst.price_source


def test_instance_network_follows_its_transport():
    p5, mega = catalog.instance_cluster("aws-p5"), catalog.instance_cluster("gcp-a3-mega")
    assert p5.nics_per_node * p5.nic_bw_gbs == 32 * 100 / 8  # 3,200 Gb/s of EFA
    lat = {k: v["inter_latency_us"] for k, v in catalog.transports().items()}
    assert p5.inter_latency_us == lat["efa"] and mega.inter_latency_us == lat["tcpxo"]
    assert catalog.get_instance("gcp-a3-mega").latency_basis == "assumption"
    assert catalog.get_instance("azure-nd-h100-v5").latency_basis == "nccl-constant"
    # an instance id also serves as a cluster (sweep calibrate nccl --cluster aws-p5)
    assert catalog.get_cluster("aws-p5") == p5


def test_unknown_instance_points_to_the_catalog_command():
    with pytest.raises(ConfigError) as e:
        _run({"instance": "aws-p55", "nodes": 2})
    msg = str(e.value)
    assert "\n" not in msg and "did you mean 'aws-p5'" in msg
    assert "sweep catalog instances" in msg


# --------------------------------------------------------------------------------- run files
def test_shorthand_and_mapping_give_the_same_hardware():
    # `cluster: aws-p5` names only the instance: the size comes from the space
    a = Space.from_config(parse_space({**RUN, "cluster": "aws-p5", "space": {"nodes": [1, 2]}}))
    assert a.fixed["instance"] == "aws-p5" and a.fixed["gpu"] == "h100-sxm"
    assert a.frame(0, 2)["num_gpus"].tolist() == [8, 16]
    frame, _ = _net({"instance": "aws-p5", "nodes": 2})
    assert int(frame["num_gpus"].iloc[0]) == 16 and frame["gpu"].iloc[0] == "h100-sxm"


def test_instance_network_reaches_the_collective_model():
    """The same GPU on two instance types: a small cross-node all-reduce costs the transport's
    latency and NICs (A3 High: TCPX, 4 x 200G; ND H100 v5: InfiniBand, 8 x 400G)."""
    _, tcpx = _net({"instance": "gcp-a3-high", "nodes": 2, "price_per_hour": 9.0})
    _, ib = _net({"instance": "azure-nd-h100-v5", "nodes": 2, "price_per_hour": 9.0})
    assert float(tcpx["inter_latency_us"][0]) == 20.0 and float(ib["inter_latency_us"][0]) == 5.0
    assert float(ib["nic_bw_gbs"][0]) == 4 * float(tcpx["nic_bw_gbs"][0])
    small = [nccl.collective_time("all_reduce", 65536, 16, 2, n)["time_s"][0] for n in (tcpx, ib)]
    big = [nccl.collective_time("all_reduce", 1 << 30, 16, 2, n)["time_s"][0] for n in (tcpx, ib)]
    # without the instance figures both would be the H100 default cluster: equal times
    assert small[0] > small[1] and big[0] > 2 * big[1]


def test_unpriced_instance_needs_a_price_and_takes_one():
    with pytest.raises(ConfigError, match="cluster.price_per_hour"):
        _run({"instance": "gcp-a3-mega", "nodes": 2})
    cfg = _run({"instance": "gcp-a3-mega", "nodes": 2, "price_per_hour": {"gcp-a3-mega": 11.5}})
    assert Space.from_config(cfg).prices()["gcp-a3-mega"] == 11.5


def test_instance_fixes_gpu_and_node():
    with pytest.raises(ConfigError, match="cluster.gpu"):
        _run({"instance": "aws-p5", "gpu": "h200", "nodes": 2})
    with pytest.raises(ConfigError, match="gpus_per_node"):
        _run({"instance": "aws-p5", "gpus_per_node": 4, "nodes": 2})
    with pytest.raises(ConfigError, match="cluster.gpu: required"):
        _run({"nodes": 2})


# --------------------------------------------------------------------------------- spaces
SPACE = {**RUN, "name": "inst", "cluster": {"nodes": 2, "price_per_hour": {"azure-nd-h100-v5": 9.5}},
         "space": {"instance": ["aws-p5", "aws-p5en", "azure-nd-h100-v5"], "tp": [1, 2]}}


def test_space_varies_instance_per_row():
    sp = Space.from_config(parse_space(SPACE))
    f = sp.frame(0, sp.size)
    by = f.drop_duplicates("instance").set_index("instance")
    assert by.loc["aws-p5en", "gpu"] == "h200" and by.loc["aws-p5", "gpu"] == "h100-sxm"
    assert by.loc["aws-p5en", "nics_per_node"] == 16 and by.loc["aws-p5", "nics_per_node"] == 32
    assert (f["num_gpus"] == 16).all()
    prices = sp.prices()
    assert prices["aws-p5en"] == 7.912 and prices["azure-nd-h100-v5"] == 9.5
    from sweep.results import row_prices

    got = row_prices(f, prices).groupby(f["instance"]).first().to_dict()
    assert got == {"aws-p5": 6.88, "aws-p5en": 7.912, "azure-nd-h100-v5": 9.5}
    # the structural columns (no frame) see each instance's GPUs per node too
    cols = sp.structural_columns(np.arange(sp.size))
    assert (cols["num_gpus"] == 16).all()


def test_space_refuses_gpu_and_instance_axes_together():
    bad = {**SPACE, "space": {"instance": ["aws-p5"], "gpu": ["h100-sxm"]}}
    with pytest.raises(ConfigError, match="not both"):
        parse_space(bad)


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    """A small instance space searched end to end with the real simulator."""
    from sweep.cli.main import main

    out = tmp_path_factory.mktemp("inst") / "run"
    path = out.parent / "space.yaml"
    path.write_text(yaml.safe_dump({**SPACE, "search": {"strategy": "grid"}}))
    assert main(["search", str(path), "--out", str(out)]) == 0
    return out


def test_search_recommends_and_the_frontier_names_instances(searched):
    from sweep.advice.report import hardware

    df = pd.read_parquet(searched / "results.parquet")
    labels = set(hardware(df))
    assert "aws-p5en (h200, $7.91/GPU-h)" in labels and "aws-p5 (h100-sxm, $6.88/GPU-h)" in labels
    from sweep.cli.main import main

    assert main(["report", str(searched)]) == 0
    md = (searched / "report.md").read_text()
    assert "/GPU-h)" in md  # the frontier table's hardware column


def test_launch_files_pass_their_key_checks_and_carry_the_layout(searched):
    from sweep.advice import export, launch

    rec = yaml.safe_load((searched / "recipe" / "run.yaml").read_text())
    best = pd.read_csv(searched / "ranking.csv").iloc[0]
    nodes = rec["cluster"]["nodes"]
    gpn = catalog.get_instance(rec["cluster"]["instance"]).gpus_per_node
    script = (searched / "recipe" / "launch.sbatch").read_text()
    task = yaml.safe_load((searched / "recipe" / "skypilot.yaml").read_text())
    assert launch.unknown_sbatch_options(script) == []
    assert launch.unknown_skypilot_keys(task) == []
    assert f"#SBATCH --nodes={nodes}" in script and f"#SBATCH --gpus-per-node={gpn}" in script
    srun = next(ln for ln in script.splitlines() if ln.startswith("srun "))
    assert launch.torchrun_layout(srun) == {"nnodes": nodes, "nproc-per-node": gpn}
    assert task["num_nodes"] == nodes and task["resources"]["accelerators"].endswith(f":{gpn}")
    assert launch.torchrun_layout(task["run"]) == {"nnodes": nodes, "nproc-per-node": gpn}
    assert task["resources"]["instance_type"] == catalog.get_instance(
        rec["cluster"]["instance"]).type
    # the launched program's flags: tp and pp as chosen, dp what is left of the world
    assert "source ./megatron_args.sh" in script and "source ./megatron_args.sh" in task["run"]
    argv = export.parse_megatron_text((searched / "recipe" / "megatron_args.sh").read_text())
    tp = int(argv[argv.index("--tensor-model-parallel-size") + 1])
    pp = int(argv[argv.index("--pipeline-model-parallel-size") + 1])
    assert (tp, pp) == (int(best["tp"]), int(best["pp"]))
    assert nodes * gpn // (tp * pp) == int(best["dp"])


def test_key_checks_catch_a_wrong_key():
    from sweep.advice import launch

    assert launch.unknown_sbatch_options("#SBATCH --gpus-per-nod=8\necho $SLURM_NODE_RANK\n") \
        == ["--gpus-per-nod", "SLURM_NODE_RANK"]
    assert launch.unknown_skypilot_keys({"num_node": 2, "resources": {"cloud": "aws",
                                                                      "gpus": "H100:8"}}) \
        == ["num_node", "resources.gpus"]


# --------------------------------------------------------------------------------- sweep catalog
@pytest.mark.parametrize("kind", ["gpus", "instances", "models", "frameworks"])
def test_catalog_command_lists_one_line_each(kind, capsys):
    from sweep.cli.main import main

    assert main(["catalog", kind]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    names = {"gpus": catalog.gpu_names(), "models": catalog.model_names(),
             "instances": catalog.instance_names() + list(catalog.unavailable_instances())}
    if kind in names:
        assert sorted(ln.split()[0] for ln in lines) == sorted(names[kind])
    assert all("|" in ln or "unavailable" in ln for ln in lines)


def test_unknown_gpu_error_points_to_catalog_command(capsys):
    with pytest.raises(ConfigError, match=r"sweep catalog gpus"):
        _run({"gpu": "h1000", "nodes": 2})


def test_price_override_at_report_time_reprices_an_instance():
    from sweep.advice.recommend import reprice

    df = pd.DataFrame({"gpu": ["h100-sxm", "h100-sxm"], "instance": ["aws-p5", "lambda-h100"],
                       "num_gpus": [16, 16], "step_time_s": [10.0, 10.0],
                       "global_batch": [64, 64], "seq_len": [4096, 4096],
                       "price_per_hour": [4.916, 3.99]})
    out = reprice(df, {"aws-p5": 2.0})
    assert out["price_per_hour"].tolist() == [2.0, 3.99]
    assert math.isclose(out["cost_per_step_usd"].iloc[0], 16 * 10 / 3600 * 2.0)


# --------------------------------------------------------------------------------- calibration
def test_nccl_calibration_on_an_instance_takes_its_network(isolated_profiles, tmp_path, capsys):
    """`sweep calibrate nccl --cluster gcp-a3-mega`: the base the scales are relative to is the
    instance's network (8 x 200G per 8 GPUs, TCPXO latency), and a search on other instance types
    under that profile says the scales were fitted elsewhere."""
    from pathlib import Path

    from sim_core import profiles
    from sweep.cli.main import main
    from sweep.cli.search import profile_instance_note

    log = Path(__file__).parent / "data" / "nccl_logs" / "gcp_a3mega_h100_allreduce_mpirun.log"
    assert main(["calibrate", "nccl", str(log), "--cluster", "gcp-a3-mega",
                 "--profile", "a3m"]) == 0
    net = profiles.load_manifest("a3m")["components"]["nccl"]["network"]
    assert net["nic_bw_gbs"] == 25.0 and net["inter_latency_us"] == 15.0
    same = parse_space({**SPACE, "space": {"instance": ["aws-p5"]},
                        "cluster": {"nodes": 2}})
    assert "aws-p5" in profile_instance_note("a3m", same)
    own = _run({"instance": "gcp-a3-mega", "nodes": 2, "price_per_hour": 9.0})
    assert profile_instance_note("a3m", own) == ""


def test_api_frame_may_name_instances():
    from sweep import api

    df = pd.DataFrame({"model": ["llama3-8b"] * 2, "seq_len": [4096] * 2,
                       "global_batch": [64] * 2, "instance": ["aws-p5", "gcp-a3-high"],
                       "nodes": [2, 2], "tp": [2, 2]})
    out = api.simulate(df).set_index("instance")
    assert out.loc["aws-p5", "num_gpus"] == 16
    assert out.loc["gcp-a3-high", "inter_latency_us"] == 20.0
    assert out.loc["aws-p5", "price_per_hour"] == 6.88
    assert np.isnan(out.loc["gcp-a3-high", "price_per_hour"])  # no sourced price: cost unknown


def test_unknown_framework_error_points_to_catalog_command():
    with pytest.raises(ConfigError, match=r"sweep catalog frameworks"):
        parse_run({**RUN, "framework": "megatron", "cluster": {"gpu": "h100-sxm", "nodes": 2}})
