"""The position-scheme contract, enforced where a plugin could break it silently.

A scheme whose hooks are misnamed would otherwise train with no positions at all (exactly like
`none`), and a hook that returns the wrong shape would fail deep inside the attention kernels with
a traceback naming neither the plugin nor the argument. So:

- `check_scheme`, when the model config is validated (every model build; it builds the attention
  modules of only the kinds of layer the model has, causal, bidirectional or both): the scheme must
  contribute something — an embedding module, or an attention module that overrides `rotate`,
  `attention_kwargs` or `content_bias` — unless it declares `contributes_nothing` (as `none` does);
- `check_rotate`, `check_attention_kwargs`, `check_content_bias`, `check_embedding`, on a module's
  first call (the core then stops asking, so training pays nothing): what the hook returned,
  against what `relative_attention` accepts.

Every error is a ContractError of one line naming the scheme, its class, the hook and, for a bad
value, the argument, the expected and the actual shape.
"""
from __future__ import annotations

import difflib
import inspect

import torch
from torch import Tensor, nn

from relpos_lab.core.attention import relative_attention
from relpos_lab.core.errors import ContractError
from relpos_lab.core.positions.base import KeyState, PositionConfig, PositionScheme, RelativePositions

CORE_KEYS = ("attn_mask", "is_causal", "query_offset", "dropout_p", "impl")
"""relative_attention's keywords that the core itself passes; a scheme may return any other."""


ATTENTION_HOOKS = ("rotate", "attention_kwargs", "content_bias")
SCHEME_HOOKS = ("embedding", "attention")


def scheme_label(cfg: PositionConfig) -> str:
    """How errors name a scheme: its name and its class."""
    cls = type(cfg).scheme_class
    where = f"{cls.__module__}.{cls.__qualname__}" if cls is not None else type(cfg).__qualname__
    return f"position scheme '{cfg.scheme}' ({where})"


def scheme_keys() -> tuple[str, ...]:
    """What `attention_kwargs` may return: relative_attention's keyword-only parameters that the
    core does not pass itself, read from its signature (a new one is valid as soon as it is there)."""
    return tuple(name for name, p in inspect.signature(relative_attention).parameters.items()
                 if p.kind is p.KEYWORD_ONLY and name not in CORE_KEYS)


