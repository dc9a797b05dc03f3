"""Seconds per optimizer step on a GPU type: compute, ZeRO's collectives and offload, from the Setup's shapes.

Modules: ``kernels`` (one micro-step's matmuls and launches on a roofline), ``comm`` (what ZeRO sends per
step, by collective and scope), ``perf`` (the step's seconds from both, overlap included),
``calibration`` (constants measured on the machine in one short launch) and ``calibrated`` (the step time
with them). Memory is ``kit.estimate``'s; importing this package never imports torch or deepspeed.
"""
