"""Key pairs as EC2 makes and fingerprints them.

CreateKeyPair makes a real key (with `cryptography` when it is installed, else with
``ssh-keygen``); the private half is returned once and never stored. Fingerprints
follow EC2: a created RSA key is the SHA-1 of its PKCS#8 DER private key, an imported
RSA key the MD5 of its DER public key, and an ed25519 key the SHA-256 (base64) of its
OpenSSH public blob.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import struct
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from roost.domain.errors import InvalidKeyFormat


@dataclass(frozen=True, slots=True)
class MadeKey:
    private_key: str
    public_key: str  # OpenSSH one-line form
    fingerprint: str


def _colons(digest: bytes) -> str:
    return ":".join(f"{b:02x}" for b in digest)


def _ed25519_fingerprint(blob: bytes) -> str:
    return base64.b64encode(hashlib.sha256(blob).digest()).decode()


def new_key_pair(key_type: str) -> MadeKey:
    try:
        from cryptography.hazmat.primitives import serialization as ser
        from cryptography.hazmat.primitives.asymmetric import ed25519, rsa
    except ImportError:  # pragma: no cover - cryptography ships with most installs
        return _ssh_keygen(key_type)
    if key_type == "ed25519":
        ed = ed25519.Ed25519PrivateKey.generate()
        private = ed.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.OpenSSH,
                                   ser.NoEncryption()).decode()
        public = ed.public_key().public_bytes(ser.Encoding.OpenSSH,
                                              ser.PublicFormat.OpenSSH).decode()
        return MadeKey(private, public, _ed25519_fingerprint(_blob(public)))
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.TraditionalOpenSSL,
                                ser.NoEncryption()).decode()
    pkcs8 = key.private_bytes(ser.Encoding.DER, ser.PrivateFormat.PKCS8, ser.NoEncryption())
    public = key.public_key().public_bytes(ser.Encoding.OpenSSH,
                                           ser.PublicFormat.OpenSSH).decode()
    return MadeKey(private, public, _colons(hashlib.sha1(pkcs8).digest()))


def _ssh_keygen(key_type: str) -> MadeKey:  # pragma: no cover - the fallback
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "key"
        args = ["ssh-keygen", "-q", "-N", "", "-f", str(path), "-t", key_type]
        if key_type == "rsa":
            args += ["-b", "2048", "-m", "PEM"]
        subprocess.run(args, check=True, capture_output=True, timeout=30)
        private = path.read_text()
        public = " ".join(Path(f"{path}.pub").read_text().split()[:2])
    _, fingerprint = import_public_key(public)
    return MadeKey(private, public, fingerprint)


def _blob(public_key: str) -> bytes:
    parts = public_key.split()
    if len(parts) < 2:
        raise InvalidKeyFormat("Key is not in valid OpenSSH public key format")
    try:
        return base64.b64decode(parts[1], validate=True)
    except (binascii.Error, ValueError):
        raise InvalidKeyFormat("Key is not in valid OpenSSH public key format") from None


def _strings(blob: bytes) -> list[bytes]:
    out, i = [], 0
    while i < len(blob):
        if i + 4 > len(blob):
            raise InvalidKeyFormat("Key is not in valid OpenSSH public key format")
        (n,) = struct.unpack(">I", blob[i:i + 4])
        if i + 4 + n > len(blob):
            raise InvalidKeyFormat("Key is not in valid OpenSSH public key format")
        out.append(blob[i + 4:i + 4 + n])
        i += 4 + n
    return out


def _der_len(n: int) -> bytes:
    if n < 0x80:
        return bytes([n])
    raw = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([0x80 | len(raw)]) + raw


def _der(tag: int, body: bytes) -> bytes:
    return bytes([tag]) + _der_len(len(body)) + body


def _der_int(mpint: bytes) -> bytes:
    return _der(0x02, mpint if mpint[:1] < b"\x80" else b"\x00" + mpint)


_RSA_ALGORITHM = _der(0x30, _der(0x06, bytes.fromhex("2a864886f70d010101")) + b"\x05\x00")


def import_public_key(public_key: str) -> tuple[str, str]:
    """``(key type, EC2 fingerprint)`` of an OpenSSH public key line."""
    blob = _blob(public_key)
    fields = _strings(blob)
    kind = fields[0] if fields else b""
    if kind == b"ssh-ed25519" and len(fields) == 2 and len(fields[1]) == 32:
        return "ed25519", _ed25519_fingerprint(blob)
    if kind == b"ssh-rsa" and len(fields) == 3:
        e, n = fields[1], fields[2]
        rsa_key = _der(0x30, _der_int(n) + _der_int(e))
        spki = _der(0x30, _RSA_ALGORITHM + _der(0x03, b"\x00" + rsa_key))
        return "rsa", _colons(hashlib.md5(spki).digest())
    raise InvalidKeyFormat("Key is not in valid OpenSSH public key format")
