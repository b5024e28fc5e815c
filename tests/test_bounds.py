"""Bounds on what a public studio keeps (app.keep, app.limits, the settings): files by total size, gradio's cache by
age, sessions by count, presets per visitor and in all, writing events a minute, each a setting with its default."""

from __future__ import annotations

import os
import time

import pytest
from conftest import plain_ui

from studio.app.keep import MB, FileKeeper, prune
from studio.app.limits import PublicGuard, PublicLimits, RateLimited, Refused
from studio.spec.checks import ConfigError
from studio.spec.settings import Settings, current


def _file(path, size: int, age_s: float):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    t = time.time() - age_s
    os.utime(path, (t, t))
    return path


@pytest.mark.quick
def test_prune_drops_the_oldest_files_past_the_cap_and_never_a_young_one(tmp_path):
    pics, dls = tmp_path / "pictures", tmp_path / "downloads"
    oldest = _file(pics / "a.png", 400_000, 3000)
    old_dl = _file(dls / "h1" / "metrics.json", 300_000, 2000)
    mid = _file(pics / "b.png", 300_000, 1000)
    young = _file(pics / "c.png", 500_000, 5)  # an event's result gradio may still be copying
    done = prune([pics, dls], cap_bytes=900_000, grace_s=60)
    # 1.5 MB kept: the two oldest go (0.8 MB left); the folder a download sat in goes with it
    assert (done.removed, done.freed_bytes, done.kept_bytes) == (2, 700_000, 800_000)
    assert not oldest.exists() and not old_dl.exists() and not old_dl.parent.exists() and dls.exists()
    assert mid.exists() and young.exists()
    done = prune([pics, dls], cap_bytes=100_000, grace_s=60)  # over the cap, but the young file stays
    assert (done.removed, done.kept_bytes) == (1, 500_000) and young.exists() and not mid.exists()
    assert prune([tmp_path / "none"], 0, 0).removed == 0  # a folder not made yet


@pytest.mark.quick
def test_the_keeper_prunes_at_most_once_every_few_seconds(tmp_path):
    keeper = FileKeeper([tmp_path], cap_mb=0.5, grace_s=0, every_s=5)
    _file(tmp_path / "a.png", int(0.4 * MB), 20)
    _file(tmp_path / "b.png", int(0.4 * MB), 10)
    assert keeper.noted(now=100.0).removed == 1
    _file(tmp_path / "c.png", int(0.4 * MB), 0)
    assert keeper.noted(now=103.0) is None and len(list(tmp_path.iterdir())) == 2  # not due
    assert keeper.noted(now=105.5).removed == 1 and {p.name for p in tmp_path.iterdir()} == {"c.png"}


@pytest.mark.quick
def test_writing_events_and_saved_presets_count_per_visitor_with_sentences():
    guard = PublicGuard(PublicLimits(writes_per_minute=2, presets_per_visitor=2, presets_in_all=3))
    guard.write("address 1", now=0.0)
    guard.write("address 1", now=1.0)
    with pytest.raises(RateLimited, match="writes at most 2 files a minute per visitor: try again in 58 s"):
        guard.write("address 1", now=1.5)
    guard.write("address 2", now=1.5)  # another visitor's own count
    guard.write("address 1", now=60.5)  # the first write is a minute old
    # presets: a visitor's count is over all their sessions; a name saved again is free
    guard.saving("address 1", "/s/one/a.yaml", saved_in_all=0)
    guard.saving("address 1", "/s/two/b.yaml", saved_in_all=1)
    guard.saving("address 1", "/s/two/b.yaml", saved_in_all=2)
    with pytest.raises(Refused, match="you have saved 2 presets on this public studio, its limit per visitor"):
        guard.saving("address 1", "/s/three/c.yaml", saved_in_all=2)
    with pytest.raises(Refused, match="this public studio keeps 3 visitors' presets, its limit"):
        guard.saving("address 2", "/s/four/d.yaml", saved_in_all=3)
    with pytest.raises(ConfigError, match="writes_per_minute"):
        PublicLimits(writes_per_minute=0)


