"""`zerokit explain`: a ds_config checked by DeepSpeed's own config classes, then explained setting by
setting with the kit's bytes for the model and cluster (kit.review)."""

from __future__ import annotations

import json

import pytest

from kit import models
from kit.cli import main
from kit.ds_config import to_ds_config, validate_ds_config
from kit.estimate import estimate, partition
from kit.review import Explanation, explain_ds_config
from kit.schema import Setup
from kit.units import GIB, MIB

LLAMA = models.preset("llama-2-7b")  # hidden 4096, largest layer 131,072,000 (the embedding)
GPT2 = models.preset("gpt2")  # hidden 768, largest layer 38,597,376
EIGHT = {"gpus_per_node": 8}


def explained(config: dict, model=GPT2, cluster=None, **kwargs) -> Explanation:
    return explain_ds_config(config, model=model, cluster=cluster or EIGHT, **kwargs)


def finding(explanation: Explanation, key: str):
    found = [f for f in explanation.findings if f.key == key]
    assert len(found) == 1, [f.key for f in explanation.findings]
    return found[0]


def allocated(setup: Setup) -> int:
    """Bytes per GPU of the estimate's components but the overhead allowance (what the review's costs are)."""
    e = estimate(setup)
    return e.components_bytes - e.components["overhead"]


# ----- what DeepSpeed refuses --------------------------------------------------------------------------


def test_an_unknown_zero_key_is_an_error_naming_the_nearest_known_key():
    e = explained({"train_batch_size": 8, "zero_optimization": {"stage": 2, "overlap_comms": True}})
    f = finding(e, "zero_optimization.overlap_comms")
    assert f.severity == "error" and not e.valid
    assert f.message.startswith("zero_optimization.overlap_comms: Extra inputs are not permitted")
    assert "'overlap_comm'" in f.suggestion


def test_an_unknown_nested_key_is_an_error_too():
    config = {
        "train_batch_size": 8,
        "zero_optimization": {"stage": 2, "offload_optimizer": {"pin_memry": True}},
    }
    f = finding(explained(config), "zero_optimization.offload_optimizer.pin_memry")
    assert f.severity == "error" and "'pin_memory'" in f.suggestion


def test_an_unknown_top_level_key_is_ignored_by_deepspeed_and_warned_about():
    config = {"train_batch_size": 8, "zero_optimizatoin": {"stage": 3}, "overlap_comm": True}
    validate_ds_config(config, 8)  # DeepSpeedConfig does not refuse unknown top-level keys: it ignores them
    e = explained(config)
    typo, misplaced = finding(e, "zero_optimizatoin"), finding(e, "overlap_comm")
    assert (typo.severity, misplaced.severity) == ("warning", "warning") and e.valid
    assert "ignores unknown top-level keys silently" in typo.message
    assert "'zero_optimization'" in typo.suggestion
    assert misplaced.suggestion.startswith("move it into zero_optimization")


def test_every_refusal_is_collected_not_only_the_first():
    config = {
        "train_batch_size": 12,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "fp16": {"enabled": True},
        "zero_optimization": {"stage": 2, "overlap_comms": True, "allgather_bucket_size": 9999},
    }
    e = explained(config)
    assert [f.key for f in e.errors] == [
        "zero_optimization.overlap_comms",
        "bf16.enabled",
        "train_batch_size",
        "zero_optimization.allgather_bucket_size",
    ]
    assert [f.severity for f in e.findings[:4]] == ["error"] * 4  # errors first
    # the kit still estimates, from the config with the refused values taken out, and says so
    assert e.setup is not None and e.setup.zero.precision == "bf16"
    assert any(n.startswith("the estimate assumes bf16 (fp16 off)") for n in e.notes)


def test_an_unaligned_allgather_bucket_is_refused_at_stages_1_and_2():
    f = finding(
        explained({"train_batch_size": 8, "zero_optimization": {"stage": 2, "allgather_bucket_size": 9999}}),
        "zero_optimization.allgather_bucket_size",
    )
    assert f.severity == "error"
    assert "allgather_bucket_size must be a multiple of nccl_start_alignment_factor, 2" in f.message
    assert "when the engine starts" in f.message
    assert "10,000" in f.suggestion and "9,998" in f.suggestion
    # stage 3 never reads allgather_bucket_size: no assertion, and it is a no-op
    stage3 = explained(
        {"train_batch_size": 8, "zero_optimization": {"stage": 3, "allgather_bucket_size": 9999}}
    )
    f3 = finding(stage3, "zero_optimization.allgather_bucket_size")
    assert f3.severity == "info" and "does nothing" in f3.message


