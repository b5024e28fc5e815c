"""The memory regime of a preset (`offload_config`): where the weights live between uses. Policies: none; diffusers'
model_cpu_offload (each component on the device for its turn) and block-level group_offload; cache-dit's
layerwise_offload (blocks prefetched `transfer_buckets` ahead on copy streams); auto (the fastest that fits the
device's free memory). `encoders_by_use`: the text encoders wait on the host and come to the device only to encode
the prompt, beside a resident or streamed transformer (placement by use: the encoders of FLUX or Qwen-Image are as
large as a small card's room for the transformer). `vae_tiling` / `vae_slicing` are diffusers' VAE switches."""

from __future__ import annotations

from dataclasses import dataclass

from studio.spec.checks import ConfigError, Record, check_bool, check_choice, check_int

OFFLOAD_POLICIES = ("none", "model_cpu_offload", "layerwise_offload", "group_offload", "auto")
# The order `auto` tries them in: fastest first (measured ranking on a 24 GB card: resident > layerwise with
# prefetch > group offload with streams > model offload, which streams whole components); each regime with the text
# encoders resident, then by use (one copy of them a request, against copies of the transformer every step).
AUTO_ORDER = ("none", "layerwise_offload", "group_offload", "model_cpu_offload")
BY_USE = ("none", "layerwise_offload", "group_offload")  # the regimes the text encoders may wait beside
AUTO_CANDIDATES = tuple((p, by_use) for p in AUTO_ORDER for by_use in ((False, True) if p in BY_USE else (False,)))


def regime_name(policy: str, encoders_by_use: bool) -> str:
    """A regime's name in `needs` and the records: the policy, `+encoders` where the text encoders wait on the
    host."""
    return policy + ("+encoders" if encoders_by_use else "")


@dataclass(frozen=True)
class OffloadSpec(Record):
    policy: str = "none"
    transfer_buckets: int = 1  # cache-dit: how many blocks ahead are prefetched (the table's "prefetch 1")
    async_transfer: bool = True  # cache-dit: copies on their own CUDA streams (CUDA only; synchronous elsewhere)
    num_blocks_per_group: int = 1  # diffusers group offload
    use_stream: bool = True  # diffusers group offload: prefetch on a CUDA stream (CUDA only)
    vae_tiling: bool = False
    vae_slicing: bool = False
    encoders_by_use: bool = False  # the text encoders on the device only while they encode (module doc)

    def __post_init__(self):
        check_choice("offload_config", "policy", self.policy, OFFLOAD_POLICIES)
        check_bool("offload_config", "encoders_by_use", self.encoders_by_use)
        if self.encoders_by_use and self.policy not in BY_USE:
            raise ConfigError(
                f"offload_config.encoders_by_use=true with policy {self.policy}: "
                + (
                    "auto decides where the encoders wait; drop encoders_by_use"
                    if self.policy == "auto"
                    else "model_cpu_offload moves every component for its turn already; drop encoders_by_use"
                )
            )
        check_int("offload_config", "transfer_buckets", self.transfer_buckets, lo=1, hi=8)
        check_int("offload_config", "num_blocks_per_group", self.num_blocks_per_group, lo=1, hi=64)
        for name in ("async_transfer", "use_stream", "vae_tiling", "vae_slicing"):
            check_bool("offload_config", name, getattr(self, name))

    @property
    def enabled(self) -> bool:
        return self.policy != "none" or self.vae_tiling or self.vae_slicing or self.encoders_by_use

    def label(self) -> str:
        short = {
            "model_cpu_offload": "modeloff",
            "layerwise_offload": f"layerwise{self.transfer_buckets}",
            "group_offload": f"group{self.num_blocks_per_group}",
            "auto": "offload-auto",
        }
        parts = [short[self.policy]] if self.policy != "none" else []
        parts += [n for n, on in (("encbyuse", self.encoders_by_use), ("vaetile", self.vae_tiling)) if on]
        parts += ["vaeslice"] if self.vae_slicing else []
        return "+".join(parts)
