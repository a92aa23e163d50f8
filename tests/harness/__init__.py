"""Reusable test harnesses: `kernel` drives a kernel headlessly, `lab` drives JupyterLab in Chromium.

`lab` is not imported here so kernel-only tests do not pay for importing playwright.
"""

from .kernel import (
    ExecResult,
    HarnessError,
    KernelSession,
    WidgetModel,
    start_kernel,
    wait_until,
)

__all__ = [
    "ExecResult",
    "HarnessError",
    "KernelSession",
    "WidgetModel",
    "start_kernel",
    "wait_until",
]