@pytest.mark.quick
def test_every_bound_is_a_setting_with_a_default_a_free_space_survives():
    local, space = Settings.from_env({}), Settings.from_env({"SPACE_ID": "a/b"})
    assert (local.cache_age_s, local.sessions) == (None, 10_000)  # a local studio keeps gradio's ways
    assert (space.cache_age_s, space.sessions, space.max_files_mb, space.history_rows) == (3600, 64, 512.0, 200)
    assert (space.max_body_mb, space.max_prompt_chars, space.requests_per_minute, space.writes_per_minute) == (
        16.0,
        2000,
        12,
        30,
    )
    env = {
        "STUDIO_MAX_FILES_MB": "64",
        "STUDIO_CACHE_AGE_S": "600",
        "STUDIO_SESSIONS": "8",
        "STUDIO_HISTORY_ROWS": "50",
        "STUDIO_MAX_PROMPT_CHARS": "500",
        "STUDIO_REQUESTS_PER_MINUTE": "4",
        "STUDIO_WRITES_PER_MINUTE": "6",
        "STUDIO_PRESETS_PER_VISITOR": "3",
        "STUDIO_PRESETS_IN_ALL": "40",
        "STUDIO_MAX_REQUEST_S": "90",
        "STUDIO_WAITING_PER_VISITOR": "3",
    }
    s = Settings.from_env(env)
    assert (space.waiting_per_visitor, s.waiting_per_visitor) == (4, 3)
    assert (s.max_files_mb, s.cache_age_s, s.sessions, s.history_rows, s.max_prompt_chars) == (64, 600, 8, 50, 500)
    limits = PublicLimits.from_settings(s)
    assert (limits.requests_per_minute, limits.writes_per_minute, limits.presets_per_visitor) == (4, 6, 3)
    assert (limits.presets_in_all, limits.request_s) == (40, 90)
    with pytest.raises(ConfigError, match=r"STUDIO_SESSIONS='0' is not valid: a whole number from 1 to 1000000"):
        Settings.from_env({"STUDIO_SESSIONS": "0"})


def _visit(session: str, address: str):
    import gradio as gr

    return gr.Request(session_hash=session, client={"host": address}, headers={})


PRESET = "cache_config:\n  residual_diff_threshold: 0.1\n"


@pytest.mark.quick
def test_visitors_are_networks_and_every_forwarded_line_is_read():
    """An IPv6 visitor is their /64 (a host rotates addresses through it; STUDIO_IPV6_PREFIX widens it); behind a
    trusted proxy that adds a second X-Forwarded-For line, the client's first line cannot pick the key."""
    from starlette.datastructures import Headers

    from studio.app.limits import visitor

    rotated = [visitor(f"2001:db8:1:2:{i:x}::{i}", None, "s", 0) for i in range(1, 19)]
    assert set(rotated) == {"network 2001:db8:1:2::/64"}
    assert visitor("2001:db8:1:3::1", None, "s", 0) != rotated[0]
    wide = {visitor(a, None, "s", 0, ipv6_prefix=48) for a in ("2001:db8:1:2::1", "2001:db8:1:ff::1")}
    assert wide == {"network 2001:db8:1::/48"}
    assert visitor("203.0.113.7", None, "s", 0) == "address 203.0.113.7"
    assert visitor("::ffff:203.0.113.7", None, "s", 0) == "address 203.0.113.7"  # IPv4 as IPv6 is its address
    two_lines = Headers(raw=[(b"x-forwarded-for", b"1.2.3.4"), (b"x-forwarded-for", b"198.51.100.9")])
    assert visitor("10.0.0.1", two_lines, "s", 1) == "address 198.51.100.9"  # not the client's 1.2.3.4
    forged = Headers(raw=[(b"x-forwarded-for", b"1.2.3.4, 5.6.7.8"), (b"x-forwarded-for", b"2001:db8:9::5")])
    assert visitor("10.0.0.1", forged, "s", 1) == "network 2001:db8:9::/64"
    assert visitor("10.0.0.1", {"x-forwarded-for": "9.9.9.9, 198.51.100.3"}, "s", 1) == "address 198.51.100.3"


