"""What the notebooks show: widget panels (``widgets``), figures (``plots``) and teaching tables (``teach``).

Nothing here computes a number of its own: the panels build Setups and call ``kit.estimate`` and
``kit.run``; the figures and tables arrange what those return.
"""
