"""A pipeline's weight bytes per component, read from its safetensors headers BEFORE loading (so the loader decides
placement before a byte of weights is read), and the same record from a loaded pipeline. Bytes are scaled to the load
dtype as the libraries will; a Hub id is read only from the local Hub cache, never over the network."""

from __future__ import annotations

import importlib
import json
import re
import struct
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path

import torch

from studio.engine.streams import tensor_bytes
from studio.measure.blocks import block_names

# safetensors dtype names -> bytes per element (https://github.com/huggingface/safetensors, format)
ST_BYTES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1,
    "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1,
}  # fmt: skip
ST_FLOAT = ("F64", "F32", "F16", "BF16")  # what from_pretrained(dtype=...) casts
HEADER_CAP = 100 * 2**20  # a header longer than this is not a safetensors header
_BLOCK = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\.(\d+)\.")  # "<ModuleList>.<i>." at the top: a block (measure.blocks)


@dataclass(frozen=True)
class ModelSizes:
    """Weight bytes per component (the load dtype), the transformer's blocks apart, and where they came from."""

    components: dict  # component name -> bytes of its parameters
    blocks: dict  # "transformer_blocks.0" -> bytes: the transformer's repeated blocks (top-level ModuleList items)
    source: str  # "safetensors headers" | "the loaded modules"
    configs: dict = field(default_factory=dict)  # "vae" / "transformer" -> its config dict (activation estimate)

    @property
    def total(self) -> int:
        return sum(self.components.values())

    @property
    def largest_block(self) -> int:
        return max(self.blocks.values(), default=self.components.get("transformer", 0))

    @property
    def block_total(self) -> int:
        return sum(self.blocks.values()) if self.blocks else self.components.get("transformer", 0)


def _header(path: Path) -> dict:
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        if n > HEADER_CAP:
            raise ValueError(f"{path}: header of {n} bytes is not a safetensors header")
        head = json.loads(f.read(n))
    head.pop("__metadata__", None)
    return head


def _weight_files(folder: Path) -> list[Path]:
    """The safetensors files of one component folder: the shards an index names, else every *.safetensors."""
    indexes = sorted(folder.glob("*.safetensors.index.json"))
    if indexes:
        shards = set(json.loads(indexes[0].read_text()).get("weight_map", {}).values())
        return [folder / s for s in sorted(shards)]
    return sorted(folder.glob("*.safetensors"))


def _keep_fp32(library: str, cls_name: str, dtype: torch.dtype) -> tuple[str, ...]:
    """The module names `library.cls_name` keeps in float32 when loaded in `dtype` (diffusers always; transformers
    under float16, or also bfloat16 for `_keep_in_fp32_modules_strict`)."""
    try:
        cls = getattr(importlib.import_module(library), cls_name)
    except (ImportError, AttributeError):
        return ()  # an unknown class cannot load either: from_pretrained will say so
    keep = list(getattr(cls, "_keep_in_fp32_modules", None) or [])
    if library == "transformers":
        strict = list(getattr(cls, "_keep_in_fp32_modules_strict", None) or [])
        keep = (keep if dtype == torch.float16 else []) + (strict if dtype in (torch.float16, torch.bfloat16) else [])
    return tuple(keep)


def _tensor_bytes(name: str, info: dict, load_bytes: int, keep: tuple[str, ...]) -> int:
    n = 1
    for d in info["shape"]:
        n *= d
    if info["dtype"] not in ST_FLOAT:
        return n * ST_BYTES[info["dtype"]]
    return n * (4 if keep and any(k in name.split(".") for k in keep) else load_bytes)


def _component(folder: Path, library: str, cls_name: str, dtype: torch.dtype) -> tuple[int, dict]:
    """(bytes, {block name: bytes}) of one component folder in `dtype`."""
    files = _weight_files(folder)
    if not files:
        raise FileNotFoundError(f"{folder.name}: no *.safetensors (the loader reads safetensors only)")
    keep = _keep_fp32(library, cls_name, dtype)
    size = torch.empty((), dtype=dtype).element_size()
    total, blocks = 0, {}
    for path in files:
        for name, info in _header(path).items():
            b = _tensor_bytes(name, info, size, keep)
            total += b
            m = _BLOCK.match(name)
            if m:
                key = f"{m.group(1)}.{m.group(2)}"
                blocks[key] = blocks.get(key, 0) + b
    return total, blocks


def local_folder(source: str) -> tuple[Path | None, str | None]:
    """(the folder holding `source`'s files, None) or (None, why it cannot be read before loading)."""
    path = Path(source).expanduser()
    if path.is_dir():
        return path, None
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(source, local_files_only=True)), None
    except (LocalEntryNotFoundError, OSError, ValueError) as e:
        why = f"{source} is not in the local Hub cache ({type(e).__name__}); no headers are read over the network"
        return None, why


def read_sizes(source: str, dtype: torch.dtype) -> tuple[ModelSizes | None, str | None]:
    """(`source`'s sizes in `dtype`, None) from its files, without loading weights; or (None, why not). Parameters
    only: unsaved buffers are not in the files, and a loaded pipeline's parameters sum to exactly this."""
    folder, why = local_folder(source)
    if folder is None:
        return None, why
    try:
        index = json.loads((folder / "model_index.json").read_text())
    except (OSError, ValueError) as e:
        return None, f"no readable model_index.json in {folder} ({type(e).__name__})"
    components, blocks, configs = {}, {}, {}
    for name, entry in index.items():
        if name.startswith("_") or not isinstance(entry, list) or len(entry) != 2 or None in entry:
            continue
        sub = folder / name
        if not (sub / "config.json").is_file():
            continue  # a tokenizer, a scheduler: no weights
        try:
            components[name], found = _component(sub, entry[0], entry[1], dtype)
            configs[name] = json.loads((sub / "config.json").read_text())
        except (OSError, ValueError, KeyError, struct.error) as e:
            return None, f"{name}: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        if name == "transformer":
            blocks = found
    return ModelSizes(components, blocks, "safetensors headers", configs), None


