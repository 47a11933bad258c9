"""The data plane's frames over TCP: still one module, carved up next."""

from edgesplit.transport.frames.codec import (
    CALL,
    DEFERRED,
    FAILED,
    REPLY,
    Buffer,
    Frame,
    FrameClient,
    FrameContext,
    FrameServer,
    Handler,
    MetaCache,
    Part,
    Pieces,
    Unserved,
    encode_meta,
    failure,
    read_frame,
    write_frame,
)

__all__ = ["CALL", "DEFERRED", "FAILED", "REPLY", "Buffer", "Frame", "FrameClient",
           "FrameContext", "FrameServer", "Handler", "MetaCache", "Part", "Pieces", "Unserved",
           "encode_meta", "failure", "read_frame", "write_frame"]