def check_scheme(position_scheme: PositionScheme, d_model: int, n_heads: int,
                 causal: tuple[bool, ...] = (False, True)) -> None:
    """Refuse a scheme that would add no positions without saying so (a misnamed hook). `causal`:
    the kinds of self-attention layer the model has (ModelConfig.self_attention_causal), the only
    ones built here."""
    if position_scheme.contributes_nothing:
        return
    name = scheme_label(position_scheme.cfg)
    with torch.random.fork_rng(devices=[]):  # building the modules here must not shift the model's init
        embedding = position_scheme.embedding(d_model)
        modules = [position_scheme.attention(d_model // n_heads, n_heads, kind) for kind in causal]
    if embedding is not None and (not isinstance(embedding, nn.Module)
                                  or type(embedding).forward is nn.Module.forward):
        raise ContractError(f"{name}: embedding() returned {type(embedding).__qualname__}, which is not a module "
                            "with forward(x, offset) -> x + positions")
    for module in modules:
        if module is None:
            continue
        if not isinstance(module, RelativePositions):
            raise ContractError(f"{name}: attention() returned {type(module).__qualname__}; it must return a "
                                "relpos_lab.api.RelativePositions (or None)")
        if not _overrides(type(module), RelativePositions, ATTENTION_HOOKS):
            raise ContractError(f"{name}: attention() returned {type(module).__qualname__}, which overrides none of "
                                f"{', '.join(ATTENTION_HOOKS)}, so it adds no positions"
                                f"{_near_misses(type(module), RelativePositions, ATTENTION_HOOKS)}")
    if embedding is None and all(module is None for module in modules):
        near_misses = _near_misses(type(position_scheme), PositionScheme, SCHEME_HOOKS)
        raise ContractError(f"{name} adds no positions: embedding() and attention() return None{near_misses}; "
                            "define embedding(d_model) or attention(head_dim, n_heads, causal), or set "
                            "contributes_nothing = True on the class if it means to (as 'none' does)")


def check_rotate(name: str, module: RelativePositions, out, q: Tensor, k: Tensor) -> None:
    """`rotate` must return (q, k) with the shapes it was given, except that both may change their
    last dimension together (PoPE's real form of D complex numbers is 2D wide)."""
    hook = f"{type(module).__qualname__}.rotate"
    if not (isinstance(out, tuple) and len(out) == 2 and all(isinstance(t, Tensor) for t in out)):
        raise ContractError(f"{name}: {hook} returned {_kind(out)}; expected a tuple (q, k) of tensors")
    widths_agree = out[0].shape[-1] == out[1].shape[-1]
    for arg, got, given in (("q", out[0], q), ("k", out[1], k)):
        if got.shape != given.shape and not (widths_agree and got.shape[:-1] == given.shape[:-1]):
            raise ContractError(f"{name}: {hook} returned {arg} of shape {tuple(got.shape)}; "
                                f"expected the shape it was given, {tuple(given.shape)} (q and k may only change "
                                "their last dimension, together)")


def check_attention_kwargs(name: str, module: RelativePositions, kwargs, q: Tensor, k: Tensor) -> None:
    """`attention_kwargs` must return keywords of relative_attention, each of its documented shape."""
    hook, keys = f"{type(module).__qualname__}.attention_kwargs", scheme_keys()
    if not isinstance(kwargs, dict):
        raise ContractError(f"{name}: {hook} returned {_kind(kwargs)}; expected a dict of relative_attention "
                            f"keywords ({', '.join(keys)})")
    for key in kwargs:
        if key not in keys:
            close = difflib.get_close_matches(str(key), keys, n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            owner = "the core sets it itself; " if key in CORE_KEYS else ""
            raise ContractError(f"{name}: {hook} returned unknown key {key!r}; {owner}{hint}"
                                f"relative_attention takes {', '.join(keys)}")
    max_distance = kwargs.get("max_distance", 0)
    if not isinstance(max_distance, int) or isinstance(max_distance, bool) or max_distance < 0:
        raise ContractError(f"{name}: {hook} returned max_distance={max_distance!r}; expected an int >= 0")
    (b, h, lq, d), lk, rows = q.shape, k.shape[-2], 2 * max_distance + 1
    expected = {
        "rel_k": [(rows, d), (h, rows, d)],
        "rel_v": [(rows, d), (h, rows, d)],
        "rel_bias": [(h, rows)],
    }
    for key, value in kwargs.items():
        if key == "max_distance" or value is None:
            continue
        if not isinstance(value, Tensor):
            raise ContractError(f"{name}: {hook} returned {key} as {_kind(value)}; expected a tensor or None")
        shape = tuple(value.shape)
        if key == "attn_bias":
            if not _broadcasts(shape, (b, h, lq, lk)):
                raise ContractError(f"{name}: {hook} returned attn_bias of shape {shape}; expected a shape "
                                    f"broadcastable to (B, H, Lq, Lk) = {(b, h, lq, lk)}")
            if not value.is_floating_point():
                raise ContractError(f"{name}: {hook} returned attn_bias of dtype {value.dtype}; "
                                    "expected a float tensor")
        elif key in expected and shape not in expected[key]:
            wanted = " or ".join(str(s) for s in expected[key])
            raise ContractError(f"{name}: {hook} returned {key} of shape {shape}; expected {wanted} "
                                f"for max_distance={max_distance} (head dim {d}, {h} heads)")


def has_content_bias(module: RelativePositions) -> bool:
    """Whether the core must call the module's `content_bias` (only modules that override it)."""
    return _overrides(type(module), RelativePositions, ("content_bias",))


def check_content_bias(name: str, module: RelativePositions, bias, q: Tensor, k: Tensor, state: KeyState) -> None:
    """`content_bias` returns a float tensor broadcastable to (B, H, Lq, Lk); what it keeps in the
    KeyState is one entry per key, (B, H, Lk, ...)."""
    hook, (b, h, lq, _), lk = f"{type(module).__qualname__}.content_bias", q.shape, k.shape[-2]
    if not isinstance(bias, Tensor):
        raise ContractError(f"{name}: {hook} returned {_kind(bias)}; expected a float tensor broadcastable to "
                            f"(B, H, Lq, Lk) = {(b, h, lq, lk)}")
    if not _broadcasts(tuple(bias.shape), (b, h, lq, lk)):
        raise ContractError(f"{name}: {hook} returned a bias of shape {tuple(bias.shape)}; expected a shape "
                            f"broadcastable to (B, H, Lq, Lk) = {(b, h, lq, lk)}")
    if not bias.is_floating_point():
        raise ContractError(f"{name}: {hook} returned a bias of dtype {bias.dtype}; expected a float tensor")
    kept = state.value
    if kept is not None and (kept.dim() < 3 or kept.shape[0] != b or kept.shape[2] != lk):
        raise ContractError(f"{name}: {hook} left a KeyState of shape {tuple(kept.shape)}; expected one entry per "
                            f"key, (B, H, Lk, ...) with B = {b}, Lk = {lk}: append the new positions' part only")


def check_embedding(name: str, module: nn.Module, out, x: Tensor) -> None:
    """An embedding module returns x with its positions added: x's shape."""
    hook = f"{type(module).__qualname__}.forward"
    if not isinstance(out, Tensor) or out.shape != x.shape:
        got = f"shape {tuple(out.shape)}" if isinstance(out, Tensor) else _kind(out)
        raise ContractError(f"{name}: {hook} (the embedding) returned {got}; expected x + positions, "
                            f"of x's shape (B, L, d_model) = {tuple(x.shape)}")


def _overrides(cls: type, base: type, hooks: tuple[str, ...]) -> bool:
    return any(getattr(cls, hook, None) is not getattr(base, hook) for hook in hooks)


def _near_misses(cls: type, base: type, hooks: tuple[str, ...]) -> str:
    """'; it defines attention_kwarg(): did you mean attention_kwargs()?' for a misnamed hook."""
    own = [n for n in dir(cls) if not n.startswith("_") and not hasattr(base, n) and callable(getattr(cls, n))]
    misses = [f"{n}() (did you mean {close[0]}()?)"
              for n in own for close in [difflib.get_close_matches(n, hooks, n=1, cutoff=0.5)] if close]
    return f"; {cls.__qualname__} defines {', '.join(misses)}" if misses else ""


def _broadcasts(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    if len(shape) > len(target):
        return False
    return all(s in (1, t) for s, t in zip(reversed(shape), reversed(target)))


def _kind(value) -> str:
    return f"a {type(value).__qualname__}" if value is not None else "None"
