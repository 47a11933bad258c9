"""The data plane: length-prefixed frames over plain TCP (TLS when configured), for the bytes
gRPC's Python stack costs more to move than the socket does.

gRPC keeps the control plane (``Describe``, health, cross-language access); a server that
offers this data plane names its port there, and a client that finds one sends its calls
here. ``codec`` is the frame format and reading and writing one on a socket, ``server`` the
frame server (authentication before allocation, connection limits, answers now or later),
``client`` the pooled frame client, ``sockets`` what both ends do to a socket besides framing.
"""

from edgesplit.transport.frames.client import FrameClient
from edgesplit.transport.frames.codec import (
    CALL,
    FAILED,
    REPLY,
    Buffer,
    Frame,
    MetaCache,
    Part,
    Pieces,
    Unserved,
    encode_meta,
    failure,
    read_frame,
    write_frame,
)
from edgesplit.transport.frames.server import (
    DEFERRED,
    FrameContext,
    FrameServer,
    Handler,
)

__all__ = ["CALL", "DEFERRED", "FAILED", "REPLY", "Buffer", "Frame", "FrameClient",
           "FrameContext", "FrameServer", "Handler", "MetaCache", "Part", "Pieces", "Unserved",
           "encode_meta", "failure", "read_frame", "write_frame"]
