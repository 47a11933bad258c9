"""Network links: bandwidth (up and down may differ), round-trip time, loss."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat

__all__ = ["Link"]


class Link(BaseModel):
    """A link between two devices. ``up`` is from the device nearer the data source (edge) to
    the one further away (cloud); ``down`` the other way."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    bandwidth_mbps: PositiveFloat = Field(description="uplink bandwidth, megabits per second")
    down_bandwidth_mbps: PositiveFloat | None = Field(
        None, description="downlink bandwidth; None = same as the uplink")
    rtt_ms: Annotated[float, Field(ge=0)] = Field(0.0, description="round-trip time")
    loss: Annotated[float, Field(ge=0, lt=1)] = Field(
        0.0, description="packet loss rate; goodput is bandwidth x (1 - loss)")
    medium: Literal["wireless", "wired", "bus"] = "wireless"
    shared: bool = Field(False, description="a medium shared by every sender on it (a bus): "
                                            "concurrent senders split the bandwidth")
    description: str = ""
    source: str = ""

    def transfer_ms(self, nbytes: float, *, direction: Literal["up", "down"] = "up",
                    senders: int = 1) -> float:
        """Serialisation time of ``nbytes`` (no propagation delay: add ``rtt_ms`` once per
        request/response where the plan needs it). On a shared link ``senders`` split it."""
        mbps = self.bandwidth_mbps if direction == "up" else (
            self.down_bandwidth_mbps or self.bandwidth_mbps)
        share = senders if self.shared else 1
        return nbytes * 8 / (mbps * 1e3 * (1 - self.loss)) * share
