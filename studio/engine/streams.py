"""What a block-streaming regime (group or layerwise offload) moves onto the device per transformer call: each
offloaded unit adds its bytes when onloaded while away. CPU-only, nothing crosses a bus (`moved`: False)."""

from __future__ import annotations

import statistics

import torch

from studio.engine.state import StreamLog, stack_state
from studio.measure.blocks import block_list

STREAMING = ("group_offload", "layerwise_offload")  # regimes that move the transformer's blocks during the loop
LOG_CAP = 4096  # transformer calls kept when nobody calls stream_begin (a long-lived process stays bounded)


def tensor_bytes(t) -> int:
    flatten = getattr(t, "__tensor_flatten__", None)  # a torchao subclass: the bytes of its inner tensors
    if flatten is not None:
        return sum(tensor_bytes(getattr(t, name)) for name in flatten()[0])
    return t.numel() * t.element_size()


def module_bytes(*modules, extra=()) -> int:
    """Bytes of the parameters and buffers of `modules` and of the tensors `extra` (each tensor counted once)."""
    seen = {id(t): t for t in extra}
    for m in modules:
        for t in list(m.parameters()) + list(m.buffers()):
            seen[id(t)] = t
    return sum(tensor_bytes(t) for t in seen.values())


def new_log(tr, units: dict) -> StreamLog:
    """A new StreamLog on `tr`: a call opens a row, each block that runs adds to its block count."""
    blocks = block_list(tr)
    log = StreamLog(blocks=len(blocks), unit_bytes=units, away=set(units))

    @torch.compiler.disable
    def on_call(module, args):
        log.seen_calls += 1
        log.calls.append([0, 0])
        del log.calls[:-LOG_CAP]

    @torch.compiler.disable
    def on_block(module, args):
        if log.calls:
            log.calls[-1][1] += 1
        if log.seen_calls == 1:
            log.first_call_blocks += 1

    log.handles.append(tr.register_forward_pre_hook(on_call, prepend=True))
    log.handles += [b.register_forward_pre_hook(on_block) for b in blocks]
    return log


def onloaded(log: StreamLog, unit: int) -> None:
    if unit in log.away:
        log.away.discard(unit)
        if not log.calls:
            log.calls.append([0, 0])
        log.calls[-1][0] += log.unit_bytes[unit]


def tally_group(log: StreamLog, group) -> None:
    """Count what diffusers' ModuleGroup moves: its onload_/offload_ are every way in and out (a prefetch too)."""
    unit, onload, offload = id(group), group.onload_, group.offload_

    @torch.compiler.disable
    def counted_onload():
        onload()
        onloaded(log, unit)

    @torch.compiler.disable
    def counted_offload():
        offload()
        log.away.add(unit)

    group.onload_, group.offload_ = counted_onload, counted_offload


def tally_block(log: StreamLog, block) -> None:
    """cache-dit onloads a non-persistent block before it runs and offloads it after (both modes)."""
    unit = id(block)

    @torch.compiler.disable
    def pre(module, args):
        onloaded(log, unit)

    @torch.compiler.disable
    def post(module, args, output):
        log.away.add(unit)

    log.handles += [block.register_forward_pre_hook(pre), block.register_forward_hook(post)]


def tally_prefetch(log: StreamLog, handle) -> None:
    """An async prefetch onloads a block ahead of its turn (maybe one a cached step skips): counted when issued."""
    schedule = handle._schedule_target_onload

    def counted(target, *, allow_wait):
        schedule(target, allow_wait=allow_wait)
        if target.pending_onload_event is not None:
            onloaded(log, id(target.module))

    handle._schedule_target_onload = counted


def stream_begin(transformer) -> None:
    """Start a run's count, before the pipeline call whose report is wanted."""
    log = stack_state(transformer).offloading.stream
    if log is not None:
        log.calls.clear()


def stream_report(transformer, calls_per_step: int = 1, cached: list[int] | None = None) -> dict | None:
    """Bytes the streaming regime moved onto the device since `stream_begin`, per full and per cached step; None: no
    such regime, or no call. Without `cached` indices, a step is cached where a call of it ran fewer blocks."""
    state = stack_state(transformer)
    log = state.offloading.stream
    if state.offloading.regime not in STREAMING or log is None or not log.calls:
        return None
    n = max(1, calls_per_step)
    steps = [log.calls[i : i + n] for i in range(0, len(log.calls), n)]
    own = [i for i, s in enumerate(steps) if any(c[1] < log.blocks for c in s)]
    which = set(own if cached is None else cached)
    per_step = [sum(c[0] for c in s) for s in steps]
    full = [b for i, b in enumerate(per_step) if i not in which]
    hit = [b for i, b in enumerate(per_step) if i in which]
    check = None
    if cached is not None:
        check = "agrees with the offloaded blocks' hooks" if sorted(cached) == own else f"DISAGREES: hooks say {own}"
    device = torch.device(state.offloading.key[1])
    return {
        "policy": state.offloading.regime,
        "device": str(device),
        "moved": device.type != "cpu",  # cpu <-> cpu: what the regime onloads, nothing crossed a bus
        "h2d_bytes": sum(per_step),
        "h2d_bytes_per_step": per_step,
        "h2d_bytes_per_full_step": int(statistics.median(full)) if full else None,
        "h2d_bytes_per_cached_step": int(statistics.median(hit)) if hit else None,
        "full_steps": len(full),
        "cached_steps": len(hit),
        "streamed_bytes": sum(log.unit_bytes.values()),  # what the regime keeps off the device between uses
        # the call diffusers' stream prefetch traces its order on: a cache that skipped blocks in it would leave the
        # skipped groups unprefetched (diffusers 0.42 then onloads them synchronously, with a warning)
        "first_call_full": log.first_call_blocks == log.blocks,
        "check": check,
    }
