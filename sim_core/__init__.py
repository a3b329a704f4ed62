"""sim_core: a vectorized simulator of distributed LLM training.

Columns in (one numpy array per configuration field), columns out (step time, breakdown,
memory, fits). Pure numpy; no Ray, no Optuna.
"""