@pytest.mark.quick
def test_uploads_are_weighed_per_visitor_an_hour_with_when_it_frees():
    guard = PublicGuard(PublicLimits(upload_mb_per_hour=64.0))
    seven = 7 * 2**20
    for i in range(9):  # 63 MiB
        guard.uploaded("address 1", seven, now=60.0 * i)
    with pytest.raises(RateLimited) as e:
        guard.uploaded("address 1", seven, now=600.0)
    assert str(e.value) == (
        "this public studio takes at most 64 MiB of uploads an hour per visitor (STUDIO_UPLOAD_MB_PER_HOUR): you have "
        "sent 63.0 MiB; room for this one in 50 min"  # the first upload (at 0 s) is an hour old at 3600 s
    )
    guard.uploaded("address 2", seven, now=600.0)  # another visitor's own bytes
    guard.uploaded("address 1", seven, now=3600.0)  # the first is an hour old: room again
    with pytest.raises(RateLimited, match="one of 65.0 MiB is over it on its own"):
        guard.uploaded("address 3", 65 * 2**20, now=0.0)


@pytest.mark.quick
def test_every_table_per_visitor_is_bounded():
    """A visitor that leaves is forgotten once MAX_VISITORS others came after: the rate's, the writes' and the
    saved presets' tables stay bounded (the saved presets' grew one entry per address for ever)."""
    from studio.app import limits

    guard = PublicGuard(PublicLimits())
    for i in range(limits.MAX_VISITORS + 50):
        who = f"address 198.51.{i // 256}.{i % 256}"
        guard.rate(who, now=0.0)
        guard.write(who, now=0.0)
        guard.saving(who, f"/s/{i}/p.yaml", saved_in_all=0)
        guard.uploaded(who, 10, now=0.0)
    assert len(guard._events) == len(guard._writes) == len(guard._saved) == limits.MAX_VISITORS
    assert len(guard._uploads) == limits.MAX_VISITORS
    assert "address 198.51.0.0" not in guard._saved  # the oldest went first


@pytest.mark.quick
def test_a_visitor_saves_presets_within_their_count_whichever_session_they_open(tmp_path):
    """A new session gets a new preset folder; the count per visitor is over all of them, and a name saved again
    is free. Saving and exporting are writing events, counted a minute."""
    import gradio as gr

    from studio.app.handlers import Handlers, Studio
    from studio.spec import PresetLibrary

    guard = PublicGuard(PublicLimits(presets_per_visitor=2, presets_in_all=3, writes_per_minute=5))
    studio = Studio(None, ["m"], PresetLibrary(), public=True, guard=guard, tmpdir=tmp_path)
    h = Handlers(studio, plain_ui())
    h.save_preset("mine-1", PRESET, _visit("s1", "203.0.113.1"))
    h.save_preset("mine-2", PRESET, _visit("s2", "203.0.113.1"))  # a new session: the same visitor
    h.save_preset("mine-2", PRESET, _visit("s2", "203.0.113.1"))  # saved again: free
    with pytest.raises(gr.Error, match="you have saved 2 presets on this public studio, its limit per visitor"):
        h.save_preset("mine-3", PRESET, _visit("s3", "203.0.113.1"))
    h.save_preset("theirs-1", PRESET, _visit("s4", "203.0.113.2"))
    with pytest.raises(gr.Error, match="this public studio keeps 3 visitors' presets, its limit"):
        h.save_preset("theirs-2", PRESET, _visit("s4", "203.0.113.2"))
    assert len(list((tmp_path / "sessions").glob("*/*.yaml"))) == 3  # what was refused was not written
    # that visitor's writing events this minute: 4 saves (the refused one was counted before its count was read)
    h.export_history([], _visit("s9", "203.0.113.1"))  # the 5th
    with pytest.raises(gr.Error, match="writes at most 5 files a minute per visitor"):
        h.export_history([], _visit("s9", "203.0.113.1"))


