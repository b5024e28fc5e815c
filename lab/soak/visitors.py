"""The soak's visitors (lab.soak.plan): honest ones pacing under the rate through the three ways in, hostile ones
going round attacks past each limit; `run_soak` starts the app, drives it and reports.

Every request is judged where it is answered: an honest one served, refused (by its own limit, by another visitor's,
otherwise), lost or hung; a hostile one served within the limits, refused with its limit's sentence, or refused
otherwise (served past a limit among them), lost or hung.
"""

from __future__ import annotations

import concurrent.futures
import os
import random
import statistics
import threading
import time
from collections import deque

import httpx
import openai
from gradio_client import Client
from gradio_client.exceptions import AppError
from gradio_client.utils import QueueError

from lab.soak.plan import API_BODY_KB, BODY_MB, KINDS, PROMPTS, App, SoakPlan, SoakReport, Tally, percentile

MODEL = "tiny"
WAITING = 4  # STUDIO_WAITING_PER_VISITOR, its default (the soak leaves it)


def first_hop() -> str:
    """An address a hostile client writes itself, new each time (the proxy appends the real one after it)."""
    return ".".join(str(random.randint(1, 254)) for _ in range(4))


def _small_ask(i: int) -> dict:
    """An images request of four steps, the i-th of a run of them (the prompts alternate, each seed new)."""
    return dict(prompt=PROMPTS[i % 2], seed=random.randint(0, 2**31), num_inference_steps=4)


def _rate_sentence(rpm: int) -> str:
    return f"this public studio runs at most {rpm} requests a minute per visitor"


