"""Orchestrator adapters by name. A pool names its adapter (``worker_pools.orchestrator``);
a pool naming one this controller was not configured with is frozen, never guessed."""

from roost.controller.adapters.fake import FakeOrchestrator
from roost.controller.adapters.native import NativeOrchestrator, NativeSettings
from roost.controller.adapters.static import StaticOrchestrator

__all__ = ["FakeOrchestrator", "NativeOrchestrator", "NativeSettings", "StaticOrchestrator"]
