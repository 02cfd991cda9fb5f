"""Headless Chromium for a rendered report: the screenshot a report folder commits (`kvbench report
--screenshot`), and the browser the page test loads the report in.

Chromium's own command line, no driver library: `--screenshot` and `--dump-dom` are all the report needs,
and a driver (Playwright, Selenium) would download a browser build of its own, which an offline machine
cannot. The system's Chromium (Debian's `chromium` package) is used where it is on PATH.
"""

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from kvbench.core.errors import BadInput, WriteError

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
SCREENSHOT_SIZE = (1400, 3000)  # the page's top at a desktop width: the first leaderboard and its plot
TIMEOUT_S = 120
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


class BrowserError(WriteError):
    """Chromium failed, timed out or wrote nothing: not the user's input, so exit 1, in one line; a
    screenshot that was there stays as it was."""


def find_browser() -> str | None:
    """The path of a Chromium on PATH, or None."""
    return next((path for path in map(shutil.which, BROWSERS) if path), None)


def require_browser() -> str:
    browser = find_browser()
    if browser is None:
        raise BadInput(
            f"--screenshot needs headless Chromium, and none of {', '.join(BROWSERS)} is on PATH "
            "(e.g. apt-get install chromium)"
        )
    return browser


def headless(browser: str, page: Path, width: int, height: int, *flags: str) -> str:
    """Load `page` in headless Chromium at a `width` x `height` window with `flags`; its stdout."""
    with tempfile.TemporaryDirectory() as profile:  # a fresh profile: no state from, or left for, a user
        command = [
            browser,
            "--headless",
            "--no-sandbox",  # Chromium's sandbox refuses to run as root, as CI and containers do
            "--disable-gpu",
            "--hide-scrollbars",
            "--force-device-scale-factor=1",
            f"--user-data-dir={profile}",
            f"--window-size={width},{height}",
            *flags,
            Path(page).resolve().as_uri(),
        ]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            raise BrowserError(f"{browser} did not finish {page} in {TIMEOUT_S} s") from None
        except OSError as error:
            raise BrowserError(f"{browser} could not start: {error}") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [""])[-1][-300:]
        raise BrowserError(f"{browser} exited {done.returncode} on {page}: {last}")
    return done.stdout


def screenshot(page: Path, png: Path, size: tuple[int, int] = SCREENSHOT_SIZE) -> Path:
    """The top `size` pixels of `page` as Chromium shows it, written to `png` whole or not at all (drawn
    into a temporary file beside it, renamed once Chromium has written a PNG)."""
    png = Path(png)
    drawn = png.with_name(f".{png.stem}.drawing.png")  # Chromium picks the image format by the extension
    try:
        headless(require_browser(), page, *size, f"--screenshot={drawn.resolve()}")
        if (drawn.read_bytes()[:8] if drawn.is_file() else b"") != PNG_SIGNATURE:
            raise BrowserError(f"Chromium wrote no PNG screenshot of {page}")
        os.replace(drawn, png)
    finally:
        drawn.unlink(missing_ok=True)
    return png
