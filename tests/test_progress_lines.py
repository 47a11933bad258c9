"""Long NAS runs whose stderr is no terminal (a log, CI) print plain progress lines: one when
a stage starts and finishes, and otherwise at most every few seconds (issue 37: 5-6 minutes
of silence in a log before)."""

from __future__ import annotations

from edgesplit.cli.nas import progress_lines


def test_lines_at_each_stage_start_end_and_at_most_every_interval(capsys):
    now = [0.0]
    report = progress_lines("JMSNAS", every_s=10.0, clock=lambda: now[0])
    for done in range(1, 6):  # five quick steps: the first and the last are worth a line
        now[0] += 1.0
        report("search", done, 5)
    now[0] += 1.0
    report("retrain", 1, 100)  # a new stage
    for done in range(2, 40):
        now[0] += 0.5  # 19 s in all: two more lines, not 38
        report("retrain", done, 100)
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0].startswith("JMSNAS: search 1/5")
    assert lines[1].startswith("JMSNAS: search 5/5")
    assert lines[2].startswith("JMSNAS: retrain 1/100")
    assert len(lines) == 4 and lines[3].startswith("JMSNAS: retrain 21/100")
