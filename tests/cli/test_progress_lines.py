"""Long NAS runs whose stderr is no terminal (a log, CI) print plain progress lines: none in
the first seconds, then one when a stage starts and finishes and otherwise at most every few
seconds (issue 37: 5-6 minutes of silence in a log before)."""

from __future__ import annotations

from edgesplit.cli.nas import progress_lines


def test_quiet_at_first_then_a_line_per_stage_and_at_most_every_interval(capsys):
    now = [0.0]
    report = progress_lines("JMSNAS", every_s=10.0, clock=lambda: now[0])
    for done in range(1, 6):  # a quick stage: no lines (a run refused early stays one line)
        now[0] += 1.0
        report("search", done, 5)
    now[0] += 1.0
    report("retrain", 1, 100)
    for done in range(2, 40):
        now[0] += 0.5  # 19 s more: a line at 10 s, then one 10 s later, not 38
        report("retrain", done, 100)
    now[0] += 0.5
    report("retrain", 100, 100)  # a stage's end
    lines = capsys.readouterr().err.strip().splitlines()
    assert [line.split(" (")[0] for line in lines] == [
        "JMSNAS: retrain 9/100", "JMSNAS: retrain 29/100", "JMSNAS: retrain 100/100"]
