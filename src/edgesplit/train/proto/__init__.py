"""Generated gRPC code of the split-training protocol (``edgesplit_train.proto``)."""
