"""What a visitor of a public studio may ask of its device, checked in the app's process from the form and preset
alone, before any model work, and refused with a sentence naming the limit: compile is the operator's; compiled
stacks meet a bounded number of shapes (each a compile of minutes; torch.compile's recompile limit is 8 per frame);
the Matrix size and each visitor's rates are capped. Only the time limit is checked while a request runs."""

from __future__ import annotations

import hmac
import ipaddress
import secrets
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from studio.spec.checks import ConfigError, check_int
from studio.spec.preset import Preset


class Refused(ConfigError):
    """A public studio's limit, in a sentence (a ConfigError: shown as a bad request is)."""


class RateLimited(Refused):
    """The per-visitor rate: the one limit that passes by itself (the OpenAI endpoint answers it 429)."""


MB = 2**20
HOUR_S = 3600.0
MAX_VISITORS = 10_000  # a table per visitor keeps at most this many (the oldest go first): memory stays bounded

# The app's own calls to itself (the OpenAI endpoint calls /images through gradio's queue from this process) carry
# the visitor they act for in this header, signed with a token of this process: a client cannot write it.
VISITOR_HEADER = "x-studio-visitor"
INTERNAL_TOKEN = secrets.token_urlsafe(24)


def route(scope) -> str:
    """A request's path without the `root_path` a proxy mounts it under (servers differ on whether `path` carries
    it)."""
    path, root = scope.get("path", "") or "", (scope.get("root_path", "") or "").rstrip("/")
    return path[len(root) :] or "/" if root and path.startswith(root + "/") else path


def from_this_machine(host: str | None, local: str | None = None) -> bool:
    """Whether a connection from `host` comes from this machine: a loopback address, or `local`, the address the
    connection reached (a call to its own address leaves from it; a Space's proxy reaches it from another)."""
    if not host:
        return False
    if host == "localhost" or (local is not None and host == local):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def internal_visitor(headers, host: str | None, local: str | None = None) -> str | None:
    """The visitor an internal call acts for (VISITOR_HEADER with this process's token, from this machine)."""
    said = str(headers.get(VISITOR_HEADER) or "") if headers is not None else ""
    token, _, who = said.partition(" ")
    if who and from_this_machine(host, local) and hmac.compare_digest(token.encode(), INTERNAL_TOKEN.encode()):
        return who
    return None


def network(address: str, ipv6_prefix: int = 64) -> str:
    """A visitor's key from their address; an IPv6 one as its network of `ipv6_prefix` bits (a host rotates addresses
    through its /64)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return "address " + address
    if ip.version == 6 and ip.ipv4_mapped is not None:
        return "address " + str(ip.ipv4_mapped)
    if ip.version == 6:
        return "network " + str(ipaddress.ip_network(f"{ip}/{ipv6_prefix}", strict=False))
    return "address " + str(ip)


def forwarded_hops(headers) -> list[str]:
    """Every X-Forwarded-For entry over all the header's lines, in order (a proxy may add a line, not append)."""
    lines = headers.getlist("x-forwarded-for") if hasattr(headers, "getlist") else [headers.get("x-forwarded-for")]
    return [h.strip() for line in lines if line for h in str(line).split(",") if h.strip()]


def visitor(
    host: str | None, headers, session: str | None, proxy_hops: int, local: str | None = None, ipv6_prefix: int = 64
) -> str:
    """Who a request comes from, for the per-visitor limits: the app's own call's `internal_visitor`, else the
    X-Forwarded-For entry the last of `proxy_hops` trusted proxies wrote (entries left of it are the client's own
    writing: never read), else the connection's address, else the session."""
    inside = internal_visitor(headers, host, local)
    if inside:
        return inside
    if proxy_hops and headers is not None:
        hops = forwarded_hops(headers)
        if len(hops) >= proxy_hops:
            return network(hops[-proxy_hops], ipv6_prefix)
    if host:
        return network(str(host), ipv6_prefix)
    return "session " + str(session) if session else "anonymous"


def _count(log: dict, lock, who: str | None, n: int, now: float | None, limit: str) -> None:
    """One event of `who` in `log` (visitor -> deque of times); RateLimited when there were `n` in the last 60 s."""
    now = time.monotonic() if now is None else now
    with lock:
        seen = log.setdefault(who or "anonymous", deque())
        while seen and now - seen[0] >= 60.0:
            seen.popleft()
        if len(seen) >= n:
            raise RateLimited(f"this public studio {limit}: try again in {60.0 - (now - seen[0]):.0f} s")
        seen.append(now)
        if len(log) > MAX_VISITORS:  # visitors that left: the oldest go first
            log.pop(next(iter(log)))


def _frees(seen, total: int, nbytes: int, cap: int, now: float) -> str:
    """When a visitor's uploads of the last hour leave room for `nbytes` more (their oldest turning an hour old)."""
    if nbytes > cap:
        return f"one of {nbytes / MB:.1f} MiB is over it on its own"
    for t, n in seen:
        total -= n
        if total + nbytes <= cap:
            return f"room for this one in {max(1, round((t + HOUR_S - now) / 60))} min"
    return "room for this one within the hour"


