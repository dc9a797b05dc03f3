"""Real runs, the parent side (notebook kernel or CLI): launch ranks, run sweeps, read results.

``launcher`` starts torchrun (on one machine) or DeepSpeed's launcher as a subprocess in its own process
group; ``sweep.run_sweep`` runs many Setups in one launch and writes ``records.jsonl``; ``results.Results``
reads it back as pandas DataFrames. Nothing here runs inside a rank: that is ``kit.ranks``.
"""
