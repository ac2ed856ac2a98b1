"""The expert demo: the scripted expert playing seeded episodes, measured and filmed (see
:mod:`stages.demo.run`)."""

from typing import TYPE_CHECKING

from stages import lazy_exports

if TYPE_CHECKING:
    from stages.demo.config import DemoConfig
    from stages.demo.run import DemoReport, run_demo

__all__ = ["DemoConfig", "DemoReport", "run_demo"]
__getattr__ = lazy_exports(
    __name__,
    {
        "stages.demo.config": ("DemoConfig",),
        "stages.demo.run": ("DemoReport", "run_demo"),
    },
)
