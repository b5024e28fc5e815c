"""spec: validated records (request, preset, model profiles) and their files; imports nothing else from the studio."""

from studio.spec.checks import ConfigError, parse_switch
from studio.spec.errors import ModelLoadError, RunError
from studio.spec.preset import CacheSpec, CompileSpec, Preset, QuantSpec
from studio.spec.presets import PresetLibrary
from studio.spec.profiles import EMBEDDED_DIR, ModelProfile
from studio.spec.request import GenerationRequest

__all__ = [
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
    "RunError",
    "parse_switch",
]
