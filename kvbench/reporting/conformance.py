"""The conformance section of a leaderboard: each press's verdicts from `kvbench check-press --out` (the
records under the results folders' conformance/), beside its scores."""

import pandas as pd

from kvbench.reporting.blocks import Heading, Paragraph, Table
from kvbench.reporting.boards import Leaderboard
from kvbench.reporting.read import config_label
from kvbench.store.conformance import ConformanceRecord, read_records


def read_conformance(dirs: list[str]) -> dict[str, ConformanceRecord]:
    """The records of the folders by the press label the report uses (`config_label`); a later folder's
    record of the same label wins."""
    return {
        config_label(record.press, record.press_args): record
        for folder in dirs
        for record in read_records(folder)
    }


def conformance_blocks(board: Leaderboard, records: dict[str, ConformanceRecord]) -> list:
    """A table of the board's presses that have a record: the verdict (fail when a check failed), the
    checks failed, the checks that did not apply, and the battery's models. Nothing without records."""
    rows = {
        press: {
            "verdict": "fail" if failed else "pass",
            "failed": ", ".join(failed) or "-",
            "not applicable": ", ".join(c for c, v in record.verdicts.items() if v == "n/a") or "-",
            "checked on": "tiny models" if record.quick else f"tiny models and {record.model}",
        }
        for press in board.presses
        if (record := records.get(press)) is not None
        for failed in [[c for c, v in record.verdicts.items() if v == "fail"]]
    }
    if not rows:
        return []
    frame = pd.DataFrame.from_dict(rows, orient="index")
    frame.index.name = "press"
    return [
        Heading("Conformance", 3),
        Paragraph(
            "`kvbench check-press`'s verdicts on these presses (docs/extending.md says what each check asks)."
        ),
        Table(frame),
    ]
