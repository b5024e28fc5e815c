"""python -m lab COMMAND [ARGS]: each command is a module of the lab with its own `main(argv)`."""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "train": ("lab.tiny.train", "train the embedded model from scratch (docs/tiny-model.md)"),
    "eval": ("lab.tiny.eval", "the embedded model's adherence and fewer-steps evaluation"),
    "lora": ("lab.tiny.lora", "the embedded model's example LoRAs: train, sheet, numbers (docs/lora.md)"),
    "soak": ("lab.soak", "the app in public mode on loopback, driven by honest and hostile visitors (docs/deploy.md)"),
    "busy": ("lab.busy", "quiet readings, then with a CPU-bound load beside them: honest or flagged?"),
    "clicks": ("lab.clicks", "what a Generate click costs through a running app, per compare mode"),
    "regimes": ("lab.regimes.table", "memory regimes x stacks on a transformer of real size (docs/memory.md)"),
    "kernels": ("lab.regimes.kernels", "the non-cache kernels on a FLUX.1-dev-sized transformer (GPU)"),
    "processes": ("lab.processes", "a bench's compiled rows in fresh processes: how far apart they read"),
}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        width = max(map(len, COMMANDS))
        lines = [f"  {name:<{width}}  {what}" for name, (_, what) in COMMANDS.items()]
        print("usage: python -m lab COMMAND [ARGS]\n\ncommands:\n" + "\n".join(lines), file=sys.stderr)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    module = importlib.import_module(COMMANDS[argv[0]][0])
    return module.main(argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
