"""The event lines between rank 0 and the parent (``kit.records``): written whole, read wherever they land."""

import io
import json
from pathlib import Path

from kit import records


class CountingStdout(io.StringIO):
    def __init__(self):
        super().__init__()
        self.writes = []

    def write(self, text):
        self.writes.append(text)
        return super().write(text)


def test_an_event_is_one_write_ending_its_line(monkeypatch):
    out = CountingStdout()
    monkeypatch.setattr("sys.stdout", out)
    records.emit({"event": "step", "step": 3})
    assert out.writes == ['ZEROKIT {"event": "step", "step": 3}\n']


def test_events_are_read_where_other_ranks_output_surrounds_them():
    event = {"event": "done", "config_id": "abc", "status": "ok"}
    line = records.EVENT + json.dumps(event)
    assert records.parse_event(line) == event
    assert records.parse_event("[rank1]: a warning without its newline " + line) == event
    assert records.parse_event(line + "[rank1]: more") == event
    assert records.parse_event("loss 2.5") is None
    assert records.parse_event("ZEROKIT is a word in this text") is None
    assert records.parse_event(records.EVENT + "[1, 2]") is None


def test_a_record_is_typed_on_both_sides_of_the_file(tmp_path):
    """Issue 40: records.jsonl lines are ``records.Record``s. A rank never writes one that is not (one
    line naming the field, nothing written); a line that is not stops the reader at that file, line and
    field; the kit's own GPU runs (data/reference) and every key the docs list are in the model."""
    from kit.paths import DATA

    path = tmp_path / "records.jsonl"
    ok = {"sweep": "s", "run_id": "r", "config_id": "c", "label": "z2", "setup": {}, "rank": 0, "step": 1}
    ok |= {"time": 1e9, "status": "ok", "error": None, "step_time_s": 0.5, "comm_bytes": {"all_reduce": 8}}
    records.append_record(path, ok)
    for wrong, line in (
        ({"status": "fine"}, "status: Input should be 'ok', 'oom', 'error', 'timeout' or 'cancelled'"),
        ({"step_time": 0.5}, "step_time: Extra inputs are not permitted"),
        ({"comm_bytes": {"all_reduce": "lots"}}, "comm_bytes.all_reduce: Input should be a valid integer"),
    ):
        try:
            records.append_record(path, ok | wrong)
        except ValueError as error:
            assert str(error).startswith(f"record: {line}"), error
        else:
            raise AssertionError(f"{wrong} was written")
    assert records.load_records(path) == [ok]  # nothing of the refused ones reached the file
    with open(path, "a") as f:
        f.write(json.dumps({**ok, "rank": "zero"}) + "\n")
    try:
        records.load_records(path)
    except ValueError as error:
        assert str(error).startswith(f"{path}: line 2: rank: Input should be a valid integer"), error
    else:
        raise AssertionError("a wrong line was read")
    reference = sorted((DATA / "reference").glob("*/records.jsonl"))
    assert reference and all(records.load_records(p) for p in reference)
    contracts = (Path(__file__).parent.parent / "docs" / "contracts.md").read_text()
    assert [f for f in records.Record.model_fields if f"`{f}`" not in contracts] == []  # each documented