def test_a_served_public_studio_counts_uploads_and_keeps_its_files_and_sessions_within_their_bounds(
    tmp_path, random_model_dir, settings
):
    """On the running app: an upload is a writing event (429 with the sentence past the visitor's count, before
    its body is read); a run's pictures and downloads prune the oldest files past STUDIO_MAX_FILES_MB; gradio's cache
    and sessions are bounded as the settings say."""
    import httpx
    from gradio_client import Client
    from test_api import _serve

    from studio.engine import ModelManager, Runner
    from studio.spec import PresetLibrary

    settings(max_files_mb=1, cache_age_s=900, sessions=5, proxy_hops=1)
    runner = Runner(ModelManager("cpu", settings=current()), PresetLibrary(user_dir=tmp_path), model=random_model_dir)
    limits = PublicLimits(writes_per_minute=2)
    demo, url = _serve(runner, public=True, limits=limits, models=[random_model_dir])
    studio = demo.studio_api.studio
    try:
        assert demo.delete_cache == (600, 900) and demo.state_session_capacity == 5
        stale = [_file(studio.pictures_dir / f"old-{i}.png", 400_000, 3600 + i) for i in range(3)]  # 1.2 MB, old
        studio.keeper.grace_s = 0  # (the run's own files are seconds old: a test that waits two minutes is not run)
        c = Client(url, verbose=False, headers={"x-forwarded-for": "203.0.113.9"})
        c.predict(prompt="a blue square", model=random_model_dir, preset="base", compare="off", api_name="/generate")
        kept = sum(p.stat().st_size for p in studio.pictures_dir.rglob("*") if p.is_file())
        kept += sum(p.stat().st_size for p in (studio.tmpdir / "downloads").rglob("*") if p.is_file())
        assert kept <= MB and not stale[-1].exists(), kept  # the oldest went first
        files = {"files": ("p.yaml", b"cache_config: {}\n", "application/x-yaml")}
        up = [
            httpx.post(url + "gradio_api/upload", files=files, headers={"x-forwarded-for": "203.0.113.5"})
            for _ in "123"
        ]
        assert [r.status_code for r in up] == [200, 200, 429], [r.text for r in up]
        assert "this public studio writes at most 2 files a minute per visitor" in up[2].json()["error"]["message"]
        other = httpx.post(url + "gradio_api/upload", files=files, headers={"x-forwarded-for": "203.0.113.6"})
        assert other.status_code == 200  # another visitor's own count
        # no route around the queue: gradio's direct-call routes do not run a handler in public mode
        n = len(list(studio.pictures_dir.rglob("*.png")))
        body = {"data": ["a blue square", 0]}
        for path in ("gradio_api/run/generate", "gradio_api/api/generate"):
            direct = httpx.post(url + path, json=body, headers={"x-forwarded-for": "203.0.113.7"})
            assert direct.status_code == 404 and "does not accept direct HTTP POST" in direct.text, (path, direct.text)
        assert len(list(studio.pictures_dir.rglob("*.png"))) == n  # nothing ran
    finally:
        demo.close()
        runner.manager.unload()


def test_a_visitors_uploads_are_bounded_in_bytes_and_gradios_cache_in_size(
    tmp_path, random_model_dir, settings, monkeypatch
):
    """On the running app, behind one trusted proxy: 14 uploads of 7 MiB from one visitor keep at most 64 MiB (the
    rest refused with the sentence, before the body is read), one file over 10 MiB is refused as one, another
    visitor's small upload is served, and gradio's cache stays within STUDIO_MAX_CACHE_MB."""
    import httpx
    from test_api import _serve

    from studio.engine import ModelManager, Runner
    from studio.spec import PresetLibrary

    settings(proxy_hops=1, max_cache_mb=20)
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path / "gradio"))  # this app's own cache: pruned below
    runner = Runner(ModelManager("cpu", settings=current()), PresetLibrary(user_dir=tmp_path), model=random_model_dir)
    demo, url = _serve(runner, public=True, limits=PublicLimits(writes_per_minute=100), models=[random_model_dir])
    keeper = demo.studio_api.studio.cache_keeper
    keeper.grace_s = keeper.every_s = 0  # (a test that waits two minutes for the grace is not run)
    try:
        seven = {"files": ("p.png", b"\x89PNG" + b"x" * (7 * 2**20 - 4), "image/png")}
        one = {"x-forwarded-for": "203.0.113.20"}
        codes = [httpx.post(url + "gradio_api/upload", files=seven, headers=one, timeout=60) for _ in range(14)]
        assert [r.status_code for r in codes] == [200] * 9 + [429] * 5, [r.text[:120] for r in codes]
        assert "at most 64 MiB of uploads an hour per visitor (STUDIO_UPLOAD_MB_PER_HOUR)" in codes[-1].text
        big = {"files": ("big.png", b"x" * (11 * 2**20), "image/png")}
        r = httpx.post(url + "gradio_api/upload", files=big, headers={"x-forwarded-for": "203.0.113.21"}, timeout=60)
        assert r.status_code == 413 and "over this public studio's limit of 10 MiB for one file" in r.text
        small = {"files": ("s.yaml", b"cache_config: {}\n", "application/x-yaml")}
        other = httpx.post(url + "gradio_api/upload", files=small, headers={"x-forwarded-for": "203.0.113.22"})
        assert other.status_code == 200  # another visitor's own count
        assert demo.GRADIO_CACHE == str(tmp_path / "gradio") and keeper.roots == [tmp_path / "gradio"]
        held = sum(p.stat().st_size for p in (tmp_path / "gradio").rglob("*") if p.is_file())
        assert 0 < held <= 20 * 2**20 + 1024, held  # pruned to the cap before the small upload went in
    finally:
        demo.close()
        runner.manager.unload()


