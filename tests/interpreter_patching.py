"""Triton's interpreter, patched once per kernel launch instead of once per helper call.

Triton 3.6's interpreter points triton.language at its numpy implementation when a kernel is
launched (`GridExecutor.__call__`), and again on every call of a `@triton.jit` helper from inside
the kernel (`InterpretedFunction.__call__`), although the launch has patched the same modules
until it ends. The fused kernels call small helpers per tile, so the repeats were about a third
of an interpreted test (`python -m cProfile`: 14,069 `_patch_builtin` calls, 3.4 of 11 s in
test_triton_kernel.py's causal case). Here a helper whose module the running launch has already
patched is called without patching it again; anything else (another module's helper, a call
outside a launch, another Triton whose internals differ) takes Triton's own path.
"""
from __future__ import annotations


def patch_once_per_launch() -> bool:
    """Install the shortcut; False (and nothing changed) where this Triton lacks the internals."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    names = ("_patch_lang", "_LangPatchScope", "GridExecutor", "InterpretedFunction")
    if not all(hasattr(interpreter, name) for name in names) or getattr(interpreter, "_relpos_lab_once", False):
        return False
    patch_lang, launch = interpreter._patch_lang, interpreter.GridExecutor.__call__
    patched: list[set] = []  # per running launch: ids of the module globals already patched

    def _patch_lang(fn):
        if patched and id(fn.__globals__) in patched[-1]:
            return interpreter._LangPatchScope()  # nothing to undo: the launch's own scope restores
        scope = patch_lang(fn)
        if patched:
            patched[-1].add(id(fn.__globals__))
        return scope

    def __call__(self, *args, **kwargs):
        patched.append(set())
        try:
            return launch(self, *args, **kwargs)
        finally:
            patched.pop()

    interpreter._patch_lang = _patch_lang
    interpreter.GridExecutor.__call__ = __call__
    interpreter._relpos_lab_once = True
    return True
