"""One typed record of what the studio has applied to a transformer, kept as ONE attribute on it: a record per
feature, each written only by the module that applies it (as diffusers keeps one state per hook), read as fields,
never text."""

from __future__ import annotations

from dataclasses import dataclass, field

from studio.measure.timing import StepCounter

STATE_ATTR = "_studio_state"  # our one attribute on a transformer (beside it: the step counter's hooks)


@dataclass(frozen=True)
class Engaged:
    """What one optimization step did: engaged as asked, or fell back, with the reason in words."""

    feature: str  # quantize | offload | cache | attention | compile
    requested: str  # what the preset asked for, e.g. "sage"
    engaged: bool  # True when what was asked is what runs
    detail: str  # what runs, or why it fell back ("sage: unavailable on cpu, using sdpa")
    ran: str = ""  # the label token of what runs for this part (spec.label), "": nothing of it runs

    @property
    def fell_back(self) -> bool:
        return self.requested not in ("none", "off") and not self.engaged

    def __str__(self) -> str:
        return self.detail


@dataclass
class CompiledVariant:
    """One torch.compile of the transformer (regional or whole), its compiled callables saved per module so it can be
    switched off and on again without recompiling."""

    key: tuple  # (mode, fullgraph, dynamic, regional)
    fullgraph: bool
    whole_model: bool
    how: str  # "regional (FluxTransformerBlock, ...)" or "whole transformer"
    impls: list = field(default_factory=list)  # [(module, attribute, compiled value, eager value)]
    compile_s: float | None = None  # the warm-up run that compiled it, once measured

    def finish(self) -> int:
        """After the warm-up run: how many graphs were built (0: a run-time graph compiles by itself)."""
        return 0

    def switched_on(self) -> None:
        """Switched on again: nothing to redo for run-time graphs (engine.aot re-points its packages)."""

    def pending(self) -> bool:
        """Whether calls ran without their compiled form since the last warm-up (engine.aot)."""
        return False


@dataclass(frozen=True)
class ParallelState:
    """The parallel workers running now, for one transformer's model."""

    runs: tuple  # what they run: (ParallelSpec, CacheSpec, attention backend, steps, separate_cfg)
    proxy: object  # the pipeline object whose calls go to the workers (cache-dit's Ray proxy)
    info: dict  # world size, kind, where each worker runs (the card's and the JSON's `parallel`)
    engaged: Engaged  # the stack line that says so
    generation: int  # which worker set this is (WorkersState.starts when it started)


@dataclass
class StreamLog:
    """What a block-streaming regime moved onto the device per transformer call: each offloaded unit counts its bytes
    when onloaded while away."""

    blocks: int  # offloaded blocks one full call runs (a call that ran fewer was served by a step cache)
    unit_bytes: dict = field(default_factory=dict)  # unit id -> bytes of its parameters and buffers
    away: set = field(default_factory=set)  # units on the offload device now
    calls: list = field(default_factory=list)  # [h2d bytes, blocks run] per transformer call since stream_begin
    first_call_blocks: int = (
        0  # offloaded blocks the regime's first call ran (diffusers' streams trace their order on it)
    )
    seen_calls: int = 0  # transformer calls since the regime went on
    handles: list = field(default_factory=list)  # the counting hooks, removed with the regime


@dataclass
class QuantState:
    """Written by engine.quantize: the torchao form the weights are in. Never reset: quantized weights come off only
    with a reload, which starts a new transformer and a new StackState."""

    mode: str = "none"


@dataclass
class CacheState:
    """Written by engine.cache: the step cache engaged now (a CACHE_BACKENDS name or "none"); reset by remove_cache."""

    backend: str = "none"
    ratios: dict | None = None  # MagCache calibrating: its magnitude ratios by branch, copied after every call
    children: tuple = ()  # the transformer's child modules in their loaded order (cache-dit re-registers some)

    def reset(self) -> None:  # (the children's order is the transformer's, kept)
        self.backend = "none"
        self.ratios = None


@dataclass
class CompileState:
    """Written by engine.compile: the variant running (None: eager; uncompile switches it off), every variant by key,
    kept for the next time it is asked for, and those whose first run failed (never retried). The variants and
    failures live as long as the transformer: a reload starts a new StackState."""

    running: CompiledVariant | None = None
    variants: dict = field(default_factory=dict)
    failed: dict = field(default_factory=dict)


@dataclass
class LoraState:
    """Written by engine.lora."""

    slots: list = field(default_factory=list)  # the LoRA file in each hot-swap slot lora0, lora1, ...
    units: dict = field(default_factory=dict)  # (id(layer), slot) -> the slot's scale at 1 in that layer
    modules: int = 0  # changes of the LoRA layers (a slot added, all dropped): warm-ups key by it
    fused: tuple = ()  # the LoraSpecs fused into these weights before quantization

    def reset(self) -> None:
        """The adapters gone from these weights (the fused ones stay: they are in the weights)."""
        self.slots.clear()
        self.units.clear()
        self.modules += 1


@dataclass
class OffloadState:
    """Written by engine.offload."""

    regime: str = "none"  # the regime that runs (`auto` resolved; a fall-back is none)
    key: tuple | None = None  # (OffloadSpec, run device, the policy it decided: `auto` resolved) it was applied for
    stream: StreamLog | None = None
    run_device: str | None = None  # where the loader placed the pipeline to compute, wherever its weights wait
    encoders_by_use: bool = False  # the text encoders wait on the host and come to the device to encode
    encoder_hooks: list = field(default_factory=list)  # their hooks' handles (engine.offload.encoders_by_use)
    encoder_turns: int = 0  # text encoder calls under it (each one on the device for its call)

    def reset(self) -> None:
        self.regime, self.key, self.stream = "none", None, None
        self.encoders_by_use, self.encoder_hooks, self.encoder_turns = False, [], 0


@dataclass
class WorkersState:
    """Written by engine.parallel."""

    running: ParallelState | None = None  # None: one process
    starts: int = 0  # worker sets started so far (a rebuilt set warms up again)

    def reset(self) -> None:
        self.running = None


@dataclass(slots=True)
class StackState:
    """What the studio has applied to one transformer, the step counter, and the shapes already warmed up in this
    process (`warm`: engine.run)."""

    quantize: QuantState = field(default_factory=QuantState)
    step_cache: CacheState = field(default_factory=CacheState)
    compile: CompileState = field(default_factory=CompileState)
    lora: LoraState = field(default_factory=LoraState)
    offloading: OffloadState = field(default_factory=OffloadState)
    workers: WorkersState = field(default_factory=WorkersState)
    counter: StepCounter = field(default_factory=StepCounter)
    warm: set = field(default_factory=set)


def stack_state(transformer) -> StackState:
    """The transformer's StackState, created on first use with its step counter's hooks, before anything compiles
    (so compile traces them)."""
    state = getattr(transformer, STATE_ATTR, None)
    if state is None:
        state = StackState()
        state.counter.install(transformer)
        setattr(transformer, STATE_ATTR, state)
    return state
