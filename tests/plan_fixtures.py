"""Synthetic profiles for the planner's tests (shape of a GPT: embedding, blocks, head)."""

from stagewise.plan.search import LayerProfile, Link, Profile


def layer(symbol, t_f, param_bytes, act, io, sizes=(1, 2)):
    """A layer whose time and activations scale with the micro-batch size."""
    return LayerProfile(
        name=symbol, symbol=symbol, param_bytes=param_bytes,
        t_f=tuple(t_f * b for b in sizes), t_b=tuple(2 * t_f * b for b in sizes),
        t_i=tuple(t_f * b for b in sizes), t_w=tuple(t_f * b for b in sizes),
        activation_bytes=tuple(act * b for b in sizes), input_bytes=tuple(io * b for b in sizes),
        output_bytes=tuple(io * b for b in sizes))


def gpt_profile(blocks=8, embed=0.5, head=3.0, sizes=(1, 2), link=True, params=1e6, io=1e4):
    """E, t*blocks, H; times in ms-like units, a heavy head by default."""
    layers = [layer("E", embed, 4 * params, 1e5, io, sizes)]
    layers += [layer("t", 1.0, params, 1e6, io, sizes) for _ in range(blocks)]
    layers += [layer("H", head, 4 * params, 2e6, io, sizes)]
    lk = Link(latency=0.01, bandwidth=1e6) if link else None
    return Profile(model="synthetic", device="none", micro_batch_sizes=tuple(sizes), layers=tuple(layers), link=lk)
