"""One-line, typed delegation from the ``Store`` facade to the repository that owns a method.

Why a descriptor and not ``__getattr__``: each delegated name is written out in the facade,
grouped by repository, so a reader (and mypy) sees which part answers ``store.get_object``;
the facade keeps the signature and docstring of the repository's method without restating it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


class Via(Generic[T, P, R]):
    """``name = Via("objects", ObjectRepository.get_object)``: ``store.name(...)`` calls
    ``store.objects.get_object(...)``."""

    def __init__(self, part: str, method: Callable[Concatenate[T, P], R]) -> None:
        self.part = part
        self.method = method
        self.__doc__ = method.__doc__

    @overload
    def __get__(self, obj: None, owner: type[Any]) -> Via[T, P, R]: ...

    @overload
    def __get__(self, obj: object, owner: type[Any]) -> Callable[P, R]: ...

    def __get__(self, obj: object | None, owner: type[Any]) -> Via[T, P, R] | Callable[P, R]:
        if obj is None:
            return self
        bound: Callable[P, R] = getattr(getattr(obj, self.part), self.method.__name__)
        return bound