def test_one_visitors_burst_waits_within_its_count_and_leaves_the_queue_to_the_others(
    tmp_path, random_model_dir, settings
):
    """The rate is read when an event runs; before that, a visitor's burst of concurrent requests would take every
    place in the queue and every other visitor would be refused "queue full". At the door (app.bounds.WaitingCap) a
    visitor has at most STUDIO_WAITING_PER_VISITOR requests waiting: past it a join is answered 429 with the sentence,
    and another visitor still finds a place. The queue here has 3 places, the count is 2."""
    import concurrent.futures

    import httpx
    from test_api import _serve

    from studio.engine import ModelManager, Runner
    from studio.spec import PresetLibrary

    settings(proxy_hops=1, waiting_per_visitor=2)
    runner = Runner(ModelManager("cpu", settings=current()), PresetLibrary(user_dir=tmp_path), model=random_model_dir)
    many = PublicLimits(requests_per_minute=100)  # the rate is not what this test reads
    demo, url = _serve(runner, public=True, limits=many, models=[random_model_dir], queue_size=3)
    route = url + "gradio_api/call/v2/generate"
    ask = dict(prompt="a blue square", model=random_model_dir, preset="base", compare="off", width=64, height=64)

    def join(address: str, steps: int) -> httpx.Response:
        return httpx.post(route, json=ask | {"steps": steps}, headers={"x-forwarded-for": address}, timeout=60)

    def outcome(answer: httpx.Response) -> str:
        with httpx.stream("GET", f"{route}/{answer.json()['event_id']}", timeout=300) as events:
            lines = events.iter_lines()
            for line in lines:
                if line in ("event: complete", "event: error"):
                    return line[7:] + ("" if line.endswith("complete") else ": " + next(lines))

    try:
        first = join("198.51.100.7", 100)  # another visitor's long run holds the device...
        end = time.monotonic() + 30
        while len(demo._queue) and time.monotonic() < end:  # ...once it has left the queue to run
            time.sleep(0.02)
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            burst = list(pool.map(lambda _: join("203.0.113.66", 2), range(8)))
        other = join("198.51.100.7", 2)
        codes = [r.status_code for r in burst]
        assert set(codes) <= {200, 429} and codes.count(429) >= 8 - 2 - 1, codes  # (one may have started running)
        refused = [r.json()["error"]["message"] for r in burst if r.status_code == 429]
        assert all("keeps at most 2 of a visitor's requests waiting" in m for m in refused), refused
        assert other.status_code == 200, other.text  # the queue kept a place for the others
        served = [first, other] + [r for r in burst if r.status_code == 200]
        outcomes = [outcome(r) for r in served]
        assert outcomes == ["complete"] * len(served), outcomes
    finally:
        demo.close()
        runner.manager.unload()


