"""Dynamic batch: a schedule of global batches, grad accum or micro batches, resolved against DeepSpeed's
setters before anything runs, estimated at its largest batch, and trained with those setters."""

import json

import pytest

from kit import BatchError, Setup
from kit.batch import ramp, resolve, schedule
from kit.cli import main
from kit.estimate import estimate
from kit.models import preset, toy_spec
from kit.schema import one_line_error
from kit.toys import TOY_ZERO


def toy(**batch) -> Setup:
    return Setup(
        model=toy_spec(),
        cluster={"gpus_per_node": 2},
        zero={**TOY_ZERO, "precision": "fp32"},
        batch={"micro_batch": 2, **batch},
    )


def test_a_new_global_batch_keeps_the_micro_batch_and_a_new_micro_batch_keeps_grad_accum():
    s = toy(schedule="2=8,4=16")
    assert [(c.step, c.micro_batch, c.grad_accum, c.train_batch) for c in s.batch.schedule] == [
        (2, 2, 2, 8), (4, 2, 4, 16)
    ]  # fmt: skip
    by_micro = toy(schedule=[{"step": 1, "micro_batch": 4}, {"step": 3, "grad_accum": 3}])
    assert [(c.micro_batch, c.grad_accum, c.train_batch) for c in by_micro.batch.schedule] == [
        (4, 1, 8),
        (4, 3, 24),
    ]
    assert (
        toy(schedule={3: 12}).batch.schedule == toy(schedule=[{"step": 3, "train_batch": 12}]).batch.schedule
    )


def test_the_batch_at_each_step_and_the_data_it_consumes():
    s = toy(schedule="2=8,4=16")
    assert [s.at_step(k).batch.train_batch for k in range(6)] == [4, 4, 8, 8, 16, 16]
    assert s.at_step(3).batch.schedule == () and s.at_step(0).batch.grad_accum == 1
    assert [step for step, _ in s.batch_states()] == [0, 2, 4]
    assert [s.samples_before(k) for k in range(6)] == [0, 4, 8, 16, 24, 40]
    assert toy().samples_before(3) == 12 and toy().at_step(7) == toy()
    assert Setup.model_validate_json(s.model_dump_json()) == s
    assert s.label == "z2 fp32 mb2 -> mb2 gas4 @4"


def test_replace_keeps_the_schedule_and_global_batches_follow_the_cluster():
    s = toy(schedule="2=8")
    assert s.replace(zero={"stage": 3}).batch.schedule == s.batch.schedule
    wider = s.replace(cluster={"gpus_per_node": 4})
    assert [(c.micro_batch, c.grad_accum, c.train_batch) for c in wider.batch.schedule] == [(2, 2, 16)]
    assert s.replace(batch={"schedule": ()}).batch.schedule == ()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ("2=8,4=10", "batch.schedule: step 4: train_batch 10 is not a multiple of micro_batch 2 x 2 GPUs = 4 "
         "(DeepSpeed's set_train_batch_size raises); nearest: 8, 12"),
        ("2=8,2=16", "batch.schedule: steps must be whole numbers >= 1, increasing; got 2 after 2"),
        ([{"step": 0, "train_batch": 8}], "got 0 after 0"),
        ([{"step": 2, "seq_len": 8}],
         "batch.schedule: step 2: give train_batch, grad_accum and/or micro_batch, not 'seq_len'"),
        ([{"step": 2, "micro_batch": 2, "grad_accum": 2, "train_batch": 9}],
         "batch.schedule: step 2: train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step * "
         "world_size 9 != 2 * 2 * 2"),
        ("2:8", "expected STEP=TRAIN_BATCH pairs like 2=16,4=32"),
    ],
)  # fmt: skip
def test_an_invalid_schedule_names_its_first_bad_step(changes, message):
    with pytest.raises(ValueError) as error:
        toy(schedule=changes)
    assert message in one_line_error(error.value)
    assert len(one_line_error(error.value).splitlines()) == 1


def test_ramp_grows_in_multiples_of_micro_times_ranks():
    assert ramp(4, 32, 4, 4) == {1: 8, 2: 16, 3: 24, 4: 32}
    values = [96, 128, 192, 224, 288, 320, 352, 416, 448, 512]
    assert ramp(64, 512, 10, 32) == dict(zip(range(1, 11), values, strict=True))
    with pytest.raises(BatchError, match="must be multiples of micro x dp = 32"):
        ramp(64, 500, 10, 32)
    resolved = schedule(32, resolve(32, 2, None, 64), ramp(64, 512, 10, 64))  # micro 2 on 32 GPUs: GAS 1..8
    assert [c.grad_accum for _, c in resolved] == [2, 3, 4, 5, 6, 7, 8]