def test_a_batch_inconsistent_for_the_world_size_is_refused_with_valid_choices():
    e = explained({"train_batch_size": 12, "gradient_accumulation_steps": 1})
    f = finding(e, "train_batch_size")
    assert f.severity == "error"
    equation = "train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step * world_size"
    assert f"{equation} 12 != 1 * 1 * 8" in f.message
    assert "1 x 8 x 1 = 8" in f.suggestion and "on 8 GPUs" in f.suggestion


def test_fp16_and_bf16_both_on_is_refused():
    f = finding(
        explained({"train_batch_size": 8, "bf16": {"enabled": True}, "fp16": {"enabled": True}}),
        "bf16.enabled",
    )
    assert f.severity == "error" and "bfloat16 and fp16 modes cannot be simultaneously enabled" in f.message
    assert "bf16 (the H100-SXM-80GB supports bf16)" in f.suggestion


def test_sgd_under_zero_needs_the_untested_optimizer_flag():
    config = {
        "train_batch_size": 8,
        "optimizer": {"type": "SGD", "params": {}},
        "zero_optimization": {"stage": 2},
    }
    f = finding(explained(config), "optimizer.type")
    assert f.severity == "error" and '"zero_allow_untested_optimizer": true' in f.suggestion
    assert explained({**config, "zero_allow_untested_optimizer": True}).valid


def test_compute_grad_norm_off_with_clipping_is_refused_when_the_engine_starts():
    zero = {"stage": 2, "compute_grad_norm": False}
    f = finding(
        explained({"train_batch_size": 8, "gradient_clipping": 1.0, "zero_optimization": zero}),
        "zero_optimization.compute_grad_norm",
    )
    assert f.severity == "error" and "compute_grad_norm=false requires gradient_clipping=0" in f.message
    assert explained({"train_batch_size": 8, "gradient_clipping": 0.0, "zero_optimization": zero}).valid


def test_a_config_without_a_stage_is_stage_0_as_deepspeed_reads_it():
    e = explained({"train_batch_size": 8, "bf16": {"enabled": True}, "zero_optimization": {}})
    assert e.setup.zero.stage == 0 == validate_ds_config({"train_batch_size": 8}, 8).zero_config.stage
    assert "ZeRO stage 0 partitions nothing" in finding(e, "zero_optimization.stage").message


def test_deprecated_keys_are_warned_with_their_replacement():
    e = explained({"train_batch_size": 8, "zero_optimization": {"stage": 2, "cpu_offload": True}})
    f = finding(e, "zero_optimization.cpu_offload")
    assert f.severity == "warning" and f.suggestion == "use offload_optimizer instead"


# ----- settings that do nothing ----------------------------------------------------------------------


