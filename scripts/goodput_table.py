"""`sweep recommend --tokens 15T` on the 405B goodput space, with failures counted and without,
side by side: the generated block of docs/goodput.md (and the README lines proposed from it).

Runs the real commands: `sweep search search_spaces/llama3.1-405b-goodput.yaml` into a temporary
folder, then `sweep recommend RUN --objective days|cost --tokens 15T [--no-failures]`, and the
per-cluster-size table of `sweep report`.

    python scripts/goodput_table.py            # print the markdown
    python scripts/goodput_table.py --write    # rewrite the block in docs/goodput.md
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sweep.advice import export, recommend  # noqa: E402
from sweep.advice.report import REPORT_COLUMNS, md_table, scaling_table  # noqa: E402
from sweep.cli.main import main as sweep  # noqa: E402

SPACE = "search_spaces/llama3.1-405b-goodput.yaml"
TOKENS = "15T"
DOC = ROOT / "docs" / "goodput.md"
MARKER = "goodput-table"


def run(*argv: str) -> str:
    """One `sweep` command in-process; its stdout (a failure stops the script)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = sweep(list(argv))
    if rc not in (0, None):
        raise SystemExit(f"sweep {' '.join(argv)} failed ({rc}):\n{out.getvalue()}")
    return out.getvalue().rstrip()


# (label, objective, constraints): the two objectives that count failures, and a deadline that
# the failure-free figures meet and the counted ones do not
SCENARIOS = [("days", "days", {}), ("cost", "cost", {}),
             ("days, `--deadline 75`", "days", {"deadline": 75.0})]


def best(run_dir: str, objective: str, failures: bool, **kw) -> recommend.Recommendation:
    c = recommend.Constraints(tokens=recommend.parse_tokens(TOKENS), failures=failures, **kw)
    chunks, _ = recommend.fit_chunks(run_dir)
    rec = recommend.recommend_chunks(chunks, objective, c)
    return recommend.read_full(run_dir, rec, c.tokens)  # derived as rec.constraints say


def cell(rec: recommend.Recommendation, failures: bool) -> dict:
    if not rec.found:
        return {k: "-" for k in ("days", "total", "mtok", "goodput", "intr")} | {
            "pick": f"none meets it ({rec.fits:,} fit in memory)"}
    b = rec.best
    cost_col = "cost_per_mtok_goodput_usd" if failures else "cost_per_mtok_usd"
    return {"pick": f"{int(b['num_gpus']):,} x {b['gpu']}, "
                    + export.describe(export.config_of(b)).split(" ", 2)[-1],
            "days": f"{b['days']:.1f}", "total": f"${b['total_cost_usd'] / 1e6:.1f}M",
            "mtok": f"${b[cost_col]:.3f}",
            "goodput": f"{b['goodput']:.1%}" if failures else "(100%)",
            "intr": (f"{b['interruptions_per_day']:.2f}/day, {b['interruptions']:,.0f} in all"
                     if failures else "(none)")}


def table(run_dir: str) -> str:
    rows = []
    for label, objective, kw in SCENARIOS:
        w = cell(best(run_dir, objective, True, **kw), True)
        wo = cell(best(run_dir, objective, False, **kw), False)
        rows += [
            [f"**{label}**: pick", w["pick"], wo["pick"]],
            ["days / total cost", f"{w['days']} / {w['total']}", f"{wo['days']} / {wo['total']}"],
            ["$/Mtok, goodput", f"{w['mtok']}, {w['goodput']}", f"{wo['mtok']}, {wo['goodput']}"],
            ["interruptions", w["intr"], wo["intr"]],
        ]
    return md_table([f"`sweep recommend --tokens {TOKENS}`", "failures counted (default)",
                     "`--no-failures`"], rows)


def block() -> str:
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "r")
        run("search", str(ROOT / SPACE), "--out", out, "--no-progress")
        side = table(out)
        texts = {flag: run("recommend", out, "--objective", "days", "--tokens", TOKENS,
                           "--no-write", *([flag] if flag else []))
                 for flag in ("", "--no-failures")}
        fits, _ = recommend.load_fits(out, columns=REPORT_COLUMNS)
        d = recommend.derive(fits, recommend.parse_tokens(TOKENS))
        mask, _ = recommend.feasible(d, recommend.Constraints())
        scale = md_table(*scaling_table(d[mask], recommend.parse_tokens(TOKENS)))
    cmd = f"sweep recommend RUN --objective days --tokens {TOKENS}"
    return "\n".join([
        f"Produced by `python scripts/goodput_table.py --write` (`sweep search {SPACE}`, then "
        f"`sweep recommend` with and without `--no-failures`).", "", side, "",
        "Best configuration of each cluster size, without failures and with them:", "", scale,
        "", f"`{cmd}`:", "", "```", texts[""], "```", "",
        f"`{cmd} --no-failures`:", "", "```", texts["--no-failures"], "```"])


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    text = block()
    if argv == ["--write"]:
        doc = DOC.read_text()
        pattern = rf"(<!-- {MARKER}:begin -->\n)(.*?)(\n<!-- {MARKER}:end -->)"
        if not re.search(pattern, doc, re.S):
            raise SystemExit(f"{DOC} has no {MARKER} markers")
        DOC.write_text(re.sub(pattern, lambda m: m.group(1) + text + m.group(3), doc,
                              flags=re.S))
        print(f"wrote {DOC}")
    else:
        print(text)


if __name__ == "__main__":
    main()
