"""How far to trust the kit: its estimates beside real GPU runs it did not tune on.

Modules: ``published`` (the rows of ``data/published/``, expressed as Setups, measured beside predicted;
``published_reasons`` says why a row cannot be expressed, ``published_steps`` converts their step-time
metrics) and ``reference`` (the kit's own GPU runs, ``make gpu-reference``).
"""
