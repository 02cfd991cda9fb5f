"""Headless Chromium for a rendered report: the screenshot a report folder commits (`kvbench report
--screenshot`), and the browser the page test loads the report in.

Chromium's own command line, no driver library: `--screenshot` and `--dump-dom` are all the report needs,
and a driver (Playwright, Selenium) would download a browser build of its own, which an offline machine
cannot. The system's Chromium (Debian's `chromium` package) is used where it is on PATH.
"""

import shutil
import subprocess
import tempfile
from pathlib import Path

from kvbench.core.errors import BadInput

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
SCREENSHOT_SIZE = (1400, 3000)  # the page's top at a desktop width: the first leaderboard and its plot
TIMEOUT_S = 120


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
        done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{browser} exited {done.returncode}: {done.stderr.strip()[-500:]}")
    return done.stdout


def screenshot(page: Path, png: Path, size: tuple[int, int] = SCREENSHOT_SIZE) -> Path:
    """The top `size` pixels of `page` as Chromium shows it, written to `png`."""
    headless(require_browser(), page, *size, f"--screenshot={Path(png).resolve()}")
    return png
