"""Every setting the studio takes from its environment, read once at the edges (app, CLI, worker) into one record.
Only the edges read `current()`; the engine and below are handed what they need, and never read `os.environ`."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from studio.spec.checks import ConfigError

DTYPE_NAMES = ("bfloat16", "float16", "float32")
COMPARE_MODES = ("on", "auto", "off")


def _flag(env: Mapping, name: str, default: bool) -> bool:
    raw = env.get(name, "").strip()
    return default if not raw else raw not in ("0", "false", "False", "no")


def _number(env: Mapping, name: str, kind, low, high):
    raw = env.get(name, "").strip()
    if not raw:
        return None
    try:
        value = kind(raw)
    except ValueError:
        value = None
    if value is None or not low <= value <= high:
        what = "a whole number" if kind is int else "a number"
        raise ConfigError(f"{name}={raw!r} is not valid: {what} from {low} to {high}, or unset it")
    return value


def _choice(env: Mapping, name: str, allowed: tuple) -> str | None:
    raw = env.get(name, "").strip()
    if raw and raw not in allowed:
        raise ConfigError(f"{name}={raw!r} is not valid: use one of {list(allowed)}, or unset it")
    return raw or None


def _proxy_hops(env: Mapping) -> int:
    hops = _number(env, "STUDIO_PROXY_HOPS", int, 0, 16)
    if hops is not None:
        return hops
    return 1 if env.get("SPACE_ID") or _flag(env, "STUDIO_TRUST_FORWARDED", False) else 0


@dataclass(frozen=True)
class Settings:
    """The environment's word on how this studio runs (README: the settings table). Defaults: a plain local run."""

    # the engine's
    dtype: str | None = None  # STUDIO_DTYPE: in place of what `dtype: auto` picks (engine.device)
    parallel: bool = True  # STUDIO_PARALLEL=0: parallel presets run in one process and say so (engine.parallel)
    ray_address: str | None = None  # RAY_ADDRESS: an existing Ray cluster for the parallel presets
    lora_rank: int = 64  # STUDIO_LORA_RANK: every LoRA hot-swap slot's rank (engine.lora)
    transformer_slots: int | None = None  # STUDIO_TRANSFORMER_SLOTS: weight sets kept loaded (None: 1 GPU, 2 CPU)
    # STUDIO_DEVICE_MEMORY_GB: the device memory (GiB) the studio may use; the loader and `offload_config` place the
    # model within it, on a CPU as on CUDA (engine.placement). None: the device's free memory (unbounded on a CPU)
    device_memory_gb: float | None = None
    presets_dir: str | None = None  # STUDIO_PRESETS_DIR: the user preset folder
    aot_dir: str | None = None  # STUDIO_AOT_DIR: ahead-of-time packages (engine.aot; None: <tmp>/studio-aot)
    # STUDIO_PACE_FILE: the bench's record of this machine's fastest base (measure.pace; None: ~/.cache/...)
    pace_file: str | None = None
    hub_offline: bool = False  # HF_HUB_OFFLINE: the Hub is not reached (a load error says so)
    zerogpu: bool = False  # a ZeroGPU Space: `spaces` installed and SPACES_ZERO_GPU set
    # STUDIO_ZEROGPU_SIZE: the slice every GPU call asks for, large (half a card) or xlarge (all of it, twice the
    # quota); the device profile (spec.devices: zerogpu, zerogpu-xlarge) and spaces.GPU(size=...) read it
    zerogpu_size: str = "large"
    # the app's
    model: str = "tiny"  # STUDIO_MODEL
    models: tuple = ()  # STUDIO_MODELS: more models for the picker (in public mode the only ones that load)
    preset: str | None = None  # STUDIO_PRESET: the Generate tab's default (None: the model profile's, else `cache`)
    public: bool = False  # STUDIO_PUBLIC=1, or on a Space (SPACE_ID)
    # STUDIO_PROXY_HOPS: trusted proxies in front of the studio that append to X-Forwarded-For; the visitor is the
    # entry the last of them wrote (app.limits.visitor). Default 1 on a Space (SPACE_ID; docs/deploy.md says why),
    # 1 with STUDIO_TRUST_FORWARDED=1 (a proxy of the operator's), else 0: the header is the client's to write
    proxy_hops: int = 0
    # STUDIO_IPV6_PREFIX: an IPv6 visitor is keyed by their network of this prefix (every IPv6 host has a /64 to rotate
    # addresses through; 56 or 48 for providers that hand out wider ones); an IPv4 visitor by their address
    ipv6_prefix: int = 64
    compare: str | None = None  # STUDIO_COMPARE: on | auto | off (None: on, auto in public mode)
    device: str | None = None  # STUDIO_DEVICE: cpu or cuda
    max_steps: int | None = None  # STUDIO_MAX_STEPS
    max_side: int | None = None  # STUDIO_MAX_SIDE
    max_request_s: float | None = None  # STUDIO_MAX_REQUEST_S
    worker_max_rss_gb: float | None = None  # STUDIO_WORKER_MAX_RSS_GB
    # STUDIO_WORKER_HOOK: "module:function[:{json keyword arguments}]", called in the device worker with its Runner and
    # DeviceService once built: instrumentation kept out of the studio (tests/worker_hooks.py)
    worker_hook: str | None = None
    queue_size: int = 32  # STUDIO_QUEUE_SIZE
    max_body_mb: float = 16.0  # STUDIO_MAX_BODY_MB: a request body over this is answered 413 unread (app.bounds)
    # STUDIO_MAX_API_BODY_KB: the cap on an OpenAI images request's body (/v1: a prompt and a few fields; an edit's
    # picture comes as an upload), answered 413 unread
    max_api_body_kb: float = 64.0
    # what the studio keeps (docs/deploy.md: public mode's bounds)
    max_prompt_chars: int = 2000  # STUDIO_MAX_PROMPT_CHARS: a longer prompt (or negative prompt) is refused
    # STUDIO_MAX_UPLOAD_MB, STUDIO_UPLOAD_MB_PER_HOUR: one upload's size (a picture or a preset needs a few MiB), and a
    # public visitor's uploads in bytes over the last hour (app.bounds.UploadCount); STUDIO_MAX_CACHE_MB: gradio's
    # cache of uploads and results, in total (app.keep: its oldest files go first)
    max_upload_mb: float = 10.0
    upload_mb_per_hour: float = 64.0
    max_cache_mb: float = 2048.0
    max_files_mb: float = 512.0  # STUDIO_MAX_FILES_MB: the pictures and downloads kept, oldest pruned (app.keep)
    cache_age_s: int | None = None  # STUDIO_CACHE_AGE_S: gradio's cached files older than this go (None: kept)
    sessions: int = 10_000  # STUDIO_SESSIONS: the sessions whose state (history, last pictures) stays in memory
    history_rows: int = 200  # STUDIO_HISTORY_ROWS: the rows a session's history keeps (app.history)
    # a public studio's per-visitor limits (app.limits.PublicLimits.from_settings)
    requests_per_minute: int = 12  # STUDIO_REQUESTS_PER_MINUTE: device events per visitor in any 60 s
    writes_per_minute: int = 30  # STUDIO_WRITES_PER_MINUTE: events that write files (a preset saved, an upload)
    waiting_per_visitor: int = 4  # STUDIO_WAITING_PER_VISITOR: a visitor's requests waiting in the queue (app.bounds)
    presets_per_visitor: int = 20  # STUDIO_PRESETS_PER_VISITOR: presets one visitor may save
    presets_in_all: int = 500  # STUDIO_PRESETS_IN_ALL: presets all visitors may save together
    prewarm: bool = True  # STUDIO_PREWARM=0: no warm-up at start (off by default on ZeroGPU)
    # STUDIO_API_KEY: every request to the server asks for it (app.access: Bearer, or a browser's sign-in)
    api_key: str | None = None
    open_page: bool = False  # STUDIO_OPEN_PAGE=1: with a key, the page and its gradio events stay open (app.access)
    # STUDIO_MCP: the endpoints as MCP tools (gradio's MCP server). Off on a public studio unless the operator says
    # so: an agent calls in loops, and every tool call is a generation on the host's device
    mcp: bool = True
    # STUDIO_LPIPS_FETCH: fetch LPIPS' weights once at start (studio.measure.lpips.fetch_weights). On by default on a
    # Space, where downloads work and the card otherwise says "no weights here"; off elsewhere (offline machines)
    lpips_fetch: bool = False

    @property
    def zerogpu_slice(self) -> str | None:
        """The ZeroGPU slice the device profile is (None: not on ZeroGPU)."""
        return self.zerogpu_size if self.zerogpu else None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        """The record from an environment (os.environ at an edge); a bad value raises ConfigError naming it."""
        public = bool(env.get("SPACE_ID")) or _flag(env, "STUDIO_PUBLIC", False)
        zerogpu = importlib.util.find_spec("spaces") is not None and _flag(env, "SPACES_ZERO_GPU", False)
        model = env.get("STUDIO_MODEL", "").strip() or "tiny"
        more = tuple(m.strip() for m in env.get("STUDIO_MODELS", "").split(",") if m.strip() and m.strip() != model)
        return cls(
            dtype=_choice(env, "STUDIO_DTYPE", DTYPE_NAMES),
            # a visitor's click must not start worker processes on a shared Space unless the operator says so
            parallel=_flag(env, "STUDIO_PARALLEL", not public),
            ray_address=env.get("RAY_ADDRESS", "").strip() or None,
            lora_rank=_number(env, "STUDIO_LORA_RANK", int, 1, 1024) or cls.lora_rank,
            transformer_slots=_number(env, "STUDIO_TRANSFORMER_SLOTS", int, 1, 64),
            device_memory_gb=_number(env, "STUDIO_DEVICE_MEMORY_GB", float, 0.001, 100_000),
            presets_dir=env.get("STUDIO_PRESETS_DIR", "").strip() or None,
            aot_dir=env.get("STUDIO_AOT_DIR", "").strip() or None,
            pace_file=env.get("STUDIO_PACE_FILE", "").strip() or None,
            hub_offline=_flag(env, "HF_HUB_OFFLINE", False),
            zerogpu=zerogpu,
            zerogpu_size=_choice(env, "STUDIO_ZEROGPU_SIZE", ("large", "xlarge")) or cls.zerogpu_size,
            model=model,
            models=(model,) + more,
            preset=env.get("STUDIO_PRESET", "").strip() or cls.preset,
            public=public,
            proxy_hops=_proxy_hops(env),
            compare=_choice(env, "STUDIO_COMPARE", COMPARE_MODES),
            device=_choice(env, "STUDIO_DEVICE", ("cpu", "cuda")),
            max_steps=_number(env, "STUDIO_MAX_STEPS", int, 1, 10_000),
            max_side=_number(env, "STUDIO_MAX_SIDE", int, 16, 16_384),
            max_request_s=_number(env, "STUDIO_MAX_REQUEST_S", float, 1, 86_400),
            worker_max_rss_gb=_number(env, "STUDIO_WORKER_MAX_RSS_GB", float, 0.1, 10_000),
            worker_hook=env.get("STUDIO_WORKER_HOOK", "").strip() or None,
            queue_size=_number(env, "STUDIO_QUEUE_SIZE", int, 1, 10_000) or cls.queue_size,
            ipv6_prefix=_number(env, "STUDIO_IPV6_PREFIX", int, 16, 128) or cls.ipv6_prefix,
            max_body_mb=_number(env, "STUDIO_MAX_BODY_MB", float, 0.01, 100_000) or cls.max_body_mb,
            max_api_body_kb=_number(env, "STUDIO_MAX_API_BODY_KB", float, 1, 100_000) or cls.max_api_body_kb,
            max_prompt_chars=_number(env, "STUDIO_MAX_PROMPT_CHARS", int, 1, 1_000_000) or cls.max_prompt_chars,
            max_files_mb=_number(env, "STUDIO_MAX_FILES_MB", float, 1, 10_000_000) or cls.max_files_mb,
            max_upload_mb=_number(env, "STUDIO_MAX_UPLOAD_MB", float, 0.01, 100_000) or cls.max_upload_mb,
            upload_mb_per_hour=_number(env, "STUDIO_UPLOAD_MB_PER_HOUR", float, 0.01, 10_000_000)
            or cls.upload_mb_per_hour,
            max_cache_mb=_number(env, "STUDIO_MAX_CACHE_MB", float, 1, 10_000_000) or cls.max_cache_mb,
            cache_age_s=_number(env, "STUDIO_CACHE_AGE_S", int, 60, 10_000_000) or (3600 if public else None),
            sessions=_number(env, "STUDIO_SESSIONS", int, 1, 1_000_000) or (64 if public else cls.sessions),
            history_rows=_number(env, "STUDIO_HISTORY_ROWS", int, 1, 100_000) or cls.history_rows,
            requests_per_minute=_number(env, "STUDIO_REQUESTS_PER_MINUTE", int, 1, 100_000) or cls.requests_per_minute,
            writes_per_minute=_number(env, "STUDIO_WRITES_PER_MINUTE", int, 1, 100_000) or cls.writes_per_minute,
            waiting_per_visitor=_number(env, "STUDIO_WAITING_PER_VISITOR", int, 1, 10_000) or cls.waiting_per_visitor,
            presets_per_visitor=_number(env, "STUDIO_PRESETS_PER_VISITOR", int, 1, 100_000) or cls.presets_per_visitor,
            presets_in_all=_number(env, "STUDIO_PRESETS_IN_ALL", int, 1, 10_000_000) or cls.presets_in_all,
            # not on ZeroGPU: the app's process has no GPU outside a GPU call, and a warm-up is a fact about the
            # process that ran it (each call's forked process warms its stack again)
            prewarm=_flag(env, "STUDIO_PREWARM", not zerogpu),
            api_key=env.get("STUDIO_API_KEY", "").strip() or None,
            open_page=_flag(env, "STUDIO_OPEN_PAGE", False),
            mcp=_flag(env, "STUDIO_MCP", not public),
            lpips_fetch=_flag(env, "STUDIO_LPIPS_FETCH", bool(env.get("SPACE_ID"))),
        )


_CURRENT = [Settings()]


def torch_hub_checkpoints(env: Mapping | None = None) -> Path:
    """Where torch.hub.get_dir() puts checkpoints by default ($TORCH_HOME/hub, else $XDG_CACHE_HOME/torch/hub, else
    ~/.cache/torch/hub), found without importing torch: the app's process, which fetches LPIPS' weights, never does."""
    env = os.environ if env is None else env
    home = env.get("TORCH_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or "~/.cache", "torch")
    return Path(home).expanduser() / "hub" / "checkpoints"


def install(settings: Settings) -> Settings:
    """Make `settings` this process's record (an edge does it once; the worker with the one it was given)."""
    _CURRENT[0] = settings
    return settings


def current() -> Settings:
    return _CURRENT[0]


@contextmanager
def using(**changes):
    """This process's record with `changes` for the length of a `with` (tests)."""
    before = _CURRENT[0]
    _CURRENT[0] = replace(before, **changes)
    try:
        yield _CURRENT[0]
    finally:
        _CURRENT[0] = before