def test_offload_param_below_stage_3_is_ignored_not_refused():
    config = {"train_batch_size": 8, "zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}}
    validate_ds_config(config, 8)  # DeepSpeed accepts it; the stage 1-2 optimizer never reads it
    e = explained(config, model=LLAMA)
    f = finding(e, "zero_optimization.offload_param")
    assert f.severity == "warning" and e.valid and "ignored at stage 2" in f.message
    s = e.setup
    saving = allocated(s) - allocated(s.replace(zero={"offload_optimizer": "cpu"}))
    assert saving > 0 and f"saves {saving / GIB:.2f} GiB per GPU" in f.suggestion
    assert "offload_optimizer" in f.suggestion


def test_stage3_keys_at_stage_2_do_nothing():
    zero = {"stage": 2, "stage3_max_live_parameters": 1e9, "sub_group_size": 1e9, "prefetch_bucket_size": 5e7}
    e = explained({"train_batch_size": 8, "zero_optimization": zero})
    for name in ("stage3_max_live_parameters", "sub_group_size", "prefetch_bucket_size"):
        f = finding(e, f"zero_optimization.{name}")
        assert (
            f.severity == "info"
            and "only stage 3 reads it" in f.message
            and f.suggestion.startswith("remove it")
        )


def test_overlap_comm_and_buckets_do_nothing_at_stage_0():
    zero = {"stage": 0, "overlap_comm": True, "reduce_bucket_size": 5e8, "contiguous_gradients": True}
    e = explained({"train_batch_size": 8, "zero_optimization": zero})
    for name in ("overlap_comm", "reduce_bucket_size", "contiguous_gradients"):
        f = finding(e, f"zero_optimization.{name}")
        assert f.severity == "info" and "does nothing here" in f.message and f.suggestion == "remove it"


def test_pin_memory_without_offload_does_nothing():
    zero = {"stage": 2, "offload_optimizer": {"device": "none", "pin_memory": True}}
    f = finding(
        explained({"train_batch_size": 8, "zero_optimization": zero}),
        "zero_optimization.offload_optimizer.pin_memory",
    )
    assert f.severity == "info" and "nothing is offloaded" in f.message
    # with the offload on, pinning is explained with the bytes it locks
    zero["offload_optimizer"]["device"] = "cpu"
    e = explained({"train_batch_size": 8, "zero_optimization": zero}, model=LLAMA)
    pinned = finding(e, "zero_optimization.offload_optimizer.pin_memory")
    host = sum(e.setup and estimate(e.setup).host.values())
    assert pinned.severity == "info" and f"{host / GIB:.2f} GiB per rank" in pinned.message


# ----- settings that cost memory ---------------------------------------------------------------------


def hf_stage2(**zero) -> dict:
    return {
        "train_micro_batch_size_per_gpu": 1,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 2, "overlap_comm": True, "reduce_bucket_size": 5e8, **zero},
    }


def test_a_5e8_reduce_bucket_with_overlap_comm_costs_two_buffers_of_gigabytes():
    e = explained(hf_stage2(contiguous_gradients=True), model=LLAMA)
    s = e.setup
    # the kit's estimate: 2 ipg buffers (overlap_comm) x 2 B x 500,000,000 elements
    assert allocated(s) - allocated(s.replace(zero={"contiguous_gradients": False})) == 2 * 2 * 500_000_000
    bucket = finding(e, "zero_optimization.reduce_bucket_size")
    assert bucket.severity == "warning"
    assert "2 x 2 B x 500,000,000 = 1.86 GiB per GPU" in bucket.message
    assert (
        "set it to 16,777,216 (hidden^2" in bucket.suggestion
        and "2 x 2 B x 16,777,216 = 64.00 MiB" in bucket.suggestion
    )
    saved = 2 * 2 * (500_000_000 - 4096**2)
    assert allocated(s) - allocated(s.replace(zero={"reduce_bucket_size": 4096**2})) == saved
    assert f"saving {saved / GIB:.2f} GiB" in bucket.suggestion
    overlap = finding(e, "zero_optimization.overlap_comm")
    assert overlap.severity == "warning" and "+ 1 x 2 B x 500,000,000 = 953.67 MiB per GPU" in overlap.message
    assert "doubles the gradient buffers" in overlap.message
    contiguous = finding(e, "zero_optimization.contiguous_gradients")
    assert (
        contiguous.severity == "info"
        and "2 x 2 B x reduce_bucket_size 500,000,000 = 1.86 GiB" in contiguous.message
    )


def test_a_small_bucket_is_only_explained():
    e = explained(hf_stage2(reduce_bucket_size=4096**2), model=LLAMA)
    bucket = finding(e, "zero_optimization.reduce_bucket_size")
    assert bucket.severity == "info" and "2 x 2 B x 16,777,216 = 64.00 MiB per GPU" in bucket.message
    assert finding(e, "zero_optimization.overlap_comm").severity == "info"


def test_stage_1_without_overlap_comm_is_said_to_hold_every_gradient_until_backward_ends():
    """Stage 1's gradient hooks reduce only with overlap_comm (stage 2's always): without it ``.grad``
    holds every gradient until ``reduce_gradients`` after backward (measured on CPU ranks: the toy's
    checkpointed recomputation, tests/test_peak.py "z1 ckpt")."""

    def overlap_off(stage: int):
        config = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}}
        config["zero_optimization"] = {"stage": stage, "overlap_comm": False}
        return finding(explained(config, model=LLAMA), "zero_optimization.overlap_comm")

    one, two = overlap_off(1), overlap_off(2)
    held = f"holds every gradient in .grad, 2 B x {LLAMA.params:,} = {2 * LLAMA.params / GIB:.2f} GiB per GPU"
    assert held in one.message
    assert one.suggestion.endswith("or if the gradients held in .grad are what does not fit")
    assert ".grad" not in two.message and ".grad" not in two.suggestion


