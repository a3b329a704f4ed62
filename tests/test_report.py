"""`sweep report` on the bundled multi-hardware space: the cost-vs-throughput frontier is
correct on the data, the HTML is self-contained (plotly.js inlined, no remote resource, every
plot embedded), the interactive points carry their configuration, breakdown and run YAML, user
strings are escaped, and the page renders in headless Chromium with no network, no console
error, and working toggles and click-to-YAML (skipped when no Chromium is installed)."""

from __future__ import annotations

import base64
import io
import re

import numpy as np
import pytest

from sweep.advice import report
from sweep.cli import main
from sweep.advice.frontier import dominated_by, pareto_front
from sweep.advice.recommend import derive, load_run

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
    assert not re.search(r"<script[^>]*\bsrc\s*=", html, re.I)  # every script is inline
    markup = re.sub(r"<script.*?</script>", "", html, flags=re.S | re.I)
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", markup)  # nothing remote
    assert "cdn.plot.ly" not in markup and "require.js" not in markup
    import plotly

    assert f"plotly.js v{plotly.__version__}" in html or "Plotly" in html  # the bundle, inlined
    assert 'id="frontier-plot"' in html and 'id="scatter-plot"' in html
    imgs = re.findall(r'<img alt="([^"]+)" src="data:image/png;base64,([^"]+)"', html)
    assert {a for a, _ in imgs} == {"step time breakdown", "TP x PP heatmap",
                                    "memory per category"}
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
    assert dom.count("<img") == 3
    assert len(re.findall(r'<img[^>]+src="data:image/png;base64,', dom)) == 3
    assert "Pareto frontier" in dom
    assert not re.search(r"Uncaught|CONSOLE\(\d+\)", res.stderr)
    # plotly drew both plots (SVG), each with its points
    for div in ("frontier-plot", "scatter-plot"):
        part = dom.split(f'id="{div}"')[1][:3_000_000]
        assert 'class="main-svg"' in part
    assert dom.count('class="point plotly-customdata"') >= 2 * 20
    png = report.screenshot(written / "report.html", tmp_path / "shot.png")
    from PIL import Image

    im = Image.open(io.BytesIO(png.read_bytes())).convert("L")
    a = np.asarray(im)
    assert a.shape[1] == 1200 and a.shape[0] > 2000
    # plots are there: lots of non-white pixels, in several separate bands down the page
    rows_inked = (a < 200).mean(axis=1) > 0.05
    assert rows_inked.sum() > 600


def _interactive_points(html: str) -> list[dict]:
    """The points of the frontier figure as plotly.js receives them."""
    import json

    start = re.search(r'Plotly\.newPlot\(\s*"frontier-plot",\s*', html).end()
    return json.JSONDecoder().raw_decode(html, start)[0]


def test_points_carry_configuration_breakdown_and_run_yaml(written, run):
    import html as htmllib
    import json

    import yaml

    from sweep import simulate

    page = (written / "report.html").read_text()
    traces = _interactive_points(page)
    front = [t for t in traces if (t.get("meta") or {}).get("frontier")]
    groups = [t for t in traces if "gpu" in (t.get("meta") or {})]
    assert len(front) == 1 and len(groups) >= 8  # one trace per GPU type x cluster size
    from sweep.advice.recommend import Constraints, feasible

    df, _ = load_run(run)
    d = derive(df, 15e12)
    mask, _ = feasible(d, Constraints(tokens=15e12))  # what the report was asked for
    want = report.frontier(d[mask])
    assert front[0]["customdata"] == [int(i) for i in want["config_id"]]  # the same frontier
    yamls = json.loads(re.search(r'<script type="application/json" id="point-yamls">(.*?)'
                                 r"</script>", page, re.S).group(1))
    cid = front[0]["customdata"][0]
    row = df[df["config_id"] == cid].iloc[0]
    hover = front[0]["hovertext"][0]
    for part in ("step-time breakdown", "compute", f"TP {int(row['tp'])}",
                 f"PP {int(row['pp'])}", f"{row['step_time_s']:.3f} s", str(row["gpu"])):
        assert part in htmllib.unescape(hover), part
    # the YAML of a point is a run file that simulates to the same step time
    sim = simulate(yaml.safe_load(yamls[str(cid)]))
    assert sim["step_time_s"].iloc[0] == pytest.approx(row["step_time_s"], rel=1e-9)
    assert set(map(int, yamls)) >= {int(c) for t in traces for c in t["customdata"]}


