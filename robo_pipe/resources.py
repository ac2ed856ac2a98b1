"""What is held open until closed: a device connection, a batched simulator's threads."""

from __future__ import annotations

import abc
from typing import Self


class Resource(abc.ABC):
    """Something held open until :meth:`close`; a ``with`` block closes it on the way out,
    whatever happened inside."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release what it holds; it is unusable afterwards."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