def sizes_of_pipe(pipe) -> ModelSizes:
    """The same record from a loaded pipeline's parameters (quantized ones by their inner tensors)."""
    comps = {n: c for n, c in pipe.components.items() if isinstance(c, torch.nn.Module)}
    components = {n: sum(tensor_bytes(p) for p in c.parameters()) for n, c in comps.items()}
    tr = comps.get("transformer")
    blocks = _blocks_of(tr) if tr is not None else {}
    configs = {n: dict(c.config) for n, c in comps.items() if isinstance(getattr(c, "config", None), dict)}
    return ModelSizes(components, blocks, "the loaded modules", configs)


def _blocks_of(tr) -> dict:
    return {b: sum(tensor_bytes(p) for p in tr.get_submodule(b).parameters()) for b in block_names(tr)}


def device_bytes_of(module, device: torch.device) -> int:
    """Bytes of a module's tensors on `device`'s kind now (what moving it off gives back)."""
    ts = list(module.parameters()) + list(module.buffers())
    return sum(tensor_bytes(t) for t in ts if t.device.type == device.type)


def incoming_sizes(cur, key: tuple | None) -> ModelSizes:
    """The loaded pipeline's sizes (`cur`: engine.loader.Loaded) with the transformer of weight set `key` (dtype,
    quantization, fused LoRAs) in it: its own module's where it is loaded, else read from its configs in its dtype
    and form (8-bit Linear weights); the loaded one's where the configs cannot be read, said in `source`."""
    sizes = sizes_of_pipe(cur.pipe)
    if key is None or key == cur.active:
        return sizes
    if key in cur.variants:
        tr = cur.variants[key].transformer
        total, blocks = sum(tensor_bytes(p) for p in tr.parameters()), _blocks_of(tr)
    else:
        folder, why = local_folder(cur.source)
        if folder is None:
            return replace(sizes, source=f"{sizes.source}; the incoming weights sized as the loaded ones ({why})")
        quant = key[1]
        est = sizes_from_configs(
            folder, cur.dtype.torch, quant.exclude_layers if quant.enabled else None, ("transformer",)
        )
        total, blocks = est.components.get("transformer", 0), est.blocks
    return replace(sizes, components={**sizes.components, "transformer": total}, blocks=blocks)


QUANT_BYTES = 1  # an 8-bit form's weight element; each quantized row also keeps a float32 scale
SCALE_BYTES = 4


def sizes_from_configs(
    folder: Path, dtype: torch.dtype, quantized: tuple[str, ...] | None = None, only: tuple[str, ...] | None = None
) -> ModelSizes:
    """The same record from a pipeline's configs alone, on the meta device (no weights: `plan` works offline).
    `quantized`: the transformer's Linear weights counted 8-bit, except names containing any of these strings;
    `only`: these components (None: every one)."""
    index = json.loads((folder / "model_index.json").read_text())
    size = torch.empty((), dtype=dtype).element_size()
    components, blocks, configs = {}, {}, {}
    for name, entry in index.items():
        if name.startswith("_") or not isinstance(entry, list) or None in entry or len(entry) != 2:
            continue
        if not (folder / name / "config.json").is_file() or name.startswith("scheduler"):
            continue
        if only is not None and name not in only:
            continue
        keep = _keep_fp32(entry[0], entry[1], dtype)
        total = 0
        for t in _meta_tensors(str(folder / name), entry[0], entry[1]):
            if quantized is not None and name == "transformer" and t.rows and not any(x in t.name for x in quantized):
                b = t.numel * QUANT_BYTES + t.rows * SCALE_BYTES
            else:
                b = t.numel * (4 if keep and any(k in t.name.split(".") for k in keep) else size)
            total += b
            m = _BLOCK.match(t.name)
            if name == "transformer" and m:
                blocks[f"{m.group(1)}.{m.group(2)}"] = blocks.get(f"{m.group(1)}.{m.group(2)}", 0) + b
        components[name] = total
        configs[name] = json.loads((folder / name / "config.json").read_text())
    return ModelSizes(components, blocks, "configs on the meta device", configs)


@dataclass(frozen=True)
class MetaTensor:
    name: str
    numel: int
    rows: int  # a Linear layer's weight: its rows (out_features), each with a scale when quantized; else 0


@lru_cache(maxsize=16)
def _meta_tensors(folder: str, library: str, cls_name: str) -> tuple[MetaTensor, ...]:
    """The tensors a component's checkpoint holds (tied ones once), built from its config on the meta device."""
    from accelerate import init_empty_weights

    cls = getattr(importlib.import_module(library), cls_name)
    with init_empty_weights():
        if library == "diffusers":
            module = cls.from_config(json.loads((Path(folder) / "config.json").read_text()))
        else:
            from transformers import AutoConfig

            module = cls._from_config(AutoConfig.from_pretrained(folder))
            module.tie_weights()  # init_empty_weights leaves tied embeddings apart (T5: +131.6M counted twice)
    rows = {f"{n}.weight": m.out_features for n, m in module.named_modules() if isinstance(m, torch.nn.Linear)}
    seen, out = set(), []
    for name, t in module.state_dict(keep_vars=True).items():
        if id(t) not in seen:
            seen.add(id(t))
            out.append(MetaTensor(name, t.numel(), rows.get(name, 0)))
    return tuple(out)
