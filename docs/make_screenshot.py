"""The README's screenshot, made from the app as it is: `python docs/make_screenshot.py [--out docs/img/generate.png]`.

Starts `app.py` (the embedded model, as the README's run command does) on a free loopback port, opens it in headless
Chromium (Debian's `chromium`, driven by playwright), types a prompt, clicks Generate, waits for the metrics card,
and saves the page. It prints the card's text, so the numbers in the picture are on record beside the command; run
it on a quiet machine (a busy one makes the card withhold its speed-up, and the picture shows that instead).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "a red circle in the center, blue background"
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking", "--disable-sync"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(port: int, log) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STUDIO_", "GRADIO_", "SPACE"))}
    env |= {"GRADIO_SERVER_NAME": "127.0.0.1", "GRADIO_SERVER_PORT": str(port), "HF_HUB_OFFLINE": "1"}
    env["GRADIO_ANALYTICS_ENABLED"] = "False"
    return subprocess.Popen([sys.executable, str(ROOT / "app.py")], cwd=ROOT, env=env, stdout=log, stderr=log)


def _wait(url: str, app: subprocess.Popen, within_s: float = 300.0) -> None:
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        if app.poll() is not None:
            raise SystemExit(f"app.py stopped with code {app.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(1.0)  # not listening yet: asked again
    raise SystemExit(f"app.py did not serve {url} within {within_s:.0f} s")


def shoot(url: str, out: Path, prompt: str) -> str:
    """Generate once in the page at `url` and save it to `out`; the metrics card's text."""
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1300})
        page.goto(url, wait_until="domcontentloaded")
        expect(page.get_by_role("button", name="Generate")).to_be_visible(timeout=120_000)
        page.get_by_label("Prompt", exact=True).fill(prompt)
        page.get_by_role("button", name="Generate").click()
        card = page.locator(".metrics-card")
        expect(card).to_contain_text("cached /", timeout=300_000)
        page.wait_for_timeout(1000)  # the plots drawn after the card
        text = card.inner_text()
        page.screenshot(path=str(out), full_page=True)
        browser.close()
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "img" / "generate.png"))
    ap.add_argument("--prompt", default=PROMPT)
    a = ap.parse_args(argv)
    port = _free_port()
    with tempfile.TemporaryFile() as log:
        app = _serve(port, log)
        try:
            _wait(f"http://127.0.0.1:{port}/", app)
            print(shoot(f"http://127.0.0.1:{port}/", Path(a.out), a.prompt))
        finally:
            app.terminate()
            app.wait(timeout=60)
    print(f"wrote {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
