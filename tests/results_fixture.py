"""Results folders for the recommend/export/report tests, simulated in-process (no Ray): the
same frame, costs, ranking and results.parquet that `sweep search` writes, in about a second."""

from __future__ import annotations

from pathlib import Path

from sweep.config import parse_space
from sweep.engine.evaluate import evaluate
from sweep.results import add_costs, gpu_prices, rank, write_parquet
from sweep.engine.space import Space

ROOT = Path(__file__).resolve().parents[1]


def make_results(cfg_or_path, out: Path) -> Path:
    """Simulate a space (file path or parsed SpaceConfig) and write out/results.parquet."""
    if isinstance(cfg_or_path, (str, Path)):
        from sweep.config import load_space

        cfg = load_space(cfg_or_path)
    elif isinstance(cfg_or_path, dict):
        cfg = parse_space(cfg_or_path)
    else:
        cfg = cfg_or_path
    space = Space.from_config(cfg)
    frame = space.frame(0, space.size)
    # as the grid does: a repeat of a configuration but for a no-op setting is evaluated once
    df = evaluate(frame[~space.duplicates(frame)])
    df = add_costs(df, gpu_prices(df["gpu"].unique(), space.price_per_hour),
                   cfg.search.cost_unit)
    df = rank(df, cfg.search.objectives)
    out.mkdir(parents=True, exist_ok=True)
    write_parquet(out / "results.parquet", df,
                  {"space": space.name, "strategy": "grid", "objectives": cfg.search.objectives,
                   "axes": space.axis_names})
    return out
