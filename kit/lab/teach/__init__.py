"""Tables and pictures the tutorials teach with, one module per topic; a notebook imports the topic
(``from kit.lab.teach import shards``, then ``shards.rank_table(2, 4)``):

- ``shards``: ranks, bytes per parameter, the shards each rank holds per stage, the ZeRO paper's Table 1;
- ``sweeps``: comparisons measured in one launch, bucket grids, a sweep's or estimates' table;
- ``batches``: one global batch split every way, a batch schedule step by step;
- ``zero_plus_plus``: ZeRO-3 beside its ZeRO++ variants, estimated and measured on simulated nodes;
- ``offloading``: CPU beside NVMe offload, the ZeRO-Infinity paper's memory and bandwidth;
- ``roundtrip``: checkpoints: a round trip's reports, files and sizes on disk;
- ``peak``: the peak of a step per phase, measured beside predicted, and what is live there.

Every number comes from ``kit`` (the batch math, ``kit.estimate``, ``kit.steptime``, ``kit.run``,
``kit.scaleout``); these modules only arrange it for reading, so that a notebook's cells stay a few lines.
Figures are static matplotlib; tables are pandas DataFrames. Bytes measured beside the estimate:
``Results.states()``.
"""