def test_the_queue_outlives_thousands_of_sessions_while_an_old_one_waits(tmp_path, random_model_dir):
    """gradio keeps each session's messages in an LRU of 2,000 (here cut to 4) ordered by when a session was FIRST
    seen, and dropped the oldest, busy or not: an old session's waiting event then crashed the queue's loop
    (KeyError sending it its place in line) and no request was served again. app.serve.SessionQueues drops the
    oldest idle session instead: the old session's event completes while new sessions keep coming."""
    import concurrent.futures

    import httpx
    from gradio_client import Client
    from test_api import _serve

    from studio.engine import ModelManager, Runner
    from studio.spec import PresetLibrary

    runner = Runner(ModelManager("cpu"), PresetLibrary(user_dir=tmp_path), model=random_model_dir)
    demo, url = _serve(runner, models=[random_model_dir])
    sessions = demo._queue.pending_messages_per_session
    sessions.max_size = 4
    route = url + "gradio_api/call/v2/generate"
    ask = dict(prompt="a blue square", model=random_model_dir, preset="base", compare="off", width=64, height=64)

    def join(steps: int) -> str:  # each call of this route is a session of its own
        answer = httpx.post(route, json=ask | {"steps": steps}, timeout=60)
        assert answer.status_code == 200, answer.text
        return answer.json()["event_id"]

    def outcome(event_id: str) -> str:
        with httpx.stream("GET", f"{route}/{event_id}", timeout=60) as events:
            return next((x for x in events.iter_lines() if x in ("event: complete", "event: error")), "ended")

    old = Client(url, verbose=False, download_files=False)
    try:
        old.predict(**ask, steps=2, api_name="/generate")  # the oldest session, idle now
        assert outcome(join(2)) == "event: complete"  # a second one, idle too
        running = join(100)  # a third: its long run holds the device...
        end = time.monotonic() + 30
        while len(demo._queue) and time.monotonic() < end:
            time.sleep(0.02)
        waiting = old.submit(**ask, steps=2, api_name="/generate")  # ...while the oldest session's event waits
        newer = [join(2), join(2)]  # two new sessions: past the 4, one session must go
        assert len(sessions) == 4
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            got = list(pool.map(outcome, [running, *newer]))
        assert got == ["event: complete"] * 3, got
        assert len(waiting.result(timeout=240)) > 0  # the old session's event was served
    finally:
        old.close()
        demo.close()
        runner.manager.unload()


@pytest.mark.quick
def test_the_apps_process_caps_its_malloc_arenas_unless_the_operator_set_them():
    """glibc's per-thread arenas kept what the app's many short-lived threads freed: the soak's app grew 138 MiB in
    6 minutes uncapped, 39 MiB with 2 arenas (docs/deploy.md). app.py caps them before gradio starts a thread."""
    import platform
    import subprocess
    import sys

    if platform.libc_ver()[0] != "glibc":
        pytest.skip(f"not glibc ({platform.libc_ver()}): nothing to cap")
    code = "import os; from studio.spec.hosting import cap_malloc_arenas as c; print(c(os.environ))"
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    said = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert said.stdout.strip() == "malloc arenas: capped at 2"
    own = subprocess.run(
        [sys.executable, "-c", code], env=env | {"MALLOC_ARENA_MAX": "4"}, capture_output=True, text=True
    )
    assert own.stdout.strip() == "malloc arenas: MALLOC_ARENA_MAX=4 (the operator's)"


TRIM_PROBE = """
import os
from studio.spec.hosting import trim_malloc

def rss():
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

held = [bytes(8192) for _ in range(25_000)]  # 200 MiB from the heap (under the mmap threshold)
kept = held[::100]  # every 100th stays: the heap cannot shrink from its top
del held
before = rss()
trimmed = trim_malloc()
print(round(before), round(rss()), trimmed, len(kept))
"""


@pytest.mark.quick
def test_a_trim_gives_the_heaps_freed_pages_back():
    """What app.py's trim thread calls every 30 s (spec.hosting.trim_malloc_every): 200 MiB freed in the middle of
    the heap, every 100th block still held, stays resident until malloc_trim gives the free pages back (the soak's
    app grew with such holes: docs/deploy.md)."""
    import platform
    import subprocess
    import sys

    if platform.libc_ver()[0] != "glibc":
        pytest.skip(f"not glibc ({platform.libc_ver()}): no malloc_trim")
    out = subprocess.run([sys.executable, "-c", TRIM_PROBE], capture_output=True, text=True, check=True).stdout
    before, after, trimmed, kept = out.split()
    assert trimmed == "True" and kept == "250"
    assert float(before) - float(after) > 150, out  # most of the 200 MiB freed went back; the 2 MiB held did not
