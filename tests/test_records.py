"""The event lines between rank 0 and the parent (``kit.records``): written whole, read wherever they land."""

import io
import json

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