class Visitors:
    """The plan's visitors against the app at `url`, each request's outcome added to `tally`."""

    def __init__(self, plan: SoakPlan, url: str, tally: Tally):
        self.plan, self.url, self.tally = plan, url, tally
        self.rate = _rate_sentence(plan.requests_per_minute)

    # ------------------------------------------------------------------------------------------- one call
    def _clients(self, address: str):
        headers = {"x-forwarded-for": address}  # the entry the (played) proxy writes: the visitor's address
        gc = Client(self.url, headers=headers, verbose=False, download_files=False, analytics_enabled=False)
        oai = openai.OpenAI(
            base_url=self.url + "v1", api_key="-", max_retries=0, timeout=self.plan.timeout_s, default_headers=headers
        )
        return gc, oai

    def call(self, kind: str, gc: Client, oai: openai.OpenAI, headers: dict | None = None, **ask) -> tuple[str, str]:
        """One request of `kind` (/generate, /images, /v1): ("served", "") or (outcome, the answer's sentence), the
        outcome one of refused, lost, hung."""
        try:
            if kind == "v1":
                body = {k: v for k, v in ask.items() if k not in ("prompt", "size", "n")}
                oai.images.generate(
                    model=MODEL,
                    prompt=ask["prompt"],
                    size=ask.get("size", "auto"),
                    n=ask.get("n", 1),
                    extra_body=body,
                    extra_headers=headers,
                )
            else:
                job = gc.submit(model=MODEL, **ask, api_name=f"/{kind}")
                job.result(timeout=self.plan.timeout_s)
            return "served", ""
        except (AppError, openai.APIStatusError) as e:
            return "refused", getattr(e, "message", None) or str(e)
        except QueueError as e:  # gradio's queue full: an answer of the app's (a refusal no limit of the visitor's)
            return "refused", f"the queue was full ({e})"
        except (TimeoutError, concurrent.futures.TimeoutError, openai.APITimeoutError) as e:
            return "hung", repr(e)
        except (openai.APIConnectionError, httpx.HTTPError, ConnectionError) as e:
            return "lost", repr(e)

    # ------------------------------------------------------------------------------------------- honest
    def warm_up(self) -> None:
        """One request of each kind from a visitor of its own: the shapes the honest visitors ask, loaded and timed
        once (RuntimeError if one is not served: the soak would measure nothing)."""
        gc, oai = self._clients("192.0.2.1")
        for i, kind in enumerate(KINDS):
            outcome, said = self.call(kind, gc, oai, prompt=PROMPTS[i % 2], seed=1000 + i)
            if outcome != "served":
                raise RuntimeError(f"the warm-up's {kind} request was {outcome}: {said}")
        gc.close()

    def fill_sessions(self) -> None:
        """As many sessions as the app keeps (plan.sessions), each a client of its own asking `/headroom` (no device,
        no rate): the app's session store full, as after its first minute of traffic (lab.soak.plan)."""

        def one(i: int) -> None:
            gc, _ = self._clients(f"192.0.2.{i % 250 + 2}")
            try:
                gc.predict(prompt=PROMPTS[i % 2], preset="cache", steps=8, api_name="/headroom")
            finally:
                gc.close()

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            list(pool.map(one, range(self.plan.sessions)))

    def honest(self, k: int, deadline: float) -> None:
        """Visitor k: the three ways in in turn, at most rate - 2 requests in any minute."""
        gc, oai = self._clients(f"198.51.100.{k + 1}")
        gap = 60.0 / (self.plan.requests_per_minute - 2)
        starts: deque = deque()
        time.sleep(random.uniform(0, min(gap, 3.0)))  # not all at once
        for i in range(self.plan.max_attempts):
            t = time.monotonic()
            if t >= deadline:
                break
            starts.append(t)
            while starts and t - starts[0] >= 60.0:
                starts.popleft()
            kind = KINDS[(i + k) % len(KINDS)]
            outcome, said = self.call(kind, gc, oai, prompt=PROMPTS[i % 2], seed=k * 100_000 + i)
            if outcome == "served":
                self.tally.honest_s.append(time.monotonic() - t)
            elif outcome == "refused" and self.rate in said:
                mine = len(starts) > self.plan.requests_per_minute  # over its own rate, or keyed as another
                outcome = "refused by its own limit" if mine else "refused by another visitor's limit"
            self.tally.add("honest", kind, outcome, said)
            time.sleep(max(0.0, t + gap - time.monotonic()))
        gc.close()

    # ------------------------------------------------------------------------------------------- hostile
    def judge(self, kind: str, outcome: str, said: str, sentences: tuple, may_serve: bool) -> None:
        """A hostile attempt's outcome: served within the limits (where it may be), refused with one of
        `sentences`, or refused otherwise."""
        if outcome == "served":
            outcome = "served within the limits" if may_serve else "refused otherwise"
            said = "" if may_serve else "served past a limit"
        elif outcome == "refused":
            outcome = "refused with its sentence" if any(s in said for s in sentences) else "refused otherwise"
        self.tally.add("hostile", kind, outcome, said)

    def hostile(self, k: int, deadline: float) -> None:
        """Visitor k: round after round of attacks, each past one limit, until the deadline."""
        address = f"203.0.113.{k + 1}"
        gc, oai = self._clients(address)
        attempts, rounds = 0, 0
        while (rounds == 0 or time.monotonic() < deadline) and attempts < self.plan.max_attempts:
            # every attack at least once, however slow the machine; the cheap ones (no device time) first
            for attack in (
                self._body,
                self._over,
                self._uploads,
                self._heavy,
                self._burst,
                self._rotating,
                self._crowd,
            ):
                if rounds and time.monotonic() >= deadline:
                    break
                attempts += attack(gc, oai, address)
            rounds += 1
            time.sleep(1.0)
        gc.close()

    def _burst(self, gc, oai, address: str) -> int:
        """Over the rate, each request with a first hop of its own writing (the proxy's entry stays the last)."""
        n = self.plan.requests_per_minute + 3
        for i in range(n):
            spoofed = {"x-forwarded-for": f"{first_hop()}, {address}"}
            ask = _small_ask(i)
            outcome, said = self.call("v1", gc, oai, headers=spoofed, **ask)
            self.judge("burst over the rate", outcome, said, (self.rate,), may_serve=True)
        return n

    def _crowd(self, gc, oai, address: str) -> int:
        """Requests sent all at once, twice the waiting a visitor may have: to take the queue's places before the
        rate is read (each has its own first hop)."""
        n = 2 * WAITING
        sentences = (self.rate, f"keeps at most {WAITING} of a visitor's requests waiting")

        def one(i: int) -> tuple[str, str]:
            spoofed = {"x-forwarded-for": f"{first_hop()}, {address}"}
            ask = _small_ask(i)
            return self.call("v1", gc, oai, headers=spoofed, **ask)

        with concurrent.futures.ThreadPoolExecutor(n) as pool:
            for outcome, said in pool.map(one, range(n)):
                self.judge("crowd at once", outcome, said, sentences, may_serve=True)
        return n

    def _body(self, gc, oai, address: str) -> int:
        """A body past STUDIO_MAX_BODY_MB (an upload), and an images request past STUDIO_MAX_API_BODY_KB (/v1)."""
        cases = (
            ("gradio_api/upload", BODY_MB * 2**20 + 1, f"over this studio's limit of {BODY_MB} MiB"),
            ("v1/images/generations", 2**20, f"over this studio's limit of {API_BODY_KB} KiB for an images request"),
        )
        for path, size, sentence in cases:
            try:
                r = httpx.post(
                    self.url + path,
                    content=b"x" * size,
                    headers={"content-type": "application/json", "x-forwarded-for": address},
                    timeout=self.plan.timeout_s,
                )
                said = r.json().get("error", {}).get("message", r.text[:200]) if r.status_code != 200 else ""
                outcome = "served" if r.status_code == 200 else "refused"
            except httpx.TimeoutException as e:
                outcome, said = "hung", repr(e)
            except (httpx.HTTPError, ValueError) as e:  # ValueError: an answer that is not JSON
                outcome, said = "lost", repr(e)
            self.judge("oversize body", outcome, said, (sentence,), may_serve=False)
        return len(cases)

    def _over(self, gc, oai, address: str) -> int:
        """A prompt, steps, a size (two ways in) and a batch over the limits."""
        p = self.plan
        side = p.max_side + 64
        cases = [
            ("oversize prompt", "v1", dict(prompt="x" * 2500), "characters long: at most 2000 are allowed"),
            ("steps over", "v1", dict(prompt="p", num_inference_steps=p.max_steps + 10), "over this studio's limit"),
            ("size over", "v1", dict(prompt="p", size=f"{side}x{side}"), "is not a size this model takes"),
            ("size over", "generate", dict(prompt="p", width=side, height=side), f"width {side} is over this studio"),
            ("batch over", "v1", dict(prompt="p", n=8), "n=8 is not valid"),
        ]
        for name, kind, ask, sentence in cases:
            outcome, said = self.call(kind, gc, oai, **ask)
            self.judge(name, outcome, said, (sentence, self.rate), may_serve=False)
        return len(cases)

    def _uploads(self, gc, oai, address: str) -> int:
        """Writing events in a loop: uploads past STUDIO_WRITES_PER_MINUTE."""
        n = self.plan.writes_per_minute + 3
        sentence = f"writes at most {self.plan.writes_per_minute} files a minute per visitor"
        for i in range(n):
            text = f"cache_config: {{}}\n# {random.random()}\n".encode()
            outcome, said = self._upload(address, (f"p{i}.yaml", text, "text/yaml"))
            self.judge("uploads over the writes", outcome, said, (sentence,), may_serve=True)
        return n

    def _heavy(self, gc, oai, address: str) -> int:
        """Uploads of 7 MiB (a real picture's size, under the 10 MiB a file) past the visitor's bytes an hour."""
        n = self.plan.upload_mb_per_hour // 7 + 2
        sentences = (
            f"at most {self.plan.upload_mb_per_hour} MiB of uploads an hour per visitor",
            f"writes at most {self.plan.writes_per_minute} files a minute per visitor",
        )
        body = b"\x89PNG" + os.urandom(7 * 2**20 - 4)
        for i in range(n):
            outcome, said = self._upload(address, (f"big{i}.png", body, "image/png"))
            self.judge("heavy uploads over the bytes an hour", outcome, said, sentences, may_serve=True)
        return n

    def _upload(self, address: str, file: tuple) -> tuple[str, str]:
        """One upload to gradio's upload route as `address`: (served | refused | hung | lost, what was said)."""
        try:
            r = httpx.post(
                self.url + "gradio_api/upload",
                files={"files": file},
                headers={"x-forwarded-for": address},
                timeout=self.plan.timeout_s,
            )
        except httpx.TimeoutException as e:
            return "hung", repr(e)
        except httpx.HTTPError as e:
            return "lost", repr(e)
        return ("served", "") if r.status_code == 200 else ("refused", r.text[:300])

    def _rotating(self, gc, oai, address: str) -> int:
        """Over the rate from the visitor's own IPv6 /64, a new address of it each request (what the proxy writes
        last): one visitor all the same (STUDIO_IPV6_PREFIX), so a round after the first in the same minute is
        refused whole."""
        n = self.plan.requests_per_minute + 6
        net = f"2001:db8:{address.rsplit('.', 1)[-1]}:1"
        for i in range(n):
            rotated = {"x-forwarded-for": f"{net}:{random.randint(1, 0xFFFF):x}::{i + 1:x}"}
            ask = _small_ask(i)
            outcome, said = self.call("v1", gc, oai, headers=rotated, **ask)
            self.judge("rotating addresses of one /64", outcome, said, (self.rate,), may_serve=True)
        return n

    # ------------------------------------------------------------------------------------------- all of them
    def drive(self, deadline: float, say) -> None:
        """Every visitor in a thread of its own until `deadline`; a visitor whose thread ended in an error is said
        (and counted lost) rather than left out."""

        def guarded(fn, who: str, k: int):
            try:
                fn(k, deadline)
            except Exception as e:  # a bug in the soak, not an answer of the app's: reported, not swallowed
                self.tally.add(who, "visitor", "lost", f"visitor {k}'s thread ended: {e!r}")

        threads = [
            threading.Thread(target=guarded, args=(self.honest, "honest", k)) for k in range(self.plan.visitors)
        ]
        threads += [
            threading.Thread(target=guarded, args=(self.hostile, "hostile", k)) for k in range(self.plan.hostile)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=max(1.0, deadline - time.monotonic()) + self.plan.timeout_s * 3)
        say(f"{sum(t.is_alive() for t in threads)} visitor threads still running at the end")