CLICK_TEST = """<script>
(function () {
  var el = document.getElementById("frontier-plot");
  var fr = el.data.filter(function (t) { return t.meta && t.meta.frontier; })[0];
  el.emit("plotly_click", {points: [{customdata: fr.customdata[0]}]});
  var box = document.querySelector(".tog-gpu");
  box.checked = false;
  box.dispatchEvent(new Event("change"));
  var sc = document.getElementById("scatter-plot");
  var vis = sc.data.map(function (t) {
    return [t.meta && t.meta.gpu, t.visible === undefined ? true : t.visible]; });
  var out = document.createElement("pre");
  out.id = "test-result";
  out.textContent = JSON.stringify({id: fr.customdata[0], gpu: box.value, vis: vis,
                                    yaml: document.getElementById("point-yaml").textContent});
  document.body.appendChild(out);
})();
</script></body>"""


def test_chromium_offline_click_and_toggle(written, tmp_path):
    """With every host name unresolvable the page still draws; a click on a frontier point
    fills the YAML panel with that point's run file; unticking a GPU type hides its traces."""
    if not report.find_chromium():
        pytest.skip("no chromium binary (install chromium or set SWEEP_CHROMIUM)")
    import html as htmllib
    import json

    page = (written / "report.html").read_text()
    probe = tmp_path / "probe.html"
    probe.write_text(page.replace("</body>", CLICK_TEST))
    res = report.run_chromium(probe, "--dump-dom", "--virtual-time-budget=10000",
                              "--host-resolver-rules=MAP * ~NOTFOUND",
                              "--enable-logging=stderr", "--v=0", timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert not re.search(r"Uncaught|CONSOLE\(\d+\)", res.stderr)
    got = json.loads(htmllib.unescape(
        re.search(r'<pre id="test-result">(.*?)</pre>', res.stdout, re.S).group(1)))
    yamls = json.loads(re.search(r'<script type="application/json" id="point-yamls">(.*?)'
                                 r"</script>", page, re.S).group(1))
    assert got["yaml"] == yamls[str(got["id"])]
    vis = [v for g, v in got["vis"] if g is not None]
    assert vis and all(v == "legendonly" for g, v in got["vis"] if g == got["gpu"])
    assert any(v is True for g, v in got["vis"] if g not in (None, got["gpu"]))


def test_report_reads_few_columns_of_every_row_and_whole_rows_only_of_those_shown(run,
                                                                                  monkeypatch):
    """The driver's memory must not follow the results: every fitting row is read with the
    columns that choose and place it; all columns only for the rows drawn and tabled."""
    calls = []
    real = report.load_run

    def spy(run_dir, columns=None, filters=None):
        calls.append((columns, dict(filters or {})))
        return real(run_dir, columns=columns, filters=filters)

    from sweep.advice import recommend as rec_mod

    monkeypatch.setattr(report, "load_run", spy)
    monkeypatch.setattr(rec_mod, "load_run", spy)
    r = report.build(run)
    bulk = [c for c in calls if c[1].get("status") == "ok"]
    assert len(bulk) == 1 and bulk[0][0] == report.REPORT_COLUMNS
    whole = [c for c in calls if "config_id" in c[1]]
    assert len(whole) == 1 and whole[0][0] is None
    shown = set(whole[0][1]["config_id"])
    assert len(shown) <= report.MAX_POINTS + 8 + 2
    assert int(r["best"]["config_id"]) in shown
    # the rows shown carry every column (the breakdown, the memory categories)
    assert len(r["top"].columns) > len(report.REPORT_COLUMNS) + 10
    assert len(r["fits"].columns) < len(r["top"].columns)
