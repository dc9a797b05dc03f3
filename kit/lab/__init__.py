"""What the notebooks show: four panels, figures, teaching tables, the engine report and the smoke profile.

- ``memory_panel``, ``comparison_panel``, ``plan_panel``, ``monitor_panel``: one module per panel, each
  with its factory function of the same name (also ``kit.memory_panel`` ...); ``ui``: what they share
  (controls in columns, HTML tables, figures as PNG);
- ``plots``: matplotlib figures of sweeps, estimates and heartbeats;
- ``teach``: the tutorials' tables by topic (``shards``, ``sweeps``, ``batches``, ``zero_plus_plus``,
  ``offloading``, ``roundtrip``, ``peak``);
- ``engine_report``: DDP, FSDP and ZeRO side by side, and what the sweep says to choose;
- ``profile``: the notebooks' sizes, small under ``ZEROKIT_SMOKE=1`` (``make test``), real otherwise.

Nothing here computes a number of its own: the panels build Setups and call ``kit.estimate`` and
``kit.run``; the figures and tables arrange what those return.
"""
