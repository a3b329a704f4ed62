"""Regenerate the docs' generated blocks after a change to the simulator: the accuracy table
in docs/accuracy.md (`sweep validate --markdown --loso`) and the GPT-3 175B / 1024 A100
Megatron flags in docs/recipes.md (`sweep recommend ... --format megatron` on the bundled
space, simulated in-process).

    python scripts/update_readme.py
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sim_core.accuracy import validation  # noqa: E402
from sweep.advice import export, recommend  # noqa: E402
from sim_core.accuracy.published import held_out_medians, markdown_summary  # noqa: E402
from tests.results_fixture import make_results  # noqa: E402


def gpt3_flags() -> str:
    with tempfile.TemporaryDirectory() as tmp:
        out = make_results(ROOT / "search_spaces" / "gpt3-175b-1024xa100.yaml", Path(tmp) / "r")
        df, _ = recommend.load_run(out)
        rec = recommend.recommend(df, "step_time",
                                  recommend.Constraints(gpus=["a100-80gb"], num_gpus=[1024]))
        return export.megatron_text(rec.best).strip()


def replace(path: Path, marker: str, body: str) -> None:
    text = path.read_text()
    pattern = rf"(<!-- {marker}:begin -->\n)(.*?)(\n<!-- {marker}:end -->)"
    if not re.search(pattern, text, re.S):
        raise SystemExit(f"{path} has no {marker} markers")
    path.write_text(re.sub(pattern, lambda m: m.group(1) + body + m.group(3), text, flags=re.S))
    print(f"updated {path}")


def main() -> None:
    table = markdown_summary(validation.validate(), held_out_medians())
    replace(ROOT / "docs" / "accuracy.md", "accuracy", table.strip())
    replace(ROOT / "docs" / "recipes.md", "gpt3-flags", "```bash\n" + gpt3_flags() + "\n```")


if __name__ == "__main__":
    main()