def compiled_shape(model: str, request, edits: bool = False) -> tuple:
    """What a compiled stack's Dynamo graphs depend on in a request: size, batch, and an edit model's reference picture
    (its latents join the sequence); not steps, seed, prompt, true CFG or an img2img picture (tests/test_compile.py).
    A key is one compile at most: Dynamo marks a dimension dynamic once it has changed."""
    image = getattr(request, "image", None)
    picture = tuple(image.shape[:2]) if image is not None and edits else None
    return (model, request.width, request.height, request.num_images_per_prompt, picture)


def shape_text(key: tuple) -> str:
    model, w, h, batch, picture = key
    extra = [f"batch {batch}"] if batch > 1 else []
    extra += [f"reference picture {picture[1]}x{picture[0]}"] if picture else []
    return f"{model} {w}x{h}" + (f" ({', '.join(extra)})" if extra else "")


@dataclass(frozen=True)
class PublicLimits:
    """A public studio's limits (README: Public mode)."""

    max_matrix_runs: int = 24  # (presets + 1) x repeats
    max_repeats: int = 3
    requests_per_minute: int = 12  # device events per visitor (an address), in any 60 s
    compiled_shapes: int = 4  # distinct shapes (compiled_shape) compiled stacks may meet per process
    request_s: int = 300  # seconds one request may run on the device (STUDIO_MAX_REQUEST_S)
    writes_per_minute: int = 30  # events that write a file (a preset saved or exported, an upload), per visitor
    presets_per_visitor: int = 20  # presets one visitor may save (over all their sessions)
    presets_in_all: int = 500  # presets all visitors may save together
    upload_mb_per_hour: float = 64.0  # bytes a visitor may upload in any hour (STUDIO_UPLOAD_MB_PER_HOUR)

    def __post_init__(self):
        for name, lo, hi in (
            ("max_matrix_runs", 2, 100_000),
            ("max_repeats", 1, 100_000),
            ("requests_per_minute", 1, 100_000),
            ("compiled_shapes", 1, 100_000),
            ("request_s", 1, 100_000),
            ("writes_per_minute", 1, 100_000),
            ("presets_per_visitor", 1, 100_000),
            ("presets_in_all", 1, 10_000_000),
        ):
            check_int("limits", name, getattr(self, name), lo, hi)

    @classmethod
    def from_settings(cls, s) -> PublicLimits:
        """The limits the operator set in the environment (spec.settings.Settings); the rest default."""
        kw = dict(
            requests_per_minute=s.requests_per_minute,
            writes_per_minute=s.writes_per_minute,
            presets_per_visitor=s.presets_per_visitor,
            presets_in_all=s.presets_in_all,
            upload_mb_per_hour=s.upload_mb_per_hour,
        )
        return cls(**kw, **({"request_s": int(s.max_request_s)} if s.max_request_s else {}))


