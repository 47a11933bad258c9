"""Executing a Plan across real processes: one partition per device, the wire format over gRPC,
link emulation, and the client that drives the chain."""

from edgesplit.runtime.program import DeviceStep, PlanProgram, dynamic_fake_quant, plan_id

__all__ = ["DeviceStep", "PlanProgram", "dynamic_fake_quant", "plan_id"]
