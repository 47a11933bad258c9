"""A client reaching a TLS server by IP checks its certificate against the host name given with
``--tls-server-name`` (``TlsFiles.server_name``), over gRPC and the data plane alike.

The certificate here names ``edge.test`` only (no IP), as a real server's would name its host:
dialled as 127.0.0.1 it is refused (the name does not match) unless the client says which
name to expect, and then both planes verify it against that name.
"""

from __future__ import annotations

import subprocess

import pytest
import torch
from typer.testing import CliRunner

from edgesplit.cli import app
from edgesplit.errors import ConfigError, RemoteError
from edgesplit.runtime.client import ChainClient
from edgesplit.transport import TlsFiles
from helpers import listening

HOST_NAME = "edge.test"


@pytest.fixture(scope="module")
def named_certificate(tmp_path_factory) -> tuple[TlsFiles, bytes]:
    """(server TlsFiles, the certificate to trust) for ``edge.test`` only."""
    folder = tmp_path_factory.mktemp("tls")
    key, cert = folder / "key.pem", folder / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                    str(key), "-out", str(cert), "-days", "1", "-subj", f"/CN={HOST_NAME}",
                    "-addext", f"subjectAltName=DNS:{HOST_NAME}"],
                   check=True, capture_output=True)
    return TlsFiles(cert=cert.read_bytes(), key=key.read_bytes()), cert.read_bytes()


@pytest.fixture(scope="module")
def server(digits_chain, named_certificate):
    with listening(digits_chain, "cloud", shape=False, tls=named_certificate[0]) as (server, _):
        assert server.data_port  # the data plane is offered, over the same TLS
        yield server.port


def _inputs() -> tuple[torch.Tensor, ...]:
    return (torch.randn(1, 1, 32, 32, generator=torch.Generator().manual_seed(0)),)


@pytest.mark.parametrize("plane", ["grpc", "tcp"])
def test_a_server_reached_by_ip_verifies_under_the_name_given(digits_chain, named_certificate,
                                                              server, plane):
    ca = named_certificate[1]
    with (ChainClient(digits_chain, f"127.0.0.1:{server}", shape=False, tls=TlsFiles(ca=ca),
                      timeout_s=5, data_plane=plane) as client,
          pytest.raises(RemoteError)):
        client.request(_inputs())  # 127.0.0.1 is not a name the certificate carries
    named = TlsFiles(ca=ca, server_name=HOST_NAME)
    with ChainClient(digits_chain, f"127.0.0.1:{server}", shape=False, tls=named,
                     timeout_s=30, data_plane=plane) as client:
        out = client.request(_inputs()).outputs[0]
    assert torch.allclose(out, digits_chain.unsplit(_inputs())[0], atol=1e-5)
    wrong = TlsFiles(ca=ca, server_name="other.test")
    with (ChainClient(digits_chain, f"127.0.0.1:{server}", shape=False, tls=wrong,
                      timeout_s=5, data_plane=plane) as client,
          pytest.raises(RemoteError)):
        client.request(_inputs())  # the name is checked, not skipped


def test_a_server_name_needs_the_ca_to_check_it_against():
    with pytest.raises(ConfigError, match=r"server_name.*ca"):
        TlsFiles(server_name=HOST_NAME)
    result = CliRunner().invoke(app, ["train-split", "--server", "127.0.0.1:1",
                                      "--tls-server-name", HOST_NAME])
    assert result.exit_code == 2
    assert "--tls-server-name" in result.output and "--tls-ca" in result.output
