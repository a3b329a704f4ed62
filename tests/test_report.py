"""`sweep report` on the bundled multi-hardware space: the cost-vs-throughput frontier is
correct on the data, the HTML is self-contained (no script, no remote resource, every plot
embedded), user strings are escaped, and the page renders in headless Chromium (skipped when
no Chromium is installed)."""

from __future__ import annotations

import base64
import io
import re

import numpy as np
import pytest

from sweep import report
from sweep.cli import main
from sweep.frontier import dominated_by, pareto_front
from sweep.recommend import derive, load_run

from .results_fixture import ROOT, make_results

MULTI = ROOT / "search_spaces" / "multi-hardware.yaml"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return make_results(MULTI, tmp_path_factory.mktemp("mh") / "run")


@pytest.fixture(scope="module")
def written(run, tmp_path_factory):
    out = tmp_path_factory.mktemp("rep")
    assert main(["report", str(run), "--out", str(out), "--tokens", "15T"]) == 0
    return out


def test_space_spans_hardware(run):
    df, _ = load_run(run)
    ok = df[df["status"] == "ok"]
    assert ok["gpu"].nunique() >= 4 and ok["num_gpus"].nunique() >= 4


def test_frontier_is_correct_on_the_data(run):
    df, _ = load_run(run)
    fits = derive(df[df["status"] == "ok"])
    front = report.frontier(fits)
    cost = fits["cost_per_mtok_usd"].to_numpy(float)
    thr = fits["tokens_per_s"].to_numpy(float)
    on = fits["config_id"].isin(front["config_id"]).to_numpy()
    assert 1 <= on.sum() < len(fits)
    fc, ft = cost[on], thr[on]
    # every frontier point is non-dominated by any configuration that fits
    for i in np.flatnonzero(on):
        assert not dominated_by(cost, thr, i).any()
    # every dominated point is off the frontier (and some frontier point dominates it)
    for i in np.flatnonzero(~on):
        assert ((fc <= cost[i]) & (ft >= thr[i]) & ((fc < cost[i]) | (ft > thr[i]))).any()


def test_pareto_front_matches_brute_force():
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 50, 300):
        c = rng.integers(0, 12, n).astype(float)  # many ties
        t = rng.integers(0, 12, n).astype(float)
        if n > 3:
            c[0], t[0] = np.nan, 5.0
        brute = np.array([np.isfinite(c[i]) and np.isfinite(t[i])
                          and not (np.nan_to_num(c, nan=np.inf) <= c[i])[
                              (t >= t[i]) & ((c < c[i]) | (t > t[i]))].any()
                          for i in range(n)])
        assert (pareto_front(c, t) == brute).all()


def test_report_files(written):
    html = (written / "report.html").read_text()
    md = (written / "report.md").read_text()
    assert "<script" not in html.lower()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)  # nothing remote
    imgs = re.findall(r'<img alt="([^"]+)" src="data:image/png;base64,([^"]+)"', html)
    assert {a for a, _ in imgs} == {"cost vs throughput frontier", "step time breakdown",
                                    "TP x PP heatmap", "memory per category"}
    for _, b64 in imgs:
        assert base64.b64decode(b64)[:8] == b"\x89PNG\r\n\x1a\n"
    for text in ("Pareto frontier", "Why the best beats the rule of thumb", "--tensor-model"):
        assert text in html and text in md
    assert "Rule of thumb (TP=8" in md
    for name in ("frontier", "breakdown", "heatmap", "memory"):
        assert (written / "report_plots" / f"{name}.png").exists()


def test_frontier_table_lists_every_frontier_point(run, written):
    df, _ = load_run(run)
    front = report.frontier(derive(df[df["status"] == "ok"]))
    md = (written / "report.md").read_text()
    section = md.split("## Cost vs throughput")[1].split("##")[0]
    rows = [ln for ln in section.splitlines() if re.match(r"\| \d+ \|", ln)]
    assert len(rows) == len(front)


def test_user_strings_are_escaped(tmp_path):
    from sweep.results import write_parquet

    run = make_results({"name": "x", "model": "llama3.1-8b", "seq_len": 8192,
                        "global_batch": 64, "cluster": {"gpu": "h100-sxm", "num_gpus": 8},
                        "space": {"tp": [1, 2, 4, 8], "zero": [1, 3]}}, tmp_path / "run")
    df, meta = load_run(run)
    write_parquet(run / "results.parquet", df, {**meta, "space": "<b>evil</b>&"})
    r = report.write_report(run, tmp_path / "out")
    html = r["html"].read_text()
    assert "<b>evil</b>" not in html and "&lt;b&gt;evil&lt;/b&gt;&amp;" in html


def test_chromium_renders_report(written, tmp_path):
    if not report.find_chromium():
        pytest.skip("no chromium binary (install chromium or set SWEEP_CHROMIUM)")
    res = report.run_chromium(written / "report.html", "--dump-dom",
                              "--enable-logging=stderr", "--v=0", timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    dom = res.stdout
    assert dom.count("<img") == 4 and dom.count("data:image/png;base64,") == 4
    assert "Pareto frontier" in dom
    assert not re.search(r"Uncaught|CONSOLE\(\d+\)", res.stderr)
    png = report.screenshot(written / "report.html", tmp_path / "shot.png")
    from PIL import Image

    im = Image.open(io.BytesIO(png.read_bytes())).convert("L")
    a = np.asarray(im)
    assert a.shape[1] == 1200 and a.shape[0] > 2000
    # plots are there: lots of non-white pixels, in several separate bands down the page
    rows_inked = (a < 200).mean(axis=1) > 0.05
    assert rows_inked.sum() > 600
