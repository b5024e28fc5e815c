"""spec: validated records (request, preset with cache-dit's own field names, model profiles) and their files.

The bottom of the house: imports nothing else from the studio.
"""

from studio.spec.checks import ConfigError, parse_switch
from studio.spec.errors import ModelLoadError, RunError
from studio.spec.offload import OffloadSpec
from studio.spec.preset import MIN_CACHE_STEPS, CacheSpec, CompileSpec, Preset, QuantSpec
from studio.spec.presets import PresetLibrary, load_preset, preset_from_text, preset_to_yaml
from studio.spec.profiles import EMBEDDED_DIR, ModelProfile, profile_for, resolve_model
from studio.spec.request import GenerationRequest

__all__ = [
    "MIN_CACHE_STEPS",
    "EMBEDDED_DIR",
    "CacheSpec",
    "CompileSpec",
    "ConfigError",
    "GenerationRequest",
    "ModelLoadError",
    "ModelProfile",
    "Preset",
    "PresetLibrary",
    "QuantSpec",
    "OffloadSpec",
    "RunError",
    "load_preset",
    "parse_switch",
    "preset_from_text",
    "preset_to_yaml",
    "profile_for",
    "resolve_model",
]
