"""A preset of the runner's library under the per-request switches, resolved once as the Ask does (spec.ask.Switches):
Runner.generate takes the stack as it is."""

from studio.spec.ask import Switches


def stack(runner, name, cache=None, threshold=None, compile=None):
    return Switches(cache, threshold, compile).apply(runner.resolve_preset(name))