def test_a_prefetch_bucket_many_layers_deep_costs_memory():
    zero = {"stage": 3, "stage3_prefetch_bucket_size": 5e8}
    e = explained({"train_batch_size": 8, "bf16": {"enabled": True}, "zero_optimization": zero})
    f = finding(e, "zero_optimization.stage3_prefetch_bucket_size")
    assert f.severity == "warning" and "is 13x the largest layer (38,597,376 params)" in f.message
    better = int(0.9 * 768**2)
    saved = allocated(e.setup) - allocated(e.setup.replace(zero={"prefetch_bucket_size": better}))
    # gathered at once: min(Psi, largest + prefetch call, max(largest, max live)); a call takes tensors
    # until they pass the bucket: every block's (84,934,656), then a 2,359,296 MLP matrix alone
    calls = [
        partition.prefetch_call(e.setup.replace(zero={"prefetch_bucket_size": b})) for b in (int(5e8), better)
    ]
    assert calls == [12 * 7_077_888, 768 * 3072]
    assert saved == 2 * (calls[0] - calls[1])
    assert (
        f"set it to {better:,} (0.9 hidden^2" in f.suggestion
        and f"saving {saved / MIB:.2f} MiB" in f.suggestion
    )


STAGE3 = {"train_batch_size": 8, "bf16": {"enabled": True}, "zero_optimization": {"stage": 3}}


def test_stage_3_where_stage_2_fits_with_room_to_spare():
    e = explained(STAGE3)
    f = finding(e, "zero_optimization.stage")
    assert f.severity == "warning" and "where stage 2 fits with room to spare" in f.message
    two = estimate(e.setup.replace(zero={"stage": 2}))
    assert f"stage 2 needs {two.per_gpu_bytes / GIB:.2f} GiB per GPU" in f.message
    # bytes on the wire per GPU and step: stage 3 all-gathers twice and reduce-scatters, 3 (N-1)/N M;
    # DeepSpeed's stage 2 all-reduces its buckets (2 (N-1)/N M) and all-gathers (N-1)/N M: equal at k = 1
    # (its tensors kept whole, M_p, are gathered once after the step instead of twice per micro-step)
    m = 2 * GPT2.params
    mp = 2 * sum(t for t in partition.numels(e.setup) if t <= e.setup.zero.param_persistence_threshold)
    assert f"{7 / 8 * (3 * m - mp) / MIB:.2f} MiB per GPU per step" in f.message and "x1.00" in f.message
    assert f.suggestion.startswith("use stage 2")
    # with 4 micro-steps stage 3 sends 3k / (2k + 1) = 12 / 9 as much
    four = finding(explained({**STAGE3, "train_batch_size": 32, "gradient_accumulation_steps": 4}), f.key)
    assert "x1.33" in four.message
    # Llama-2-70B on 8 x 80 GB: stage 2 does not fit (nor does stage 3 without offload): no such warning
    big = finding(explained(STAGE3, model=models.preset("llama-2-70b")), f.key)
    assert "room to spare" not in big.message and "stage 2 would need" in big.message
    assert "it does not fit the GPU" in big.message


# ----- a clean config, HF "auto", the contracts -----------------------------------------------------


def test_a_config_the_kit_writes_has_no_errors_or_warnings():
    s = Setup(
        model=LLAMA,
        cluster=EIGHT,
        zero={"stage": 2, "reduce_bucket_size": 4096**2, "overlap_comm": True},
        batch={"micro_batch": 1},
    )
    e = explain_ds_config(to_ds_config(s), model=LLAMA, cluster=EIGHT)
    assert [(f.severity, f.key) for f in e.findings if f.severity != "info"] == []
    assert e.valid and e.setup == s
    assert {"zero_optimization.stage", "zero_optimization.reduce_bucket_size", "bf16.enabled"} <= {
        f.key for f in e.findings
    }