def _sample(app: App, snaps: list, every_s: float, t0: float, done: threading.Event, say) -> None:
    """A snapshot every `every_s` (a tenth of the run) while the visitors run: whether memory levels off or climbs."""
    while not done.wait(every_s):
        snap = app.snapshot(f"at {(time.monotonic() - t0) / 60:.1f} min")
        snaps.append(snap)
        say(f"{snap.when}: app {snap.app_rss_mb:.0f} MiB, worker {snap.worker_rss_mb:.0f} MiB")


def run_soak(plan: SoakPlan, progress=None) -> SoakReport:
    """Start the app, warm it up, drive it with the plan's visitors for its minutes, stop it (lab.soak.plan)."""
    say = progress or (lambda m: None)
    app = App(plan)
    tally, snaps = Tally(), []
    try:
        say(f"starting the app in public mode at {app.url} (log: {app.log})")
        app.wait_ready(plan.start_s)
        snaps.append(app.snapshot("start"))
        visitors = Visitors(plan, app.url, tally)
        say("warming up: one request of each kind")
        visitors.warm_up()
        snaps.append(app.snapshot("after one request of each kind"))
        say(f"warming up: {plan.sessions} sessions, the app's session store full")
        visitors.fill_sessions()
        snaps.append(app.snapshot("after warm-up"))
        say(f"driving {plan.visitors} honest and {plan.hostile} hostile visitors for {plan.minutes:g} min")
        t0 = time.monotonic()
        done = threading.Event()
        sampler = threading.Thread(target=_sample, args=(app, snaps, plan.minutes * 6, t0, done, say))
        sampler.start()
        try:
            visitors.drive(t0 + plan.minutes * 60, say)
        finally:
            done.set()
            sampler.join()
        minutes_run = (time.monotonic() - t0) / 60
        snaps.append(app.snapshot("end"))
    finally:
        app.stop()
    honest = list(tally.honest_s)
    return SoakReport(
        plan,
        app.url,
        str(app.log),
        dict(tally.counts),
        list(tally.lost),
        list(tally.wrong),
        statistics.median(honest) if honest else None,
        percentile(honest, 0.95),
        snaps,
        minutes_run,
    )
