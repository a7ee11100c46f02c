"""A real browser for the console's tests: Debian's headless Chromium driven by selenium through
Debian's chromedriver (both set up by `make setup`), never a driver fetched from the network."""

from __future__ import annotations

import base64
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SCREENSHOTS = Path(__file__).resolve().parents[2] / "build" / "screenshots"


@contextmanager
def chromium(*, user: str | None = None, password: str = "") -> Iterator[Any]:
    """A headless Chromium; with `user`, every request carries HTTP Basic credentials (as a
    browser does once its user signed in), set through the DevTools protocol."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary = shutil.which("chromium")
    driver_path = shutil.which("chromedriver")
    assert binary and driver_path, ("the console's tests need Chromium and chromedriver: "
                                    "`make setup` installs them (apt-get install -y chromium "
                                    "chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--ignore-certificate-errors", "--window-size=1400,1000"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    try:
        if user is not None:
            token = base64.b64encode(f"{user}:{password}".encode()).decode()
            driver.execute_cdp_cmd("Network.enable", {})
            driver.execute_cdp_cmd("Network.setExtraHTTPHeaders",
                                   {"headers": {"Authorization": f"Basic {token}"}})
        yield driver
    finally:
        driver.quit()


def screenshot(driver: Any, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    driver.save_screenshot(str(path))
    return path
