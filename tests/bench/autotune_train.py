"""The training script DeepSpeed's autotuner launches in ``bench_tune``: the kit's toy GPT-2
(``kit.models.toy_spec`` built by ``kit.workloads``) trained with ``deepspeed.initialize(...,
config=args.deepspeed_config)`` on the synthetic token streams the kit's ranks train on.

The autotuner passes each experiment's ds_config (base64) as ``--deepspeed_config``; the engine ends the
process itself after the autotuner's ``end_profile_step`` (or after the model-info profile step), so the
loop below runs until then.
"""

from __future__ import annotations

import argparse
import itertools


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--local_rank", type=int, help="set by the deepspeed launcher")
    parser.add_argument(
        "--deepspeed_config", required=True, help="ds_config.json (or base64, from the autotuner)"
    )
    args = parser.parse_args(argv)

    import deepspeed
    import deepspeed.comm as dist
    import torch

    from kit import workloads
    from kit.ranks.engine import init_distributed
    from kit.toys import toy_setup

    init_distributed()  # as the kit's ranks: no JIT build of the shared-memory comm op
    seq_len = toy_setup().batch.seq_len
    workload = workloads.for_model(toy_setup().model)
    torch.manual_seed(0)
    model = workload.build()
    engine, *_ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=args.deepspeed_config
    )
    rank, world = dist.get_rank(), dist.get_world_size()
    micro = engine.train_micro_batch_size_per_gpu()
    for index in itertools.count():  # one micro step each; the engine exits at the profile's end
        first = index * micro * world
        inputs, _ = workload.micro_batch([first + rank + world * k for k in range(micro)], seq_len, 0)
        loss = workload.loss(engine(*(x.to(engine.device) for x in inputs)))
        engine.backward(loss)
        engine.step()


if __name__ == "__main__":
    main()
