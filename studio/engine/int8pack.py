"""Keep torch.compile's INT8 weight-only matmuls off the CPU kernel that crashes on them (docs/known-crashes.md):
Inductor rewrites bfloat16 x int8 matmuls on the CPU to `aten._weight_int8pack_mm`, whose aligned loads with no tail
segfault when K is not a multiple of 16. One graph pass converts those weights int8 -> float32 -> bfloat16 (exact),
which the rewrite's pattern does not match; every other op is lowered as before."""

from __future__ import annotations

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files

# The widest K step of the kernel's vector paths (AVX512 16; AVX2 and NEON 8). A scalar-only build steps by one and
# is safe, but gains nothing that the handful of matmuls this keeps off it would lose.
K_MULTIPLE = 16
_WALK = ("permute", "expand")  # what the rewrite's patterns allow between the weight's conversion and the matmul


def at_risk_layers(transformer) -> list[str]:
    """Names of the transformer's INT8 weight-only Linear layers that the CPU kernel would crash on under compile."""
    from torchao.quantization import Int8Tensor

    names = []
    for name, m in transformer.named_modules():
        w = getattr(m, "weight", None)
        if not (isinstance(m, torch.nn.Linear) and isinstance(w, Int8Tensor)):
            continue
        weight_only = getattr(w, "act_quant_kwargs", None) is None  # dynamic activation goes to _int_mm instead
        if weight_only and w.dtype == torch.bfloat16 and w.device.type == "cpu" and m.in_features % K_MULTIPLE:
            names.append(name)
    return names


def _weight_conversion(node):
    """The int8 -> bfloat16 conversion feeding matmul operand `node` through views, or None."""
    for _ in range(4):
        if node.op != "call_function":
            return None
        if node.target is torch.ops.prims.convert_element_type.default:
            return node
        if getattr(node.target, "__name__", "").split(".")[0] not in _WALK:
            return None
        node = node.args[0]
    return None


def _needs_rewrite(mm, conv) -> bool:
    src, w = conv.args[0].meta.get("val"), mm.args[1].meta.get("val")
    if src is None or w is None or src.dtype != torch.int8 or conv.args[1] != torch.bfloat16:
        return False
    k = w.shape[-2]  # the weight operand is (K, N), or (B, K, N) for bmm
    return src.device.type == "cpu" and (not isinstance(k, int) or k % K_MULTIPLE != 0)


def _convert_via_float32(graph, conv) -> None:
    src = conv.args[0]
    with graph.inserting_before(conv):
        up = graph.call_function(torch.ops.prims.convert_element_type.default, (src, torch.float32))
    up.meta["val"] = src.meta["val"].to(torch.float32)
    conv.args = (up, *conv.args[1:])


class KeepOffInt8PackMM(CustomGraphPass):
    """Inductor post-grad pre-pass: the at-risk matmuls' weights are converted via float32."""

    def __init__(self):
        self.rewritten = 0  # matmuls changed so far in this process (graphs from Inductor's cache are not counted)

    def __call__(self, graph: torch.fx.Graph) -> None:
        mms = (torch.ops.aten.mm.default, torch.ops.aten.bmm.default)
        for mm in [n for n in graph.nodes if n.op == "call_function" and n.target in mms]:
            conv = _weight_conversion(mm.args[1])
            if conv is not None and _needs_rewrite(mm, conv):
                _convert_via_float32(graph, conv)
                self.rewritten += 1

    def uuid(self):
        return get_hash_for_files((__file__,))


GUARD = KeepOffInt8PackMM()


def compile_options(mode: str = "default") -> dict:
    """torch.compile `options` for `mode` with the pass added (torch.compile takes a mode or options, not both)."""
    import torch._inductor
    import torch._inductor.config as inductor_config

    options = dict(torch._inductor.list_mode_options(mode))
    theirs = inductor_config.post_grad_custom_pre_pass  # someone else's pass in the process-wide config stays
    passes = list(theirs) if isinstance(theirs, (list, tuple)) else [theirs] if theirs is not None else []
    options["post_grad_custom_pre_pass"] = [*passes, GUARD] if passes else GUARD
    return options
