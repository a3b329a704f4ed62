"""sim_core: a vectorized simulator of distributed LLM training.

Columns in (one numpy array per configuration field), columns out (step time, breakdown,
memory, fits). Pure numpy; no Ray, no Optuna.

    import sim_core
    out = sim_core.simulate_frame(df)      # one row per configuration
    reasons = sim_core.check_rules(df)     # '' where a configuration is valid
"""

_EXPORTS = {"simulate_frame": "simulate", "simulate": "simulate", "check_rules": "simulate",
            "frame_to_batch": "columns", "Batch": "columns"}


def __getattr__(name):  # lazy: `import sim_core` stays cheap for the CLI
    if name in _EXPORTS:
        import importlib

        module = importlib.import_module(f"{__name__}.{_EXPORTS[name]}")
        return getattr(module, name)
    raise AttributeError(f"module 'sim_core' has no attribute {name!r}")


__all__ = list(_EXPORTS)
