"""The rendered report as a reader sees it: index.html loaded in headless Chromium (skipped where none is
installed), and `kvbench report --screenshot`."""

import json
import re
import shutil

import pytest
from click.testing import CliRunner

from kvbench.cli import main
from kvbench.cli.report import report
from kvbench.reporting import render_report
from kvbench.reporting.browser import find_browser, headless
from tests.reporting.test_report import (
    PNG_SIGNATURE,
    make_row,
    markdown_tables,
    memory_rows,
    rows_of,
    write_results,
)

needs_browser = pytest.mark.skipif(
    find_browser() is None, reason="no Chromium on PATH (apt-get install chromium)"
)

# Run in the page after it loads: every box whose content is wider than the box (hidden, or behind a
# scroll bar), the page's own width, each table's cell texts and the page's text, as JSON in a <pre>.
CHECK = """<script>
const inline = ["CODE", "SPAN", "STRONG"];
const cellText = (cell) => cell.innerText.replace(/\\s+/g, " ").trim();
const boxes = [...document.querySelectorAll("body, body *")].filter(
    (el) => el.scrollWidth > el.clientWidth + 1 && el.clientWidth > 0 && !inline.includes(el.tagName));
const found = {
  clipped: boxes.map((el) => [el.tagName, el.scrollWidth, el.clientWidth, el.innerText.slice(0, 50)].join()),
  pageWidth: document.documentElement.scrollWidth,
  viewWidth: window.innerWidth,
  tables: [...document.querySelectorAll("table")].map(
    (table) => [...table.rows].map((row) => [...row.cells].map(cellText))),
  text: document.body.innerText,
  images: [...document.images].map((img) => [img.naturalWidth, img.width]),
};
const out = document.createElement("pre");
out.id = "kvbench-check";
out.textContent = JSON.stringify(found);
document.body.append(out);
</script>"""


def page_seen_by_chromium(page, width: int) -> dict:
    checked = page.with_name("checked.html")
    checked.write_text(page.read_text().replace("</body>", CHECK + "</body>"))
    dom = headless(find_browser(), checked, width, 900, "--dump-dom", "--virtual-time-budget=5000")
    [found] = re.findall(r'<pre id="kvbench-check">(.*?)</pre>', dom, re.DOTALL)
    return json.loads(found.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&"))


def wide_report(tmp_path):
    """A report with every kind of table: five ratios of three presses whose rows record bytes (the "KV
    cache kept" cells of the reference report: `75.0% (memory 0.75, 14.5 MiB)`), a memory view, a versus
    table, a press label with arguments."""
    scores = {("none", 0.0): {"t1": [100, 80], "t2": [100, 60]}}
    for press in ("knorm", "snapkv", "expected_attention(epsilon=0.01, n_future_positions=512)"):
        for ratio in (0.1, 0.25, 0.5, 0.75, 0.9):
            scores[(press, ratio)] = {"t1": [70, 50], "t2": [60, 30]}
    rows = rows_of(scores)
    for row in rows:
        row["kv_bytes"], row["kv_bytes_full"] = row["kv_kept"] * 15000, row["kv_total"] * 15000
    results = write_results(
        tmp_path / "results", rows + memory_rows()[-6:] + [make_row("knorm", 0.5, "t3", 0, 1)]
    )
    return render_report([results], tmp_path / "report", versus="knorm")


@needs_browser
@pytest.mark.parametrize("width", [1400, 1024])
def test_the_page_in_chromium_shows_every_number_unclipped_and_no_markdown(tmp_path, width):
    out = wide_report(tmp_path)
    seen = page_seen_by_chromium(out / "index.html", width)
    assert seen["clipped"] == [] and seen["pageWidth"] <= seen["viewWidth"], seen["clipped"]
    tables = markdown_tables((out / "README.md").read_text())
    assert len(tables) >= 10 and seen["tables"] == tables  # every cell of every markdown table, as written
    assert "**" not in seen["text"] and "`" not in seen["text"] and "](" not in seen["text"]
    numbers = {
        number for table in tables for row in table for cell in row for number in re.findall(r"\d+\.\d", cell)
    }
    assert numbers and all(number in seen["text"] for number in numbers)
    assert seen["images"] and all(natural > 0 and shown > 0 for natural, shown in seen["images"])


@needs_browser
def test_report_screenshot_is_made_by_the_command(tmp_path):
    results = write_results(
        tmp_path / "results", rows_of({("none", 0.0): {"t1": [100]}, ("knorm", 0.5): {"t1": [50]}})
    )
    outcome = CliRunner().invoke(report, [str(results), "--out", str(tmp_path / "r"), "--screenshot"])
    assert outcome.exit_code == 0, outcome.output
    png = (tmp_path / "r" / "screenshot.png").read_bytes()
    assert png.startswith(PNG_SIGNATURE)
    assert (int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")) == (1400, 3000)


def test_screenshot_without_a_browser_is_one_line_before_any_work(tmp_path):
    results = write_results(tmp_path / "results", rows_of({("knorm", 0.5): {"t1": [50]}}))
    empty = tmp_path / "bin"
    empty.mkdir()
    outcome = CliRunner().invoke(
        main, ["report", str(results), "--out", str(tmp_path / "r"), "--screenshot"], env={"PATH": str(empty)}
    )
    assert outcome.exit_code == 2 and "--screenshot needs headless Chromium" in outcome.output
    assert len(outcome.output.strip().splitlines()) == 1 and not (tmp_path / "r").exists()
    assert shutil.which("chromium", path=str(empty)) is None


# Chromium as a script: one that fails, one that writes half a PNG and fails, one that writes no PNG.
BROKEN_BROWSERS = {
    "exits 1": ("echo 'gpu process crashed' >&2; exit 1", "exited 1"),
    "half a png then exits 1": (
        'for a in "$@"; do case "$a" in --screenshot=*) printf "\\x89PN" > "${a#--screenshot=}";; esac; '
        "done; exit 1",
        "exited 1",
    ),
    "exits 0 with no png": ("exit 0", "wrote no PNG screenshot"),
}


@pytest.mark.parametrize("browser", sorted(BROKEN_BROWSERS))
def test_a_failing_browser_is_one_line_exit_1_and_the_screenshot_stays(tmp_path, browser):
    script, message = BROKEN_BROWSERS[browser]
    results = write_results(tmp_path / "results", rows_of({("knorm", 0.5): {"t1": [50]}}))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "chromium").write_text(f"#!/bin/sh\n{script}\n")
    (bin_dir / "chromium").chmod(0o755)
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "screenshot.png").write_bytes(PNG_SIGNATURE + b"the committed one")
    outcome = CliRunner().invoke(
        main,
        ["report", str(results), "--out", str(tmp_path / "r"), "--screenshot"],
        env={"PATH": f"{bin_dir}:/usr/bin:/bin"},
    )
    assert outcome.exit_code == 1 and message in outcome.output, outcome.output
    errors = [line for line in outcome.output.splitlines() if line.startswith("Error")]
    assert len(errors) == 1 and "Traceback" not in outcome.output
    assert (tmp_path / "r" / "screenshot.png").read_bytes() == PNG_SIGNATURE + b"the committed one"
    assert sorted(path.name for path in (tmp_path / "r").iterdir() if path.name.startswith(".")) == []
