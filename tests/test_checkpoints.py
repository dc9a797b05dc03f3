"""Checkpoints: save / resume / zero_to_fp32 on 2 CPU ranks for ZeRO-2 and ZeRO-3 (one shared launch),
the file layout per stage, and ``checkpoint_bytes`` against the files DeepSpeed really wrote."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kit import models
from kit.cli import main
from kit.estimate.checkpoint_size import checkpoint_bytes
from kit.models import toy_spec
from kit.scaleout.checkpoints import checkpoint_layout, consolidate, run_roundtrip, unique_numel
from kit.schema import Setup
from kit.toys import toy_setup

SPEC = toy_spec()  # 136,960 parameters in 28 tensors (lm_head tied to wte)
BASE = toy_setup(2)  # what `zerokit checkpoint roundtrip` runs: the toy GPT, micro batch 2, small buckets
SETUPS = {2: BASE.replace(zero={"stage": 2}), 3: BASE.replace(zero={"stage": 3})}
#: non-tensor bytes (pickled metadata, zip entries) are estimated; tensors are exact
META_TOLERANCE = 2048


@pytest.fixture(scope="module")
def trip(tmp_path_factory):
    """``zerokit checkpoint roundtrip`` (run_roundtrip on the SETUPS below) in one launch."""
    root = tmp_path_factory.mktemp("ckpt")
    argv = [sys.executable, "-m", "kit", "checkpoint", "roundtrip", "--dir", str(root), "--stages", "2", "3"]
    done = subprocess.run([*argv, "--json"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    assert out["ok"] is True
    assert [Setup.model_validate(r["setup"]) for r in out["reports"]] == list(SETUPS.values())
    return root, {r["stage"]: r for r in out["reports"]}


def _folder(trip, stage):
    root, reports = trip
    return root / reports[stage]["name"]


@pytest.mark.distributed
@pytest.mark.parametrize("stage", [2, 3])
def test_resume_reproduces_the_uninterrupted_losses(trip, stage):
    r = trip[1][stage]
    assert r["client_state"] == {"global_step": 2} and r["tag"] == "global_step2"
    assert len(r["losses"]) == 4
    assert r["resumed_losses"] == r["losses"][2:]  # bit-for-bit, not approximately
    assert r["resume_equal"] is True  # on every rank


@pytest.mark.distributed
@pytest.mark.parametrize("stage", [2, 3])
def test_zero_to_fp32_equals_the_live_fp32_weights(trip, stage):
    c = trip[1][stage]["consolidated"]
    assert c["equal"] and c["max_abs_diff"] == 0.0 and c["missing"] == []
    assert c["numel"] == SPEC.params and c["dtypes"] == ["float32"]
    assert c["tensors"] == 29  # 28 parameters plus lm_head.weight, tied to transformer.wte.weight


@pytest.mark.distributed
def test_file_layout_per_stage(trip):
    names = {stage: {f["path"] for f in trip[1][stage]["files"]} for stage in (2, 3)}
    common = {"latest", "zero_to_fp32.py", "zero_to_torch.py"}
    optim = {f"global_step2/bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in (0, 1)}
    assert names[2] == common | optim | {"global_step2/mp_rank_00_model_states.pt"}
    assert names[3] == common | optim | {
        f"global_step2/zero_pp_rank_{r}_mp_rank_00_model_states.pt" for r in (0, 1)
    }
    assert (_folder(trip, 3) / "latest").read_text() == "global_step2"
    df = checkpoint_layout(_folder(trip, 3))
    per_kind = df.groupby("kind")["rank"].apply(lambda ranks: sorted(ranks.dropna()))
    assert per_kind["model_states"] == [0, 1] and per_kind["optim_states"] == [0, 1]
    assert set(df["kind"]) == {"model_states", "optim_states", "latest", "script"}


def _tensor_bytes(path: Path) -> int:
    """Bytes of the distinct storages torch.save wrote to a file."""
    storages = {}

    def walk(obj):
        if isinstance(obj, torch.Tensor):
            storages[obj.untyped_storage().data_ptr()] = obj.untyped_storage().nbytes()
        elif isinstance(obj, dict):
            for v in obj.values():
                walk(v)
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                walk(v)

    walk(torch.load(path, map_location="cpu", weights_only=False))
    return sum(storages.values())


@pytest.mark.distributed
@pytest.mark.parametrize("stage", [2, 3])
def test_checkpoint_bytes_matches_the_files(trip, stage):
    predicted = checkpoint_bytes(SETUPS[stage])
    df = checkpoint_layout(_folder(trip, stage))
    for kind in ("model_states", "optim_states"):
        files = df[df["kind"] == kind]
        assert len(files) == predicted[kind]["files"]
        for _, row in files.iterrows():
            # 136,960 is a multiple of 2 x 2: no rank holds less padding than rank 0
            assert _tensor_bytes(_folder(trip, stage) / row["path"]) == predicted[kind]["tensor_bytes"]
            assert abs(row["bytes"] - predicted[kind]["bytes"]) <= META_TOLERANCE, (kind, row["path"])


def test_checkpoint_bytes_at_scale_by_hand():
    gpt2 = models.preset("gpt2")  # 124,439,808 parameters, a multiple of 2 x 8
    s = Setup(
        model=gpt2, cluster={"nodes": 1, "gpus_per_node": 8}, zero={"stage": 2}, batch={"micro_batch": 1}
    )
    b = checkpoint_bytes(s)
    assert b["model_states"]["files"] == 1 and b["model_states"]["tensor_bytes"] == 2 * 124_439_808
    assert b["optim_states"]["files"] == 8
    assert b["optim_states"]["tensor_bytes"] == 12 * 124_439_808 // 8 + 4  # fp32 master + 2 moments + step
    fp32_sgd = s.replace(zero={"stage": 0, "precision": "fp32", "optimizer": "sgd"})
    b = checkpoint_bytes(fp32_sgd)
    assert b["model_states"]["tensor_bytes"] == 4 * 124_439_808 and b["optim_states"]["files"] == 0
    # a bare count at stage 3: partitioned as the estimator does, the largest layer and the rest
    bare = s.replace(model=models.from_count(7_000_000_000, 100_000_000), zero={"stage": 3})
    part = 100_000_000 // 8 + 6_900_000_000 // 8
    assert checkpoint_bytes(bare)["optim_states"]["tensor_bytes"] == 12 * part + 4


def test_roundtrip_rejects_bad_steps_and_mixed_worlds(tmp_path):
    with pytest.raises(ValueError, match=r"save_step: must be in 1..3 \(steps=4\), got 4"):
        run_roundtrip([SETUPS[2]], tmp_path, steps=4, save_step=4)
    four = SETUPS[2].replace(cluster={"gpus_per_node": 4})
    with pytest.raises(ValueError, match=r"cluster: all setups must have the same world size, got \[2, 4\]"):
        run_roundtrip([SETUPS[2], four], tmp_path)


@pytest.mark.distributed
def test_consolidate_in_process_and_cli(trip, tmp_path, capsys):
    state = consolidate(_folder(trip, 2))
    assert unique_numel(state) == SPEC.params and all(t.dtype == torch.float32 for t in state.values())
    assert state["lm_head.weight"] is state["transformer.wte.weight"]
    out = tmp_path / "fp32.pt"
    assert main(["checkpoint", "consolidate", str(_folder(trip, 3)), "--out", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)  # zero_to_fp32's progress went to stderr
    assert summary == {"out": str(out), "tensors": 29, "numel": SPEC.params}
    saved, direct = torch.load(out, map_location="cpu"), consolidate(_folder(trip, 3))
    assert saved.keys() == direct.keys() and all(torch.equal(saved[k], direct[k]) for k in direct)
    assert main(["checkpoint", "consolidate", str(tmp_path), "--out", str(out)]) == 2
    assert "ckpt_dir: no latest in" in capsys.readouterr().err


def test_size_and_layout_cli(tmp_path, capsys):
    argv = ["checkpoint", "size", "--model", "gpt2", "--gpus-per-node", "8", "--stage", "2", "--json"]
    assert main(argv) == 0
    size = json.loads(capsys.readouterr().out)
    assert size["optim_states"]["tensor_bytes"] == 12 * 124_439_808 // 8 + 4
    (tmp_path / "global_step7").mkdir()
    (tmp_path / "global_step7" / "zero_pp_rank_1_mp_rank_00_optim_states.pt").write_bytes(b"x" * 100)
    (tmp_path / "latest").write_text("global_step7")
    assert main(["checkpoint", "layout", str(tmp_path), "--json"]) == 0
    layout = json.loads(capsys.readouterr().out)
    assert layout["total_bytes"] == 112
    assert [(f["kind"], f["rank"], f["tag"]) for f in layout["files"]] == [
        ("optim_states", 1, "global_step7"),
        ("latest", None, ""),
    ]


@pytest.fixture
def fake_merge(tmp_path, monkeypatch, capsys):
    """zero_to_fp32's merge as it runs around its two loops (its prints, its tqdm bars), on a folder
    with a ``latest``: what consolidation does to its output, without a checkpoint."""
    with capsys.disabled():  # DeepSpeed's logger keeps the stream it is imported under: not the captured one
        from deepspeed.utils import zero_to_fp32

    def merge(folder, tag=None):
        print(f"Processing zero checkpoint '{folder}'")
        for _ in zero_to_fp32.tqdm(range(2), desc="Loading checkpoint shards"):
            pass
        for _ in zero_to_fp32.tqdm({"a": 1, "b": 2, "c": 3}.items(), desc="Gathering sharded weights"):
            pass
        return {"w": torch.zeros(3)}

    (tmp_path / "latest").write_text("global_step2")
    monkeypatch.setattr(zero_to_fp32, "get_fp32_state_dict_from_zero_checkpoint", merge)
    return tmp_path


def test_the_cli_consolidation_draws_one_progress_line_and_notebooks_none(fake_merge, monkeypatch, capsys):
    """Issue 43: zero_to_fp32's bars are silenced (a red block in a notebook); ``zerokit checkpoint
    consolidate`` draws one tqdm line of its own on stderr instead, for a consolidation that runs past
    ``PROGRESS_DELAY_S`` (here 0: every one), through loading, gathering and saving; the API, as the
    notebooks call it, and ``--no-progress`` draw nothing."""
    from kit.scaleout import checkpoints

    out = fake_merge / "fp32.pt"
    capsys.readouterr()
    assert main(["checkpoint", "consolidate", str(fake_merge), "--out", str(out)]) == 0
    shown = capsys.readouterr()
    assert shown.out == f"wrote 1 fp32 tensors (3 elements) to {out}\n" and shown.err == ""  # under a second
    monkeypatch.setattr(checkpoints, "PROGRESS_DELAY_S", 0.0)
    assert main(["checkpoint", "consolidate", str(fake_merge), "--out", str(out), "--json"]) == 0
    shown = capsys.readouterr()
    assert json.loads(shown.out) == {"out": str(out), "tensors": 1, "numel": 3}  # stdout: the JSON alone
    assert shown.err.count("\n") == 1 and shown.err.endswith("\n")  # one line, redrawn in place
    last = shown.err.split("\r")[-1]
    assert last.startswith("consolidate: saving fp32.pt: 100%") and "6/6" in last  # 2 shards, 3 weights, save
    assert "Loading checkpoint shards" not in shown.err and "Processing" not in shown.out + shown.err
    assert main(["checkpoint", "consolidate", str(fake_merge), "--out", str(out), "--no-progress"]) == 0
    assert capsys.readouterr().err == ""
    assert torch.equal(checkpoints.consolidate(fake_merge)["w"], torch.zeros(3))  # in a notebook: quiet
    assert capsys.readouterr() == ("", "")
