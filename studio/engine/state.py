"""One typed record of what the studio has applied to a transformer, kept as ONE attribute on it.

Like diffusers keeps one hook registry per module: quantization, the engaged step cache, compiled variants, the
step counter and the shapes already warmed up all live in `StackState`; every part of the engine reads fields of
it, never text.
"""

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
    """One torch.compile of the transformer (regional or whole), kept so it can be switched off and on again
    without recompiling: the compiled callables are saved per module and restored in place."""

    key: tuple  # (mode, fullgraph, dynamic, regional)
    fullgraph: bool
    whole_model: bool
    how: str  # "regional (FluxTransformerBlock, ...)" or "whole transformer"
    impls: list = field(default_factory=list)  # [(module, attribute, compiled value, eager value)]
    compile_s: float | None = None  # the warm-up run that compiled it, once measured

    def finish(self) -> int:
        """After the warm-up run (which compiles a run-time graph by itself): what is left to build; 0 here."""
        return 0

    def switched_on(self) -> None:
        """Switched on again: nothing to redo for run-time graphs (engine.aot re-points its packages)."""

    def pending(self) -> bool:
        """Whether calls ran without their compiled form since the last warm-up (engine.aot: shapes not built)."""
        return False


@dataclass(frozen=True)
class ParallelState:
    """The parallel workers running now, for one transformer's model (engine.parallel starts and stops them)."""

    runs: tuple  # what they run: (ParallelSpec, CacheSpec, attention backend, steps, separate_cfg)
    proxy: object  # the pipeline object whose calls go to the workers (cache-dit's Ray proxy)
    info: dict  # world size, kind, where each worker runs (the card's and the JSON's `parallel`)
    engaged: Engaged  # the stack line that says so
    generation: int  # which worker set this is (StackState.parallel_starts when it started)


@dataclass
class StreamLog:
    """What a block-streaming regime moved onto the device, per transformer call of the current run (engine.offload):
    each offloaded unit (a diffusers group, a cache-dit layerwise block) counts its bytes when it is onloaded while
    away on the offload device."""

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
class StackState:
    quant: str = "none"  # torchao mode applied to the weights
    cache: str = "none"  # engaged step cache: none | cache-dit | fbcache
    compiled: CompiledVariant | None = None  # the variant that runs now, None when eager
    variants: dict = field(default_factory=dict)  # key -> CompiledVariant, every variant compiled so far
    counter: StepCounter = field(default_factory=StepCounter)
    warm: set = field(default_factory=set)  # (stack signature, graph shape, LoRA layers) run once in this process
    compile_failed: dict = field(default_factory=dict)  # variant key -> why its first run failed (never retried)
    parallel: ParallelState | None = None  # the running parallel workers (engine.parallel), None: one process
    parallel_starts: int = 0  # worker sets started so far (a rebuilt set warms up again)
    loras: list = field(default_factory=list)  # the LoRA file in each hot-swap slot lora0, lora1, ... (engine.lora)
    lora_units: dict = field(default_factory=dict)  # (id(layer), slot) -> the slot's scale at 1 in that layer
    lora_modules: int = 0  # changes of the LoRA layers in the modules (a slot added, all dropped): warm-ups key by it
    fused: tuple = ()  # LoraSpec fused into these weights before quantization (engine.loader), none: ()
    offload: str = "none"  # the memory regime that runs (engine.offload): none | group_offload | layerwise_offload |
    # model_cpu_offload (auto resolved; a fall-back is "none")
    offload_key: tuple | None = None  # (OffloadSpec, run device) the regime was applied for, None: never applied
    stream: StreamLog | None = None  # the bytes a block-streaming regime moves, None: nothing streams


def stack_state(transformer) -> StackState:
    """The transformer's StackState, created (with its step counter hooks installed) on first use.

    The counter's hooks go on before anything is compiled, so they are part of the module when compile traces it.
    """
    state = getattr(transformer, STATE_ATTR, None)
    if state is None:
        state = StackState()
        state.counter.install(transformer)
        setattr(transformer, STATE_ATTR, state)
    return state