def test_hf_auto_values_are_resolved_before_deepspeed_sees_them():
    config = {
        "bf16": {"enabled": "auto"},
        "fp16": {"enabled": "auto"},
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "zero_optimization": {
            "stage": 3,
            "reduce_bucket_size": "auto",
            "stage3_prefetch_bucket_size": "auto",
        },
    }
    e = explained(config, model=LLAMA, micro_batch=2, grad_accum=4)
    assert e.valid
    assert (e.setup.batch.train_batch, e.setup.zero.precision) == (64, "bf16")
    assert "zero_optimization.reduce_bucket_size: 'auto' -> hidden^2 = 16,777,216 (hidden 4096)" in e.notes
    bucket = finding(e, "zero_optimization.reduce_bucket_size")
    assert "1 x 2 B x 16,777,216 = 32.00 MiB per GPU" in bucket.message


def test_explain_json_contract(capsys, tmp_path):
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(hf_stage2(overlap_comms=True)))
    code = main(["explain", "--ds-config", str(path), "--model", "llama-2-7b", "--json"])
    out, _ = capsys.readouterr()
    assert code == 0  # the report is the answer, errors included
    data = json.loads(out)  # one object: DeepSpeed's log lines stay off stdout
    assert set(data) == {"findings", "notes", "setup", "valid"} and data["valid"] is False
    assert all(set(f) == {"key", "severity", "message", "suggestion"} for f in data["findings"])
    assert data["findings"][0]["key"] == "zero_optimization.overlap_comms"
    assert Setup.model_validate(data["setup"]).zero.reduce_bucket_size == 500_000_000
    frame = explained(hf_stage2(), model=LLAMA).frame()
    assert list(frame.columns) == ["key", "severity", "message", "suggestion"]


def test_explain_report_groups_errors_first(capsys, tmp_path):
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(hf_stage2(overlap_comms=True)))
    assert main(["explain", "--ds-config", str(path), "--model", "llama-2-7b"]) == 0
    out = capsys.readouterr().out
    assert "DeepSpeed refuses this config: 1 error(s)" in out
    assert out.index("ERRORS") < out.index("WARNINGS") < out.index("INFO")


