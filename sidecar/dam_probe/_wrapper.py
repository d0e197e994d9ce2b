"""What every probe wrapper carries: the original's name, qualified name and docstring, the
original itself (``__wrapped__``) and the probe's mark, which says it is already wrapped (so that
a second install wraps nothing twice). Standard library only."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def dress(wrapper: Callable[..., Any], orig: Any, mark: str, value: Any = True) -> None:
    """Give ``wrapper`` the names and docstring of ``orig`` (its own name where ``orig`` has none),
    ``__wrapped__ = orig`` and the attribute ``mark`` set to ``value``."""
    own = wrapper.__name__
    wrapper.__name__ = getattr(orig, "__name__", own)
    wrapper.__qualname__ = getattr(orig, "__qualname__", own)
    wrapper.__doc__ = getattr(orig, "__doc__", None)
    wrapper.__wrapped__ = orig  # type: ignore[attr-defined]
    setattr(wrapper, mark, value)
