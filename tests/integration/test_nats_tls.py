"""NATS over TLS with users, as an operator configures it: `roost.bus.connect` with a
credentials file naming the CA reaches a nats-server that requires TLS and a password,
and uses a KV bucket through it; TLS without the password is refused. (nats-py's close
hangs after a failed TLS handshake, so a client without the CA is not tried here.)"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from nats.aio.client import Client as NATS
from nats.errors import Error as NatsError

from roost.bus.auth import ClusterAuth, NatsAuth
from roost.bus.connect import connect, key_value
from roost.embedded import NatsServer


def _certificates(tmp: Path) -> tuple[Path, Path, Path]:
    """A CA, and a server certificate for 127.0.0.1 that it signed (with its key)."""
    now = datetime.datetime.now(datetime.UTC)

    def made(subject: str, issuer: x509.Name | None, issuer_key: Any, key: Any,
             ca: bool) -> x509.Certificate:
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
        builder = (x509.CertificateBuilder().subject_name(name)
                   .issuer_name(issuer or name).public_key(key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(hours=1))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None),
                                  critical=True))
        if ca:
            builder = builder.add_extension(x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True,
                content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, encipher_only=False, decipher_only=False),
                critical=True)
        else:
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        return builder.sign(issuer_key, hashes.SHA256())

    ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(
        ec.SECP256R1())
    ca = made("roost test CA", None, ca_key, ca_key, ca=True)
    server = made("roost test nats", ca.subject, ca_key, server_key, ca=False)
    paths = tmp / "ca.pem", tmp / "server.pem", tmp / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(server_key.private_bytes(serialization.Encoding.PEM,
                                                  serialization.PrivateFormat.PKCS8,
                                                  serialization.NoEncryption()))
    return paths


async def test_nats_over_tls_with_a_password(tmp_path: Path) -> None:
    ca, cert, key = _certificates(tmp_path)
    auth = ClusterAuth.generate(["node-1"])
    conf = auth.write(tmp_path / "auth")
    tls = {"cert_file": str(cert), "key_file": str(key), "timeout": 2}
    conf.write_text(conf.read_text() + "tls " + json.dumps(tls) + "\n")
    with NatsServer(base_dir=tmp_path / "nats", config_file=conf) as server:
        gateway = auth.auth("gateway")
        creds = tmp_path / "gateway.json"
        NatsAuth(gateway.user, gateway.password, tls_ca=str(ca)).dump(creds)
        nc = await asyncio.wait_for(
            connect([server.url], name="tls-test", auth=NatsAuth.load(creds)), 10)
        try:
            kv = await key_value(nc, "roost_instances", attempts=5)
            await kv.put("i-1", b"over tls")
            assert (await kv.get("i-1")).value == b"over tls"
            assert nc.connected_url is not None
        finally:
            await nc.close()
        # TLS without a password: refused at connect, as without TLS.
        raw = NATS()
        with pytest.raises(NatsError, match="Authorization Violation"):
            await asyncio.wait_for(raw.connect(
                server.url, allow_reconnect=False, max_reconnect_attempts=0,
                connect_timeout=3, **NatsAuth(tls_ca=str(ca)).options()), 10)
        await raw.close()
