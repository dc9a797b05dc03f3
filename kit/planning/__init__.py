"""Which cluster and setting to book: every GPU type, cluster size and ZeRO variant that fits, priced.

Modules: ``plan`` (the search; ``kit.plan`` is its ``search``), ``plan_grid`` (the candidates it walks,
each estimated and timed) and ``booking`` (the recommendation, hours and cost). Built on
``kit.estimate`` (memory) and ``kit.steptime`` (seconds); never imports torch or deepspeed.
"""