@dataclass
class PublicGuard:
    """The limits and what they count: the sessions' recent events and the shapes compiled stacks have met."""

    limits: PublicLimits = field(default_factory=PublicLimits)
    proxy_hops: int = 0  # trusted proxies in front that append to X-Forwarded-For (spec.settings: 1 on a Space)
    ipv6_prefix: int = 64  # an IPv6 visitor's network (spec.settings: STUDIO_IPV6_PREFIX)
    _events: dict = field(default_factory=dict)  # visitor -> deque of event start times (monotonic)
    _writes: dict = field(default_factory=dict)  # visitor -> deque of writing events' times (monotonic)
    _uploads: dict = field(default_factory=dict)  # visitor -> deque of (time, bytes) of their uploads (monotonic)
    _saved: dict = field(default_factory=dict)  # visitor -> the preset files they saved (a name saved again: one)
    _shapes: set = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def rate(self, who: str | None, now: float | None = None) -> None:
        """Count one device event of visitor `who`; RateLimited over `requests_per_minute`."""
        n = self.limits.requests_per_minute
        _count(self._events, self._lock, who, n, now, f"runs at most {n} requests a minute per visitor")

    def write(self, who: str | None, now: float | None = None) -> None:
        """Count one event of visitor `who` that writes a file; RateLimited over `writes_per_minute`."""
        n = self.limits.writes_per_minute
        _count(self._writes, self._lock, who, n, now, f"writes at most {n} files a minute per visitor")

    def uploaded(self, who: str | None, nbytes: int, now: float | None = None) -> None:
        """Count an upload of `nbytes` by `who`; RateLimited past `upload_mb_per_hour`, saying when there is room."""
        now = time.monotonic() if now is None else now
        cap = int(self.limits.upload_mb_per_hour * MB)
        with self._lock:
            seen = self._uploads.setdefault(who or "anonymous", deque())
            while seen and now - seen[0][0] >= HOUR_S:
                seen.popleft()
            total = sum(n for _, n in seen)
            if total + nbytes > cap:
                when = _frees(seen, total, nbytes, cap, now)
                raise RateLimited(
                    f"this public studio takes at most {self.limits.upload_mb_per_hour:g} MiB of uploads an hour per "
                    f"visitor (STUDIO_UPLOAD_MB_PER_HOUR): you have sent {total / MB:.1f} MiB; {when}"
                )
            seen.append((now, nbytes))
            if len(self._uploads) > MAX_VISITORS:
                self._uploads.pop(next(iter(self._uploads)))

    def saving(self, who: str | None, path, saved_in_all: int) -> None:
        """Visitor `who` saves a preset at `path`: Refused over `presets_per_visitor` (all their sessions) or
        `presets_in_all` (`saved_in_all` on disk); a name saved again is free."""
        with self._lock:
            self._saving(self._saved.setdefault(who or "anonymous", set()), str(path), saved_in_all)
            if len(self._saved) > MAX_VISITORS:  # visitors that left: the oldest go first, as every table per visitor
                self._saved.pop(next(iter(self._saved)))

    def _saving(self, mine: set, path: str, saved_in_all: int) -> None:
        if path in mine:
            return
        if len(mine) >= self.limits.presets_per_visitor:
            raise Refused(
                f"you have saved {len(mine)} presets on this public studio, its limit per visitor: save over one of "
                "yours (the same name), or run the studio yourself to keep more"
            )
        if saved_in_all >= self.limits.presets_in_all:
            raise Refused(
                f"this public studio keeps {saved_in_all} visitors' presets, its limit: save over one of yours (the "
                "same name), or run the studio yourself"
            )
        mine.add(path)

    def event(
        self, who: str | None, switch: bool | None, presets: list, model: str, request, edits: bool = False
    ) -> None:
        """One device event of `who`: the rate, the compile switch, LoRA paths, each (preset, built in?) it runs."""
        self.rate(who)
        self.compile_switch(switch)
        own = [lo.path for lo in getattr(request, "loras", ()) if not lo.is_name]  # a shipped name reads no path
        if own:
            raise Refused(
                f"LoRA adapters are not taken from visitors of this public studio ({own[0]!r}: a path would read a "
                "file on its machine, a Hub id download one): the LoRAs shipped with the model, by name, are; run "
                "the studio yourself to use your own"
            )
        for p, builtin in presets:
            self.preset(p, builtin)
            self.shape(p, model, request, p.compile.enabled if switch is None else switch, edits)

    def compile_switch(self, switch: bool | None) -> None:
        if switch:
            raise Refused(
                "compile is this public studio's operator's choice: a per-request compile=true is refused here "
                "(a compile costs minutes of GPU); the presets that compile are the built-in ones"
            )

    def preset(self, p: Preset, builtin: bool) -> None:
        """A visitor's own preset may neither compile nor name LoRA files (a shipped LoRA's name is not a file); the
        operator's may."""
        if any(not lo.is_name for lo in p.loras) and not builtin:
            raise Refused(
                f"preset {p.name!r} names LoRA adapters: on this public studio only the operator's presets do (a "
                "path would read a file on its machine, a Hub id download one); save it without them (the LoRAs "
                "shipped with the model, by name, are allowed)"
            )
        if p.compile.enabled and not builtin:
            raise Refused(
                f"preset {p.name!r} compiles (mode {p.compile.mode}): on this public studio only the built-in "
                "presets compile; save it with compile: {enabled: false}"
            )

    def shape(self, p: Preset, model: str, request, compiled: bool, edits: bool = False) -> None:
        """A compiled stack at a new shape: Refused once `compiled_shapes` distinct ones were met."""
        if not compiled:
            return
        key = compiled_shape(model, request, edits)
        with self._lock:
            if key in self._shapes:
                return
            if len(self._shapes) >= self.limits.compiled_shapes:
                met = "; ".join(shape_text(k) for k in sorted(self._shapes, key=str)[:4])
                raise Refused(
                    f"{p.name} is compiled, and compiled stacks here have met {len(self._shapes)} shapes already "
                    f"(the limit of this public studio): use one of them ({met}; any steps and seed), or an "
                    "uncompiled preset"
                )
            self._shapes.add(key)

    def matrix(self, presets: int, repeats: int, prompts: int = 1) -> None:
        lim = self.limits
        if repeats > lim.max_repeats:
            raise Refused(f"repeats {repeats} is over this public studio's limit of {lim.max_repeats}")
        runs = (presets + 1) * repeats * prompts
        if runs > lim.max_matrix_runs:
            over = f" x {prompts} prompts" if prompts > 1 else ""
            raise Refused(
                f"a matrix of {presets} presets x {repeats} repeats{over} is {runs} timed runs: this public studio "
                f"runs at most {lim.max_matrix_runs} (fewer presets, repeats{' or prompts' if prompts > 1 else ''})"
            )