def test_memory_is_estimated_at_the_largest_batch_of_the_schedule():
    s = Setup(
        model=preset("llama-2-7b"),
        zero={"stage": 1},
        batch={
            "micro_batch": 2,
            "seq_len": 4096,
            "schedule": [{"step": 3, "micro_batch": 4}, {"step": 5, "grad_accum": 2}],
        },
    )
    each = [estimate(state).per_gpu_bytes for _, state in s.batch_states()]
    whole = estimate(s)
    assert whole.per_gpu_bytes == max(each) == each[2]  # micro 4 and stage 1's full gradients with GAS 2
    assert (
        whole.setup == s
        and "batch schedule: memory at step 5 (micro batch 4, grad accum 2)" in whole.notes[-1]
    )
    assert not whole.fits["H100-SXM-80GB"] and estimate(s.at_step(0)).fits["H100-SXM-80GB"]


def test_cli_refuses_an_invalid_schedule_before_launch(capsys, tmp_path):
    code = main(["run", "--batch-schedule", "0=8,2=16,4=30", "--runs-dir", str(tmp_path), "--json"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and not list(tmp_path.iterdir())
    assert err.strip() == (
        "zerokit run: batch.schedule: step 4: train_batch 30 is not a multiple of micro_batch 2 x 2 GPUs = 4 "
        "(DeepSpeed's set_train_batch_size raises); nearest: 28, 32"
    )
    assert main(["run", "--batch-ramp", "8:64", "--json"]) == 2
    assert "batch-ramp: expected START:END:STEPS" in capsys.readouterr().err


def test_a_token_budget_sets_the_nominal_micro_batch_and_the_activations():
    s = Setup(model=preset("llama-2-7b"), batch={"max_tokens": 10_000, "seq_len": 4096, "grad_accum": 2})
    assert (s.batch.micro_batch, s.batch.train_batch, s.label) == (2, 32, "z2 bf16 mb2 gas2 tok10000")
    three = s.replace(batch={"max_tokens": None, "micro_batch": 3})  # ceil(10,000 / 4096) sequences of 4096
    assert estimate(s).components["activations"] == estimate(three).components["activations"]
    assert "token budget 10,000: 3 sequences of 4096 tokens at most" in estimate(s).formulas["activations"]
    for batch, message in (
        ({"max_tokens": 1000, "seq_len": 4096}, "batch.max_tokens: must be a whole number >= seq_len (4096)"),
        (
            {"max_tokens": 8192, "seq_len": 4096, "schedule": "2=64"},
            "batch.max_tokens: a token budget decides",
        ),
    ):
        with pytest.raises(ValueError) as error:
            Setup(model=preset("llama-2-7b"), batch=batch)
        assert message in one_line_error(error.value)


def test_deepspeeds_packer_keeps_every_micro_batch_within_the_budget():
    from kit.workloads import sequence_length, token_batches

    steps = token_batches(256, 64, 4, 8, 0)
    assert len(steps) == 8 and all(len(step) == 4 for step in steps)
    sizes = [sum(sequence_length(i, 64, 0) for i in micro) for step in steps for micro in step]
    assert max(sizes) <= 256 and min(sizes) > 256 - 64  # full up to less than one more sequence
    assert token_batches(256, 64, 4, 2, 0) == steps[:2]  # the first steps do not depend on how many
    ids = [i for step in steps for micro in step for i in micro]
    assert ids == list(range(len(ids)))  # data order, every sample once


def test_only_the_toy_gpt_runs_on_variable_length_data():
    from kit.run.sweep import check

    with pytest.raises(
        ValueError, match="^batch.max_tokens: runs on variable-length data are built for the toy"
    ):
        check(
            Setup(
                model=preset("qwen2.5-0.5b"),
                cluster={"gpus_per_node": 2},
                batch={"max_tokens": 4096, "seq_len": 512},
            )
        )


def schedule_setups() -> tuple[list[Setup], list[Setup]]:
    """Per stage, the same global batches 4, 8, 16 by grad accum (micro 2) and by micro batch (GAS 1);
    and stages 2 and 3 on variable-length data under a token budget of 256 (sequences of 8-64 tokens)."""
    setups = []
    for stage in (0, 1, 2, 3):
        z = toy().replace(zero={"stage": stage})
        setups.append(
            z.replace(batch={"schedule": [{"step": 2, "grad_accum": 2}, {"step": 3, "grad_accum": 4}]})
        )
        setups.append(
            z.replace(batch={"schedule": [{"step": 2, "micro_batch": 4}, {"step": 3, "micro_batch": 8}]})
        )
    budget = [toy(max_tokens=256, grad_accum=2).replace(zero={"stage": stage}) for stage in (2, 3)]
    return setups, budget


#: the ramp ``zerokit run --batch-ramp`` runs in test_a_ramp_runs_from_the_cli
RAMP = ["run", "--stages", "2", "--precision", "fp32", "--batch-ramp", "4:16:3"]
RAMP += ["--warmup", "1", "--steps", "3"]


def ramp_setups() -> list[Setup]:
    from kit.cli import build_parser
    from kit.cli.run import setups_from_args

    return setups_from_args(build_parser().parse_args(RAMP))


#: run in the session's shared 2-rank sweep (tests/conftest.py), 3 measured steps after 1 warm-up
TWO_RANK_SETUPS = [*schedule_setups()[0], *schedule_setups()[1], *ramp_setups()]


@pytest.fixture(scope="module")
def schedules(two_rank_sweep):
    setups, budget = schedule_setups()
    return setups, budget, two_rank_sweep.results([*setups, *budget], warmup=1, steps=3)


@pytest.mark.distributed
def test_records_follow_the_schedule_and_model_states_stay_put(schedules):
    setups, _, results = schedules
    steps = results.steps()
    for setup in setups:
        mine = steps[steps.label == setup.label]
        assert list(mine.step) == [1, 2, 3]
        for row in mine.itertuples():
            now = setup.at_step(row.step).batch
            assert (row.train_batch, row.micro_batch, row.grad_accum) == (
                now.train_batch,
                now.micro_batch,
                now.grad_accum,
            )
            assert row.tokens == now.train_batch * now.seq_len
            assert row.samples_per_s == pytest.approx(now.train_batch / row.step_time_s)
        for part in ("parameters", "gradients", "optimizer_states"):
            measured = set(mine[f"measured_{part}"])
            assert len(measured) == 1 and measured == set(mine[f"estimate_{part}"])  # constant, as estimated


@pytest.mark.distributed
def test_grad_accum_gives_the_same_update_as_a_larger_micro_batch_for_every_stage(schedules):
    """fp32: micro 2 x GAS k and micro 2k x GAS 1 take the same step (the loss after it), stages 0-3, also
    right after grad accum changes mid-run (the kit sets DeepSpeed's accumulation boundary itself)."""
    setups, _, results = schedules
    steps = results.steps()
    losses = {s.label: list(steps[steps.label == s.label].loss) for s in setups}
    reference = losses[setups[0].label]
    for label, values in losses.items():
        assert values == pytest.approx(reference, rel=1e-5), label


@pytest.mark.distributed
def test_a_ramp_runs_from_the_cli(capsys, tmp_path, replay_launches):
    argv = RAMP
    assert main([*argv, "--runs-dir", str(tmp_path), "--no-progress", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (config,) = data["configs"]
    assert config["status"] == "ok"
    with open(data["records"]) as f:
        records = [json.loads(line) for line in f]
    ranks0 = [r for r in records if r.get("rank") == 0 and r["status"] == "ok"]
    assert [(r["step"], r["train_batch"], r["grad_accum"]) for r in ranks0] == [
        (1, 8, 2),
        (2, 12, 3),
        (3, 16, 4),
    ]


@pytest.mark.distributed
def test_token_budget_runs_follow_deepspeeds_packing_and_scale_the_learning_rate(schedules):
    """Every step holds what DeepSpeed's packer gave it; the learning rate scales with its samples; the
    activations measured are the formula's for the padded shape of the micro batch (samples x longest)."""
    from kit.estimate.activations import activations
    from kit.workloads import packed_sizes, packed_step, sequence_length

    _, budget, results = schedules
    steps = results.steps()
    losses = []
    for setup in budget:
        mine = steps[steps.label == setup.label]
        assert len(mine) == 3
        for row in mine.itertuples():
            sizes = packed_sizes(setup.batch, row.step, 2, 0)
            got = (row.train_batch, row.tokens, row.micro_batch, row.padded_tokens)
            assert got == (
                sizes["train_batch"],
                sizes["tokens"],
                sizes["micro_batch"],
                sizes["padded_tokens"],
            )
            assert row.tokens <= 256 * 2 * 2 < row.padded_tokens  # budget x ranks x micro-steps; padding
            assert row.lr == pytest.approx(1e-4 * row.train_batch / setup.batch.train_batch)
            first = packed_step(setup.batch, row.step, 2, 0)[0]  # rank 0's first micro batch, where it counts
            longest = max(sequence_length(i, 64, 0) for i in first)
            shape = {"micro_batch": len(first), "seq_len": longest, "max_tokens": None}
            padded = setup.model_copy(update={"batch": setup.batch.model_copy(update=shape)})
            # within what the formula leaves out (O(s^2 + bs) tensors: masks, the loss's targets)
            assert row.measured_activations == pytest.approx(activations(padded).bytes, rel=0.015)
        # the table notebook 04 shows says the same, step by step
        table = results.token_budget(setup).set_index("step")
        assert list(table.index) == list(mine.step)
        assert (table["measured B"] == list(mine.measured_activations)).all()
        assert table["measured B"].to_numpy() == pytest.approx(
            table["estimate, padded B"].to_numpy(), rel=0.015
        )
        assert (table["padded tokens"] > table["tokens"]).all()
        assert len(set(mine.train_batch)) > 1  # the batch really varies
        losses.append(list(mine.loss))
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)  # stage 2 and 3 take the same steps