@pytest.mark.parametrize(
    "text, message",
    [
        ("[1, 2]", "not a JSON object (got a JSON list)"),
        ('{"model_type": "llama", "hidden_size": 4096}', "not a DeepSpeed config: none of its keys"),
        ('{"train_batch_size": ', "not valid JSON (line 1"),
    ],
)
def test_a_file_that_is_not_a_ds_config_exits_2(capsys, tmp_path, text, message):
    path = tmp_path / "config.json"
    path.write_text(text)
    assert main(["explain", "--ds-config", str(path), "--model", "gpt2", "--json"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1
    assert f"zerokit explain: ds_config: {path}: {message}" in err


def test_estimate_refuses_what_deepspeed_refuses_with_explains_first_error(capsys, tmp_path):
    config = hf_stage2(overlap_comms=True, allgather_bucket_size=9999)
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(config))
    first = explained(config, model=LLAMA).errors[0]
    code = main(["estimate", "--ds-config", str(path), "--model", "llama-2-7b", "--json"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [f"zerokit estimate: {first.message}"]
    # and one DeepSpeed accepts still estimates
    path.write_text(json.dumps(hf_stage2()))
    assert main(["estimate", "--ds-config", str(path), "--model", "llama-2-7b", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["setup"]["zero"]["reduce_bucket_size"] == 500_000_000


def test_run_refuses_a_config_deepspeed_refuses_before_launch(capsys, tmp_path):
    bad = tmp_path / "ds_config.json"
    bad.write_text(
        json.dumps({"train_batch_size": 4, "zero_optimization": {"stage": 2, "overlap_comms": True}})
    )
    code = main(["run", "--ds-config", str(bad), "--runs-dir", str(tmp_path / "runs"), "--json"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and not (tmp_path / "runs").exists()
    assert err.startswith("zerokit run: zero_optimization.overlap_comms: Extra inputs are not permitted")
    assert len(err.strip().splitlines()) == 1


def test_the_stage_finding_names_the_per_gpu_total_as_what_it_is():
    """The stage line's second figure is the predicted peak per GPU (the verdict's number: activations,
    buffers and overhead included), not model states "in all"."""
    from kit.paths import DATA
    from kit.units import size

    llama = models.resolve("llama-2-7b")
    cluster = {"nodes": 2, "gpus_per_node": 8}
    report = explain_ds_config(
        DATA / "examples" / "ds_config_hf.json", model=llama, cluster=cluster, micro_batch=4, grad_accum=8
    )
    e = estimate(report.setup)
    message = finding(report, "zero_optimization.stage").message
    assert f"model states {size(e.model_states_bytes)} per GPU" in message
    total = (
        f"a peak of {size(e.per_gpu_bytes)} per GPU in the {e.peak_phase} "
        f"(activations {size(e.components['activations'])}"
    )
    assert total in message and "in all" not in message


def test_fp16_on_a_gpu_with_bf16_is_advised_bf16(capsys):
    """fp16 on an A100 (issue 24: seed 1's config got no word): bf16 at the same rate, no loss scaler;
    on a V100, which has no bf16, fp16 is kept."""
    config = {"train_batch_size": 32, "fp16": {"enabled": True}, "zero_optimization": {"stage": 2}}
    a100 = explained(config, model=LLAMA, cluster={"gpus_per_node": 8, "gpu": "A100-SXM-80GB"}, micro_batch=1)
    f = finding(a100, "fp16.enabled")
    assert f.severity == "warning" and "5 exponent bits" in f.message
    assert f.suggestion.startswith("bf16: the A100-SXM-80GB computes in bf16 (312 TFLOP/s, fp16 312)")
    assert "set bf16.enabled true and fp16.enabled false" in f.suggestion
    v100 = explained(config, model=GPT2, cluster={"gpus_per_node": 8, "gpu": "V100-SXM2-32GB"}, micro_batch=1)
    kept = finding(v100, "fp16.enabled")
    assert kept.severity == "info" and kept.suggestion == "keep it: the V100-SXM2-32GB has no bf16"


def test_a_feature_the_kit_does_not_model_is_an_error_listed_first(capsys, tmp_path):
    """Tensor parallelism on (issue 39, item 4): DeepSpeed accepts it, the kit has no estimate for it: an
    error finding with the reader's one line, before DeepSpeed's own refusals; no Setup; the same line is
    what `zerokit estimate --ds-config` exits 2 with. Off (autotp_size 1) it is reviewed as without it."""
    from kit.ds_config.reader import unmodelled

    config = hf_stage2(overlap_comms=True, allgather_bucket_size=9999)  # two refusals of DeepSpeed's
    config["tensor_parallel"] = {"autotp_size": 2}
    [(key, line)] = unmodelled(config)
    e = explained(config, model=LLAMA)
    first = e.errors[0]
    assert (first.key, first.message, key) == ("tensor_parallel.autotp_size", line, first.key)
    assert first.suggestion == (
        "zero-kit cannot estimate this run; with autotp_size 0 or 1 it estimates ZeRO's data parallelism "
        "alone"
    )
    assert len(e.errors) == 3 and not e.valid and e.setup is None
    assert e.notes == [
        "no estimate: zero-kit does not model what tensor_parallel.autotp_size turns on (its error)"
    ]
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(config))
    assert main(["explain", "--ds-config", str(path), "--model", "llama-2-7b", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["valid"] is False and data["setup"] is None and data["findings"][0]["message"] == line
    code = main(["estimate", "--ds-config", str(path), "--model", "llama-2-7b"])
    out, err = capsys.readouterr()
    assert (code, out, err.splitlines()) == (2, "", [f"zerokit estimate: {line}"])
    # the text report says whose refusal it is: DeepSpeed refuses the config (its two refusals) ...
    assert main(["explain", "--ds-config", str(path), "--model", "llama-2-7b"]) == 0
    assert "DeepSpeed refuses this config: 3 error(s)" in capsys.readouterr().out
    # ... and with only the feature the kit does not model, DeepSpeed accepts it
    path.write_text(json.dumps({**hf_stage2(), "tensor_parallel": {"autotp_size": 2}}))
    assert main(["explain", "--ds-config", str(path), "--model", "llama-2-7b"]) == 0
    out = capsys.readouterr().out
    assert "DeepSpeed accepts this config, but zero-kit does not model what it turns on: 1 error(s)" in out
    off = explained({**hf_stage2(), "tensor_parallel": {"autotp_size": 1}}, model=LLAMA)
    plain = explained(hf_stage2(), model=LLAMA)
    assert off.valid and (off.setup, off.findings, off.notes) == (plain.setup, plain.findings, plain.notes)
