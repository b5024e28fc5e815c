"""`bench --vs-raw`: the request through plain diffusers, cache-dit and torchao as a user would write it from their
docs, to measure what the studio's own machinery costs. One worker process per preset keeps cache-dit's class patching
and compile's caches apart; it imports nothing of the studio, on purpose. Protocol: the recipe, then one JSON message
per line on stdin ({"cmd": "run", "request": {...}, "out": path} or {"cmd": "quit"}), one JSON answer per line out."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time


# ---- the plain recipe (worker side) -------------------------------------------------------------------------------
def build_pipeline(recipe: dict):
    import torch
    from diffusers import DiffusionPipeline

    if recipe.get("threads"):  # the studio's process's count (studio.bench.vsraw.recipe): the same work split alike
        torch.set_num_threads(recipe["threads"])
    dtype = getattr(torch, recipe["dtype"])
    pipe = DiffusionPipeline.from_pretrained(recipe["model"], torch_dtype=dtype).to(recipe["device"])
    pipe.set_progress_bar_config(disable=True)
    tr = pipe.transformer
    if recipe.get("quant_type"):
        from torchao.quantization import (
            Float8DynamicActivationFloat8WeightConfig,
            Int8DynamicActivationInt8WeightConfig,
            Int8WeightOnlyConfig,
            PerRow,
            quantize_,
        )

        config = {  # cache-dit's quant_type names, as torchao spells them
            "int8_weight_only": Int8WeightOnlyConfig,
            "int8_per_row": lambda: Int8DynamicActivationInt8WeightConfig(granularity=PerRow()),
            "float8_per_row": lambda: Float8DynamicActivationFloat8WeightConfig(granularity=PerRow()),
        }
        skip = recipe.get("exclude_layers") or []
        quantize_(
            tr,
            config[recipe["quant_type"]](),
            filter_fn=lambda m, fqn: isinstance(m, torch.nn.Linear) and not any(x in fqn for x in skip),
        )
    cache = recipe.get("dbcache")
    if cache is not None:
        import cache_dit
        from cache_dit import DBCacheConfig, DMDCalibratorConfig, TaylorSeerCalibratorConfig

        cal = recipe.get("calibrator") or {}
        calibrator = None
        if "taylorseer_order" in cal:
            calibrator = TaylorSeerCalibratorConfig(taylorseer_order=cal["taylorseer_order"])
        elif "dmd_history" in cal:
            calibrator = DMDCalibratorConfig(dmd_history=cal["dmd_history"], dmd_rank=cal["dmd_rank"])
        cache_dit.enable_cache(pipe, cache_config=DBCacheConfig(**cache), calibrator_config=calibrator)
    if recipe.get("fbcache_threshold") is not None:
        from diffusers import FirstBlockCacheConfig

        tr.enable_cache(FirstBlockCacheConfig(threshold=recipe["fbcache_threshold"]))
    if recipe.get("attention") and recipe["attention"] != "native":
        tr.set_attention_backend(recipe["attention"])
    if recipe.get("compile"):
        tr.compile_repeated_blocks(fullgraph=recipe.get("fullgraph", False))
    return pipe


def _call(pipe, recipe: dict, req: dict, timed: bool):
    import numpy as np
    import torch

    device = torch.device(recipe["device"])
    cuda = device.type == "cuda"
    marks = []

    def mark():
        if cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            marks.append(ev)
        else:
            marks.append(time.perf_counter())

    def first_call(module, args, kwargs):
        if not marks:
            if cuda:
                torch.cuda.synchronize(device)
            mark()

    def step_end(p, i, t, kw):
        mark()
        return kw

    hook = pipe.transformer.register_forward_pre_hook(first_call, with_kwargs=True)
    kw = dict(req["kwargs"], generator=torch.Generator("cpu").manual_seed(req["seed"]), output_type="np")
    t0 = time.perf_counter()
    try:
        image = pipe(**kw, callback_on_step_end=step_end).images[0]
    finally:
        hook.remove()
    if cuda:
        torch.cuda.synchronize(device)
    call_s = time.perf_counter() - t0
    if cuda:
        step_ms = [a.elapsed_time(b) for a, b in zip(marks, marks[1:])]
    else:
        step_ms = [(b - a) * 1e3 for a, b in zip(marks, marks[1:])]
    image = (np.clip(image, 0, 1) * 255).round().astype(np.uint8)
    return sum(step_ms) / 1e3, step_ms, _cached_steps(pipe, recipe), call_s, image


def _cached_steps(pipe, recipe: dict) -> list[int] | None:
    """The steps cache-dit served from its cache in the last call, as its own summary says (None: no DBCache)."""
    if recipe.get("dbcache") is None:
        return None
    import cache_dit

    stats = cache_dit.summary(pipe, logging=False)
    return sorted(int(i) for i in (stats[-1].cached_steps or [])) if stats else None


def worker_main() -> int:
    import numpy as np

    out = sys.stdout
    sys.stdout = sys.stderr  # library prints must not corrupt the answers
    recipe = json.loads(sys.stdin.readline())
    pipe = build_pipeline(recipe)
    warm = set()
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        msg = json.loads(line)
        if msg.get("cmd") == "quit":
            break
        req = msg["request"]
        shape = (req["kwargs"].get("width"), req["kwargs"].get("height"), req["kwargs"].get("num_inference_steps"))
        warmup_s = None
        if shape not in warm:  # untimed warm-up per shape, as the studio does (compiles under torch.compile)
            t0 = time.perf_counter()
            _call(pipe, recipe, req, timed=False)
            warm.add(shape)
            warmup_s = time.perf_counter() - t0
        denoise, step_ms, cached, call_s, image = _call(pipe, recipe, req, timed=True)
        np.save(msg["out"], image)
        answer = {"denoise_s": denoise, "step_ms": step_ms, "cached": cached, "call_s": call_s, "warmup_s": warmup_s}
        out.write(json.dumps(answer) + "\n")
        out.flush()
    return 0


# ---- the studio side ----------------------------------------------------------------------------------------------
class RawWorker:
    """One plain pipeline in a worker process; `run(kwargs, seed)` -> (the answer dict, the image)."""

    def __init__(self, recipe: dict):
        self.recipe = recipe
        self._dir = tempfile.TemporaryDirectory(prefix="studio-raw-")
        self._log = open(os.path.join(self._dir.name, "worker.log"), "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-u", "-m", "studio.bench.raw"],  # -u: each reply line leaves at once
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        self._send(recipe)
        self._read()

    def _send(self, msg: dict) -> None:
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self._log.flush()
            tail = open(self._log.name).read().strip().splitlines()[-3:]
            raise RuntimeError(f"the plain-diffusers worker for {self.recipe.get('name')} died: {' | '.join(tail)}")
        return json.loads(line)

    def run(self, kwargs: dict, seed: int):
        import numpy as np

        path = os.path.join(self._dir.name, "image.npy")
        self._send({"cmd": "run", "request": {"kwargs": kwargs, "seed": seed}, "out": path})
        return self._read(), np.load(path)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self._send({"cmd": "quit"})
                self.proc.wait(timeout=30)
            except Exception:
                self.proc.kill()
        self._log.close()
        self._dir.cleanup()


if __name__ == "__main__":
    sys.exit(worker_main())
